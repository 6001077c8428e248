"""The worker's Celery app and its one task, `specq.run_job(job_id)`.

The task is a thin shell around `WorkerRuntime.execute`: job state lives in the store, so the task
only turns a "retry" outcome into a Celery retry (a new message with a countdown) and acknowledges
everything else. Models are loaded by `specq.worker.main` before the worker consumes (solo pool) or
in each child right after the fork (prefork, `worker_process_init`).
"""

from __future__ import annotations

import logging

from celery import signals

from ..broker import make_celery
from ..settings import RUN_JOB_TASK, ServiceSettings
from .runtime import WorkerRuntime

log = logging.getLogger("specq.worker")

_runtime: WorkerRuntime | None = None
#: times a delivery is re-sent because the job store failed, before the task gives up (the job then
#: stays as the store last saw it, for the reconciler)
STORE_RETRIES = 20


def runtime() -> WorkerRuntime:
    global _runtime
    if _runtime is None:
        _runtime = WorkerRuntime(ServiceSettings.from_env())
    return _runtime


def set_runtime(rt: WorkerRuntime) -> None:
    global _runtime
    _runtime = rt


def create_worker_app(settings: ServiceSettings | None = None, *, queue: str | None = None):
    """The Celery app of a worker consuming `queue`, with `specq.run_job` registered."""
    settings = settings or ServiceSettings.from_env()
    app = make_celery(settings, queue=queue)
    hard_limit = settings.hard_time_limit  # the watcher fails the job at time_limit; this kills a stuck child

    @app.task(
        name=RUN_JOB_TASK,
        shared=False,  # this app only (a shared task would be added to every Celery app made later)
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        ignore_result=True,
        max_retries=None,
        time_limit=hard_limit,
    )
    def run_job(self, job_id: str) -> str:
        try:
            outcome = runtime().execute(job_id)
        except Exception as e:
            # the store failed (database down, connection lost): the job's state could not be
            # written, so send the job again later; on redelivery this worker may reclaim it
            delay = settings.backoff(self.request.retries + 1)
            ran = getattr(e, "specq_job_id", job_id)  # claims may have run another job than the message named
            log.warning("job %s: store error (%s: %s); re-sent in %.1fs", ran, type(e).__name__, e, delay)
            raise self.retry(args=[ran], countdown=delay, max_retries=STORE_RETRIES, exc=e)
        if outcome.status == "retry":
            raise self.retry(args=[outcome.job_id or job_id], countdown=outcome.retry_in, max_retries=None)
        return outcome.status

    return app


@signals.worker_process_init.connect
def _load_in_child(**_kwargs) -> None:
    """Prefork pool: each child loads its own models after the fork (never before: llama.cpp and GPU
    contexts do not survive fork)."""
    runtime().load()  # specq.storage.db keys its engines by pid: the child opens its own connections


__all__ = ["create_worker_app", "runtime", "set_runtime"]
