"""The service's log files: `specq up` copies what its API and its worker print, line by line, to
the terminal (or up.log with --detach) and to $SPECQ_HOME/logs/api.log and worker.log, which
`specq logs` reads. A helper of the command groups, as `common` and `output` are."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

#: the processes `specq up` runs, in the order `specq logs` shows them
SERVICES = ("api", "worker")
#: a log file over this size at `specq up` is moved to NAME.log.1 (one old file kept)
ROTATE_BYTES = 50 * 1024 * 1024


def log_dir() -> Path:
    from ..config import specq_home

    return specq_home() / "logs"


def log_path(name: str) -> Path:
    return log_dir() / f"{name}.log"


def open_log(name: str):
    """NAME.log opened for appending (the previous one moved aside when over ROTATE_BYTES)."""
    path = log_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size > ROTATE_BYTES:
        path.replace(path.with_name(path.name + ".1"))
    return open(path, "ab", buffering=0)


def tee(pipe, name: str) -> threading.Thread:
    """Copy each line of a child's output `pipe` to this process's stderr and to NAME.log, until it
    closes; the copying thread (started)."""
    out = open_log(name)
    err = getattr(sys.stderr, "buffer", None)

    def pump() -> None:
        try:
            for line in iter(pipe.readline, b""):
                out.write(line)
                if err is not None:
                    try:
                        err.write(line)
                        err.flush()
                    except (OSError, ValueError):  # our stderr went away: the file still gets it
                        pass
        finally:
            out.close()
            pipe.close()

    t = threading.Thread(target=pump, name=f"log-{name}", daemon=True)
    t.start()
    return t


__all__ = ["SERVICES", "log_dir", "log_path", "open_log", "tee"]
