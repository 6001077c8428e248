"""`specq logs [api|worker] [-f]`: the log of the service `specq up` runs ($SPECQ_HOME/logs)."""

from __future__ import annotations

import time
from typing import Optional

import typer

from .app import app
from .common import fail
from .logfiles import SERVICES, log_dir, log_path
from .output import safe

#: seconds between looks at the files with --follow
FOLLOW_POLL_S = 0.3


def _tail(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def _show(chunk: bytes, prefix: str) -> None:
    """Whole lines of a log as text, each made terminal-safe (a log may quote user input)."""
    for line in chunk.decode("utf-8", "replace").splitlines():
        typer.echo(prefix + safe(line))


@app.command("logs")
def logs_cmd(
    service: Optional[str] = typer.Argument(None, help="api or worker (default both, each line prefixed with its name)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines as they are written (Ctrl-C stops)."),
    lines: int = typer.Option(50, "--lines", "-n", help="How many of the last lines to print first."),
) -> None:
    """The log of the API and the worker that `specq up` runs ($SPECQ_HOME/logs/api.log, worker.log).

    The API's log has one line per request (method, path, status). A service run otherwise
    (`specq api` and `specq worker` by hand, docker compose) logs where it runs: `docker compose logs`.
    """
    if service is not None and service not in SERVICES:
        raise fail(f"no service {service!r}: give api or worker (or nothing for both)")
    names = [service] if service else list(SERVICES)
    paths = {n: log_path(n) for n in names}
    if not any(p.exists() for p in paths.values()):
        raise fail(f"no log in {log_dir()}: `specq up` writes them (SPECQ_HOME={log_dir().parent})")
    prefix = {n: (f"{n:<6}| " if len(names) > 1 else "") for n in names}
    offsets: dict[str, int] = {}
    partial: dict[str, bytes] = {n: b"" for n in names}
    for n, p in paths.items():
        data = p.read_bytes() if p.exists() else b""
        offsets[n] = len(data)
        _show(_tail(data, lines), prefix[n])
    if not follow:
        return
    try:
        while True:
            for n, p in paths.items():
                try:
                    size = p.stat().st_size
                except FileNotFoundError:
                    continue
                if size < offsets[n]:  # moved aside by a new `specq up`: start the new file
                    offsets[n], partial[n] = 0, b""
                if size == offsets[n]:
                    continue
                with open(p, "rb") as f:
                    f.seek(offsets[n])
                    data = partial[n] + f.read()
                    offsets[n] = f.tell()
                whole, _, rest = data.rpartition(b"\n")
                partial[n] = rest
                if whole or data.endswith(b"\n"):
                    _show(whole + b"\n", prefix[n])
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
