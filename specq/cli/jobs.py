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


def _short(text: str, n: int) -> str:
    """`text` cut to `n` characters, "…" last where it was cut (a terminal row stays a few lines high)."""
    return text if len(text) <= n else text[: n - 1] + "…"


def _note(job: dict) -> str:
    """The jobs table's last column: a failed or cancelled job's error, else why it ran so (or an
    earlier attempt's error)."""
    error, reason = job.get("error") or "", (job.get("ran") or {}).get("reason") or ""
    return error if job["status"] in ("failed", "cancelled") and error else reason or error


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
    """Recent jobs: status, progress, what ran, file, question and batch.

    `ran` is the mode that ran (auto resolved; `+cache`: the target's prompt cache held part of the
    prompt); the last column says why it ran so, or a failed job's error (first 100 characters).
    `question` is its first 60 characters, `batch` the batch's name (or id). Free text folds so the
    table fits 160 columns (a 1,280 px terminal); queue wait is in `specq status`.

    Piped (stdout not a terminal): one tab-separated line per job, no header, ids whole:
    id, kind, status, progress, ran, created (UTC), queue wait, error, why it ran so, file,
    question, batch name, batch id.
    """
    from ..client import progress_text

    page = api_call(lambda c: c.jobs(status=status, limit=limit))
    if as_json:
        print_json(page)
        return
    jobs = page["data"]
    prog = {j["id"]: progress_text(j) if j["status"] == "running" else "" for j in jobs}
    created = {j["id"]: (j.get("created_at") or "").replace("T", " ")[:19] for j in jobs}
    if not stdout_is_terminal():  # a pipe gets every field whole
        print_table([], [(j["id"], j.get("kind") or "job", j["status"], prog[j["id"]], _ran(j.get("ran")), created[j["id"]],
                          _ms(j.get("queue_wait_ms")), j.get("error") or "", (j.get("ran") or {}).get("reason") or "",
                          j.get("filename") or "", j.get("question") or "", j.get("batch_name") or "",
                          j.get("batch_id") or "") for j in jobs], terminal=False)
    else:
        rows = [(j["id"], j.get("kind") or "job", j["status"], prog[j["id"]], _ran(j.get("ran")), j.get("filename") or "",
                 _short(j.get("question") or "", 60), j.get("batch_name") or j.get("batch_id") or "", created[j["id"]],
                 _short(_note(j), 100)) for j in jobs]
        fold = lambda name: Column(name, fold=True)  # noqa: E731
        print_table(["id", "kind", "status", fold("progress"), "ran", fold("file"), fold("question"), fold("batch"),
                     "created (UTC)", fold("why / error")], rows, terminal=True)
    typer.echo(f"{len(jobs)} of {page['total']} jobs", err=True)


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
