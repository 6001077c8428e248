"""What keeps a worker from loading its models, said where operators look: its heartbeat.

A worker whose model files were missing said nothing until they were loaded: it downloaded them for
minutes (or died, where the download failed) while `/readyz` showed only `workers_ready: 0`. In a
Compose deployment the usual cause is a models volume that is not mounted, or not filled by the
`models` one-shot. Now the worker checks the files first; when one is not there and verified, it writes
a not-ready heartbeat naming the file, its path and what to do (`/readyz` lists it under
`workers_not_ready`, `/v1/workers` as `not_ready`), then either pulls (SPECQ_PULL_MODELS on, the
default) or waits, checking again every few seconds, and loads once the files are there (off:
compose.yaml, where the `models` one-shot pulls into the volume).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ..config import specq_home
from ..engine.models import ModelError, get_spec, model_status
from ..settings import ServiceSettings

log = logging.getLogger("specq.worker")

#: seconds between checks of the model files while a worker waits for them
RECHECK_S = 5.0


def model_problems(models: dict[str, str], *, pulling: bool) -> list[str]:
    """One sentence per model in `models` ({role: registry name, registry file name or path}) that is
    not there ready to load: a registry model not pulled and verified, or a path that is no file."""
    out = []
    for role, name in models.items():
        if not name:
            continue
        try:
            spec = get_spec(name)
        except ModelError:  # a path, not a registry model
            path = Path(name).expanduser()
            if not path.is_file():
                out.append(f"{role} model file not found: {path}")
            continue
        st = model_status(spec)
        if st.state == "verified":
            continue
        what = "it is being pulled now" if pulling else (
            "this worker does not pull (SPECQ_PULL_MODELS=0): mount the models volume at "
            f"{specq_home()} or run `specq models pull`")
        out.append(f"{role} model {spec.name} is {st.state}: {st.path} (SPECQ_HOME={specq_home()}); {what}")
    return out


class NotReadyBeat:
    """A not-ready heartbeat with the reasons, written until `stop()` (then the worker's own beat,
    under the same name, takes over)."""

    def __init__(self, settings: ServiceSettings, queue: str) -> None:
        from ..monitor import Heartbeat

        self.reasons: list[str] = []
        self._lock = threading.Lock()
        started = time.time()

        def state() -> dict[str, Any]:
            with self._lock:
                reasons = list(self.reasons)
            return {"name": f"{socket.gethostname()}:{os.getpid()}", "host": socket.gethostname(),
                    "pid": os.getpid(), "queue": queue, "gpu": settings.gpu, "started_at": started,
                    "ready": False, "not_ready": "; ".join(reasons), "busy": 0, "current_jobs": []}

        self._beat = Heartbeat(settings, state)

    def show(self, reasons: list[str]) -> None:
        with self._lock:
            changed = reasons != self.reasons
            self.reasons = list(reasons)
        if not self._beat.is_alive():
            self._beat.start()
        elif changed:
            self._beat.beat()

    def stop(self) -> None:
        if self._beat.is_alive():
            self._beat.stop()


def wait_for_models(settings: ServiceSettings, models: dict[str, str], queue: str,
                    recheck_s: float = RECHECK_S) -> NotReadyBeat | None:
    """Return once the models can be loaded. While one is missing: with the pull on, return at once
    with a not-ready heartbeat saying what is pulled (the caller stops it when loaded); off, say why
    and check again every `recheck_s` seconds until the files are there."""
    problems = model_problems(models, pulling=settings.pull_models)
    if not problems:
        return None
    beat = NotReadyBeat(settings, queue)
    beat.show(problems)
    for p in problems:
        log.error("specq worker not ready: %s", p)
    if settings.pull_models:
        return beat
    while problems:
        time.sleep(recheck_s)
        now = model_problems(models, pulling=False)
        if now and now != problems:
            for p in now:
                log.error("specq worker not ready: %s", p)
            beat.show(now)
        problems = now
    log.warning("specq worker: the model files are there now; loading them")
    return beat


__all__ = ["NotReadyBeat", "RECHECK_S", "model_problems", "wait_for_models"]
