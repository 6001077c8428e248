"""`specq status | result | jobs | cancel`: jobs over HTTP."""

from __future__ import annotations

import typer

from .app import app
from .common import api_call, finish_job


def _print_job(job: dict) -> None:
    from ..client import progress_text

    lines = [f"{job['id']}  {job['status']}"]
    if job["status"] == "running":
        lines.append(f"  progress   {progress_text(job)}")
    lines.append(f"  attempts   {job.get('attempts')}/{job.get('max_attempts')}")
    for key in ("created_at", "started_at", "finished_at"):
        if job.get(key):
            lines.append(f"  {key[:-3]:<10} {job[key]}")
    if job.get("queue_wait_ms") is not None:
        lines.append(f"  queue wait {job['queue_wait_ms']:.0f} ms")
    inp = job.get("input") or {}
    if inp:
        lines.append(f"  input      {inp.get('filename') or '-'} ({inp.get('size_bytes')} bytes)")
    if job.get("error"):
        lines.append(f"  error      {job['error']}")
    result = job.get("result")
    if result:
        total = (result.get("timings_ms") or {}).get("total")
        lines.append(f"  result     {len(result.get('text', ''))} chars, {total:,.0f} ms total (`specq result {job['id']}`)")
    typer.echo("\n".join(lines))




@app.command("status")
def status_cmd(
    job_id: str = typer.Argument(..., help="A job id (job_…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the job object as JSON."),
) -> None:
    """A job's status, progress, attempts and error."""
    import json

    job = api_call(lambda c: c.job(job_id))
    if as_json:
        typer.echo(json.dumps(job, indent=2))
    else:
        _print_job(job)


@app.command("result")
def result_cmd(
    job_id: str = typer.Argument(..., help="A job id (job_…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run result object as JSON."),
) -> None:
    """A finished job's answer and phase table (exit 1 if it failed, was cancelled or is not done)."""
    job = api_call(lambda c: c.job(job_id))
    finish_job(job, as_json)


@app.command("jobs")
def jobs_cmd(
    status: str = typer.Option(None, help="Only these statuses (comma-separated): queued, running, succeeded, failed, cancelled."),
    limit: int = typer.Option(20, help="How many, newest first."),
) -> None:
    """Recent jobs with their status and progress."""
    from rich.console import Console
    from rich.table import Table

    from ..client import progress_text

    page = api_call(lambda c: c.jobs(status=status, limit=limit))
    table = Table(box=None, pad_edge=False)
    for col in ("id", "kind", "status", "progress", "created (UTC)", "queue wait"):
        table.add_column(col, no_wrap=True)
    table.add_column("error", overflow="fold")
    for j in page["data"]:
        wait = f"{j['queue_wait_ms']:.0f} ms" if j.get("queue_wait_ms") is not None else "-"
        created = (j.get("created_at") or "").replace("T", " ")[:19]
        table.add_row(j["id"], j.get("kind") or "job", j["status"], progress_text(j) if j["status"] == "running" else "", created,
                      wait, (j.get("error") or "")[:120])
    Console().print(table)
    typer.echo(f"{len(page['data'])} of {page['total']} jobs", err=True)


@app.command("cancel")
def cancel_cmd(job_id: str = typer.Argument(..., help="A job id (job_…).")) -> None:
    """Cancel a queued job now, or a running job at its next phase, window or token."""
    job = api_call(lambda c: c.cancel(job_id))
    state = "cancelled" if job["status"] == "cancelled" else "cancel requested (it stops at its next step)"
    typer.echo(f"{job_id}: {state}")

