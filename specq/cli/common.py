"""Helpers every command group uses: one-line failures, reading documents (a path or `-` for
stdin), service settings, the HTTP client and waiting for jobs and batches. How things are printed
(terminal-safe text, tables, JSON) is `output.py`. Command groups import these two modules, never
each other."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from .output import print_json, safe

#: the FILE argument that means standard input
STDIN = "-"
#: the name a document read from stdin gets (job input filename, batch custom_id, messages)
STDIN_NAME = "stdin"
#: `--chunk-rule` of run and submit (RunParams.chunk_rule; docs/quality.md measures each rule)
CHUNK_RULE_HELP = ("How chunks are ranked: border (the default: a chunk also scores the spans over its borders, so a line "
                   "the chunk grid cuts is kept whole), mean (its mean score), scope (border, and a line's header, the nearest "
                   "less-indented line above it, ranks nearly as high as the line: a raise keeps its def; better recall, worse "
                   "answers at 4K) or block (border, and every chunk of a function or indented block ranks nearly as high as "
                   "its best chunk; more code-review questions answered right at 4K than border, still below the pass bar).")


def fail(message: str) -> typer.Exit:
    """Print `error: message` as one terminal-safe line on stderr; return the typer.Exit(1) to raise
    (no traceback for users). `message` may hold anything a server or a file said."""
    typer.echo(f"error: {safe(message)}", err=True)
    return typer.Exit(1)


def is_stdin(path: Path | str | None) -> bool:
    return path is not None and str(path) == STDIN


def read_input(path: Path) -> tuple[str, bytes]:
    """(the name to give it, the bytes) of a FILE argument: a path, or `-` for all of stdin. InputError
    with a one-line reason for a missing file or a directory."""
    from ..contracts import InputError

    if is_stdin(path):
        return STDIN_NAME, sys.stdin.buffer.read()
    if not path.exists():
        raise InputError(f"file not found: {path}")
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a file")
    try:
        return shown_name(path.name), path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None


def shown_name(name: str) -> str:
    """A file name as it can be sent and stored: bytes of it that are not UTF-8 (lone surrogates in a
    Python str) become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def load_document(path: Path) -> tuple[str, bytes, str]:
    """(name, bytes, decoded text) of a document FILE (`-` = stdin), checked as the server checks it;
    InputError with a one-line reason."""
    from ..engine.inputs import decode_document

    name, data = read_input(path)
    return name, data, decode_document(data, name=STDIN_NAME if is_stdin(path) else str(path))


def read_document(path: Path) -> str:
    """A document FILE (`-` = stdin) as text, or an InputError with a one-line reason."""
    return load_document(path)[2]


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


#: the root option `specq --url URL` (cli/app.py): the API every command of this run talks to
API_URL: str | None = None


def set_api_url(url: str | None) -> None:
    global API_URL
    API_URL = url.strip() if url and url.strip() else None


def client():
    """A Client of the API: `--url`, else SPECQ_API_URL, else the URL `specq up` recorded, else the
    default (specq/client.py)."""
    from ..client import Client

    return Client(url=API_URL)


def api_call(fn):
    """Run fn(client); ApiError (also a bad --url, SPECQ_API_URL or SPECQ_API_KEY) -> one line on stderr, exit 1."""
    from ..client import ApiError

    try:
        with client() as c:
            return fn(c)
    except ApiError as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:  # Ctrl-C during a request: no traceback, the shell's status for SIGINT
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None


def _progress(counts: bool = True):
    """A transient progress bar on stderr; its descriptions are plain text (no markup). `counts`: with
    done/total and the elapsed time as columns (a job's description has them itself: cli/progress.py)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [MofNCompleteColumn(), TimeElapsedColumn()] if counts else []
    return Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), *columns,
                    console=Console(stderr=True), transient=True)


def wait_with_progress(client, job_id: str) -> dict:
    """Poll the job until it finishes, with a progress bar on stderr (the phase, done/total, its time and
    the time left: cli/progress.py); its last state."""
    from .progress import PhaseClock

    clock = PhaseClock()
    with _progress(counts=False) as bar:
        task = bar.add_task(safe(f"{job_id} queued"), total=None)

        def update(job: dict) -> None:
            p = job.get("progress") or {}
            total = p.get("total") or 0
            bar.update(task, description=safe(f"{job_id} {clock.job_text(job)}"), completed=p.get("done") or 0,
                       total=total if isinstance(total, int) and total > 1 else None)

        return client.wait(job_id, on_update=update)


def stream_answer(client, job_id: str) -> tuple[dict, bool]:
    """Follow the job's events: a progress line on stderr until the answer starts, then the answer on
    stdout as it is decoded. (The finished job, whether its whole text was printed.)"""
    import sys

    from rich.console import Console

    from .progress import PhaseClock

    err = Console(stderr=True)
    clock = PhaseClock()
    printed = ""
    status = err.status(f"{job_id} queued")
    status.start()
    try:
        for event, data in client.events(job_id):
            if event == "status":
                status.update(f"{job_id} {data['status']}")
            elif event in ("phase", "progress") and not printed:
                status.update(safe(f"{job_id} {clock.text(data.get('phase'), data.get('done', 0), data.get('total', 0))}"))
            elif event == "reset":
                sys.stdout.write("\n[the job was retried: its answer restarts]\n")
                printed = ""
            elif event == "delta":
                if not printed:
                    status.stop()
                sys.stdout.write(safe(data["text"], lines=True))  # model text: control characters shown inert
                sys.stdout.flush()
                printed += data["text"]
    finally:
        status.stop()
    job = client.job(job_id)
    whole = bool(printed) and job.get("status") == "succeeded" and (job.get("result") or {}).get("text") == printed
    if printed:
        sys.stdout.write("\n")
    return job, whole


def finish_job(job: dict, as_json: bool, printed: bool = False, with_id: bool = False) -> None:
    """Print a finished job's result (or fail with its error); `printed`: its text already was;
    `with_id`: the JSON result holds the job's id as `job_id` (`submit --wait --json`)."""
    if job["status"] == "succeeded":
        if as_json:
            print_json({"job_id": job["id"], **job["result"]} if with_id else job["result"])
        else:
            from .render import print_result

            print_result(job["result"], text=not printed)
        return
    if job["status"] == "failed":
        raise fail(f"job {job['id']} failed: {job.get('error') or 'no message'}")
    if job["status"] == "cancelled":
        raise fail(f"job {job['id']} was cancelled")
    from ..client import progress_text

    raise fail(f"job {job['id']} is {progress_text(job)}: no result yet (`specq result {job['id']} --wait` waits for it)")


def wait_batch_with_progress(client, batch: dict) -> dict:
    """Poll the batch until it is completed, failed, expired or cancelled, with a progress bar on stderr."""
    with _progress() as bar:
        task = bar.add_task(safe(f"{batch['id']} {batch['status']}"), total=batch["request_counts"]["total"] or None)

        def update(b: dict) -> None:
            c = b["request_counts"]
            failed = f", {c['failed']} failed" if c["failed"] else ""
            bar.update(task, description=safe(f"{b['id']} {b['status']}{failed}"), completed=c["completed"] + c["failed"],
                       total=c["total"] or None)

        return client.wait_batch(batch["id"], on_update=update)

