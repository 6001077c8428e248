"""`specq status | result | jobs | cancel`: jobs over HTTP."""

from __future__ import annotations

import typer

from .app import app
from .common import api_call, fail, finish_job, wait_with_progress
from .output import Column, num, print_json, print_table, safe, stdout_is_terminal, when


def _ms(value) -> str:
    return num(value, ",.0f", " ms")


def _ran(ran: dict | None) -> str:
    """The mode a succeeded job ran (`mode` in its params is the one asked for), `+cache` after a
    prompt-cache hit; "" before it ran."""
    ran = ran or {}
    return f"{ran.get('mode')}{' +cache' if ran.get('cache_hit') else ''}" if ran.get("mode") else ""


def _print_job(job: dict) -> None:
    from ..client import progress_text

    lines = [f"{job['id']}  {job['status']}"]
    if job["status"] == "running":
        lines.append(f"  progress   {progress_text(job)}")
    lines.append(f"  attempts   {job.get('attempts')}/{job.get('max_attempts')}")
    for key in ("created_at", "started_at", "finished_at"):
        if job.get(key):
            lines.append(f"  {key[:-3]:<10} {when(job[key])}")
    if job.get("queue_wait_ms") is not None:
        lines.append(f"  queue wait {_ms(job['queue_wait_ms'])}")
    inp = job.get("input") or {}
    if inp:
        lines.append(f"  input      {inp.get('filename') or '-'} ({inp.get('size_bytes')} bytes)")
    if job.get("error"):
        lines.append(f"  error      {job['error']}")
    ran = job.get("ran") or {}
    if ran.get("mode"):
        lines.append(f"  ran        {_ran(ran)}" + (f": {ran['reason']}" if ran.get("reason") else ""))
    result = job.get("result")
    if result:
        total = (result.get("timings_ms") or {}).get("total")
        lines.append(f"  result     {len(result.get('text') or '')} chars, {_ms(total)} total (`specq result {job['id']}`)")
    typer.echo("\n".join(safe(line) for line in lines))  # every value may come from a user or a file


@app.command("status")
def status_cmd(
    job_id: str = typer.Argument(..., help="A job id (job_…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the job object as JSON."),
) -> None:
    """A job's status, progress, attempts and error."""
    job = api_call(lambda c: c.job(job_id))
    if as_json:
        print_json(job)
    else:
        _print_job(job)


@app.command("result")
def result_cmd(
    job_id: str = typer.Argument(..., help="A job id (job_…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run result object as JSON."),
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait until the job finishes (progress on stderr)."),
) -> None:
    """A finished job's answer and phase table (exit 1 if it failed, was cancelled or is not done)."""

    def go(c):
        if not wait:
            return c.job(job_id)
        try:
            return wait_with_progress(c, job_id)
        except KeyboardInterrupt:
            raise fail(f"stopped waiting; job {job_id} keeps running (`specq status {job_id}`)") from None

    finish_job(api_call(go), as_json)


@app.command("jobs")
def jobs_cmd(
    status: str = typer.Option(None, help="Only these statuses (comma-separated): queued, running, succeeded, failed, cancelled."),
    limit: int = typer.Option(20, help="How many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print the API's list object as JSON (what GET /v1/jobs answers)."),
) -> None:
    """Recent jobs with their status and progress.

    `ran` is the mode that ran (auto resolved; `+cache`: the target's prompt cache held part of the
    prompt) and, in the last column, why.

    Piped (stdout not a terminal): one tab-separated line per job, no header, ids whole:
    id, kind, status, progress, ran, created (UTC), queue wait, error, why it ran so.
    """
    from ..client import progress_text

    page = api_call(lambda c: c.jobs(status=status, limit=limit))
    if as_json:
        print_json(page)
        return
    cut = 120 if stdout_is_terminal() else None  # a pipe gets the whole message
    rows = [(j["id"], j.get("kind") or "job", j["status"], progress_text(j) if j["status"] == "running" else "",
             _ran(j.get("ran")), (j.get("created_at") or "").replace("T", " ")[:19], _ms(j.get("queue_wait_ms")),
             (j.get("error") or "")[:cut], ((j.get("ran") or {}).get("reason") or "")[:cut])
            for j in page["data"]]
    print_table(["id", "kind", "status", "progress", "ran", "created (UTC)", "queue wait", Column("error", fold=True),
                 Column("why", fold=True)], rows)
    typer.echo(f"{len(page['data'])} of {page['total']} jobs", err=True)


@app.command("cancel")
def cancel_cmd(
    job_id: str = typer.Argument(..., help="A job id (job_…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the job object as JSON (what POST /v1/jobs/{id}/cancel answers)."),
) -> None:
    """Cancel a queued job now, or a running job at its next phase, window or token."""
    job = api_call(lambda c: c.cancel(job_id))
    if as_json:
        print_json(job)
        return
    state = "cancelled" if job["status"] == "cancelled" else "cancel requested (it stops at its next step)"
    typer.echo(safe(f"{job['id']}: {state}"))
