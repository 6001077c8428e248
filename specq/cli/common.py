"""Helpers every command group uses: one-line failures, reading documents, service settings, the HTTP
client and waiting for jobs and batches. Command groups import this module, never each other."""

from __future__ import annotations

from pathlib import Path

import typer


def fail(message: str) -> typer.Exit:
    """Print one line to stderr; return the typer.Exit(1) to raise (no traceback for users)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def read_document(path: Path) -> str:
    """A document file as text, or an InputError with a one-line reason."""
    from ..contracts import InputError
    from ..engine.inputs import decode_document

    if not path.exists():
        raise InputError(f"file not found: {path}")
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a file")
    return decode_document(path.read_bytes(), name=str(path))


def with_models(opts, *, target: str | None = None, speculator: str | None = None, drafter: str | None = None):
    """EngineOptions `opts` with the model options given on the command line (None/"" = keep)."""
    for name, value in (("target", target), ("speculator", speculator), ("drafter", drafter)):
        if value:
            setattr(opts, name, value)
    return opts


def service_settings(**overrides):
    from ..settings import ServiceSettings, SettingsError

    try:
        return ServiceSettings.from_env(**overrides)
    except SettingsError as e:
        raise fail(str(e)) from None


def service_ready_db(upgrade: bool) -> None:
    """Migrate (`upgrade`) or check the job store's schema; one-line errors."""
    from ..storage import db
    from ..storage.ready import SchemaNotReady, ensure_schema

    try:
        if upgrade:
            db.upgrade()
        else:
            ensure_schema()
    except SchemaNotReady as e:
        raise fail(str(e)) from None
    except Exception as e:  # unreachable server, bad URL
        raise fail(f"database {db.masked_url()}: {str(e).splitlines()[0]}") from None


def client():
    from ..client import Client

    return Client()


def api_call(fn):
    """Run fn(client); ApiError -> one line on stderr, exit 1."""
    from ..client import ApiError

    try:
        with client() as c:
            return fn(c)
    except ApiError as e:
        raise fail(str(e)) from None



def wait_with_progress(client, job_id: str) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..client import progress_text

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"{job_id} queued", total=None)

        def update(job: dict) -> None:
            p = job.get("progress") or {}
            total = p.get("total") or 0
            bar.update(task, description=f"{job_id} {progress_text(job)}", completed=p.get("done") or 0,
                       total=total if total > 1 else None)

        return client.wait(job_id, on_update=update)


def finish_job(job: dict, as_json: bool) -> None:
    """Print a finished job's result (or fail with its error)."""
    import json

    if job["status"] == "succeeded":
        if as_json:
            typer.echo(json.dumps(job["result"], indent=2))
        else:
            from ..render import print_result

            print_result(job["result"])
        return
    if job["status"] == "failed":
        raise fail(f"job {job['id']} failed: {job.get('error') or 'no message'}")
    if job["status"] == "cancelled":
        raise fail(f"job {job['id']} was cancelled")
    from ..client import progress_text

    raise fail(f"job {job['id']} is {progress_text(job)}: no result yet (wait with `specq status {job['id']}`)")



def submit_batch(files: list, jsonl, question, params: dict, name, wait: bool) -> None:
    """`specq submit` with several files, --jsonl or --batch: one batch; prints its id."""
    from ..contracts import InputError

    if jsonl is not None and files:
        raise fail("give either FILEs or --jsonl FILE, not both")
    if jsonl is None and not files:
        raise fail("give the FILEs of the batch, or --jsonl FILE")
    try:  # the server's checks, before uploading
        if jsonl is not None and not jsonl.is_file():
            raise InputError(f"file not found: {jsonl}" if not jsonl.exists() else f"{jsonl} is not a file")
        for f in files:
            read_document(f)
    except InputError as e:
        raise fail(str(e)) from None
    metadata = {"name": name} if name else None

    def go(c):
        if jsonl is not None:
            batch = c.submit_batch_jsonl(jsonl, params=params, question=question, metadata=metadata)
        else:
            batch = c.submit_batch_files(files, question=question, params=params, metadata=metadata)
        if batch["status"] == "failed":
            batch_fail(batch)
        typer.echo(batch["id"])
        total = batch["request_counts"]["total"]
        if not wait:
            typer.echo(f"{total} requests queued: `specq batches`, `specq results {batch['id']}`", err=True)
            return
        try:
            done = wait_batch_with_progress(c, batch)
        except KeyboardInterrupt:
            raise fail(f"stopped waiting; batch {batch['id']} keeps running (`specq batches`)") from None
        counts = done["request_counts"]
        typer.echo(f"batch {done['id']} {done['status']}: {counts['completed']}/{counts['total']} completed, "
                   f"{counts['failed']} failed; `specq results {done['id']} --format csv`", err=True)
        if done["status"] != "completed" or counts["failed"]:
            raise typer.Exit(1)

    api_call(go)


def batch_fail(batch: dict) -> None:
    errors = (batch.get("errors") or {}).get("data") or []
    for e in errors[:20]:
        typer.echo(f"error: {e.get('message')}", err=True)
    if len(errors) > 20:
        typer.echo(f"error: … and {len(errors) - 20} more", err=True)
    raise fail(f"batch {batch['id']} failed validation: nothing was queued")


def wait_batch_with_progress(client, batch: dict) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"{batch['id']} {batch['status']}", total=batch["request_counts"]["total"] or None)

        def update(b: dict) -> None:
            c = b["request_counts"]
            failed = f", {c['failed']} failed" if c["failed"] else ""
            bar.update(task, description=f"{b['id']} {b['status']}{failed}", completed=c["completed"] + c["failed"],
                       total=c["total"] or None)

        return client.wait_batch(batch["id"], on_update=update)

