"""`specq worker`: pin the GPU, load the models once, then consume jobs.

Order matters: CUDA_VISIBLE_DEVICES is set before anything imports llama.cpp; the models are loaded
(and warmed up) before the worker takes its first message, so a job never waits on a model load.
With one serving slot the Celery solo pool runs jobs in this very process; with SPECQ_SLOTS > 1 (the
default on a GPU: 8) the threads pool runs that many tasks at once, each submitting its job to the
one engine loop (specq.engine.serving.loop). SPECQ_CONCURRENCY > 1 is the older alternative: a prefork
pool whose children each load their own copy of the models after the fork (one slot each).
SIGTERM drains (WorkerRuntime.drain) before Celery's warm shutdown ends.
"""

from __future__ import annotations

import logging
import os
import sys

from ..settings import ServiceSettings

log = logging.getLogger("specq.worker")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_worker(settings: ServiceSettings, *, queue: str | None = None, loglevel: str = "INFO", seams=None,
               select_override=None) -> None:
    """Start a worker in the foreground (returns when it is stopped). `seams`: the engine loop's test
    seams (engine/serving/seams.py), from a test's launcher (tests/seamed_worker.py); `select_override`:
    the engine's (benchmarks only: `specq bench worker`). Both None in production."""
    setup_logging(loglevel)
    visible = settings.visible_devices()  # --gpu N (and --speculator-gpu M: "N,M")
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    from ..engine.llama import binding as llama  # noqa: F401  llama.cpp before numpy, after CUDA_VISIBLE_DEVICES

    from ..storage.ready import ensure_schema
    from .app import create_worker_app, set_runtime
    from .runtime import WorkerRuntime

    ensure_schema()
    queue = queue or settings.queue
    app = create_worker_app(settings, queue=queue)
    from celery import signals

    from ..engine.llama.binding import backend_name

    rt = WorkerRuntime(settings, seams=seams, select_override=select_override)
    rt.queue = queue
    set_runtime(rt)
    prefork = settings.concurrency > 1
    slots = settings.resolved_slots(backend_name())
    if not prefork:
        rt.load()
        signals.worker_shutting_down.connect(lambda **_kw: rt.drain(), weak=False)
    pool = "prefork" if prefork else ("threads" if slots > 1 else "solo")
    concurrency = settings.concurrency if prefork else slots
    broker = settings.resolved_broker_url if settings.embedded_broker else _mask(settings.resolved_broker_url)
    log.warning("specq worker consuming queue %r on %s (%s)", queue, broker,
                f"prefork x{concurrency}" if prefork else f"{pool} pool, {slots} slot{'s' if slots > 1 else ''}")
    argv = [
        "worker",
        f"--loglevel={loglevel}",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        f"--queues={queue}",
        f"--hostname=specq-{queue}-{os.getpid()}@%h",
        "--without-mingle",
        "--without-gossip",
    ]
    if settings.embedded_broker:
        argv.append("--without-heartbeat")
    app.worker_main(argv)


def _mask(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


__all__ = ["run_worker", "setup_logging"]
