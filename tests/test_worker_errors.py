"""How the worker treats errors a retry cannot cure: the real engine (tiny models) behind a fault
injector, a real SQLite job store, `WorkerRuntime.execute` as the Celery task calls it.

* an error that the same job raises again (OverflowError, ValueError, …) fails the job at once, with
  its message, instead of using up its attempts;
* an out-of-memory is retried once, then the job fails with a message saying so;
* an out-of-memory followed by a good attempt succeeds (the retry is real).
"""

from __future__ import annotations

import pytest

from specq.engine.options import EngineOptions
from specq.settings import ServiceSettings
from specq.storage import db, jobs


@pytest.fixture(scope="module")
def engine(tiny_models):
    from specq.engine.pipeline import Engine

    e = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                             n_ctx=512, n_threads=2))
    yield e
    e.close()


class FaultyEngine:
    """The real engine; its first `len(errors)` runs raise errors[i] instead."""

    def __init__(self, engine, errors) -> None:
        self.engine, self.errors, self.calls = engine, list(errors), 0
        self.info, self.n_ctx = engine.info, engine.n_ctx

    def __getattr__(self, name):
        """Everything else (set_evidence, which the worker calls at start and per claim, ...) is the real engine's."""
        return getattr(self.engine, name)

    def run(self, document, params, progress=None, **kw):
        self.calls += 1
        if self.calls <= len(self.errors):
            raise self.errors[self.calls - 1]
        return self.engine.run(document, params, progress=progress, **kw)


def _runtime(tmp_path, engine):
    from specq.worker.runtime import WorkerRuntime

    settings = ServiceSettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}", queue="t",
                               progress_interval=0.05, stale_after=5.0, retry_backoff=0.1, warm_up=False,
                               reconcile_interval=0)
    settings.validate()
    return WorkerRuntime(settings, engine=engine)


def _job(max_attempts: int = 3) -> str:
    with db.session() as s:
        return jobs.create_job(s, text="def f():\n    return 1\n", params={"question": "what?", "max_tokens": 2},
                               max_attempts=max_attempts).id


def _get(job_id):
    with db.session() as s:
        return jobs.get_job(s, job_id)


@pytest.mark.parametrize("error", [OverflowError("int too large to convert to C long"), ValueError("bad shape"),
                                   IndexError("list index out of range")], ids=lambda e: type(e).__name__)
def test_deterministic_errors_fail_at_once(engine, store, tmp_path, error):
    rt = _runtime(tmp_path, FaultyEngine(engine, [error] * 3))
    job_id = _job()
    out = rt.execute(job_id)
    job = _get(job_id)
    assert out.status == "failed" and job.status == "failed" and job.attempts == 1
    assert job.error == f"internal error: {type(error).__name__}: {error}"


def test_out_of_memory_is_retried_once_then_failed(engine, store, tmp_path):
    rt = _runtime(tmp_path, FaultyEngine(engine, [MemoryError(), MemoryError(), MemoryError()]))
    job_id = _job(max_attempts=5)
    first = rt.execute(job_id)
    assert first.status == "retry" and _get(job_id).status == "queued"
    assert _get(job_id).error == "out of memory: MemoryError"
    second = rt.execute(job_id)  # what the broker's retry delivers
    job = _get(job_id)
    assert second.status == "failed" and job.status == "failed" and job.attempts == 2  # not 5
    assert job.error.startswith("out of memory: MemoryError (twice): the job needs more memory than this worker has")


def test_out_of_memory_then_a_good_attempt_succeeds(engine, store, tmp_path):
    rt = _runtime(tmp_path, FaultyEngine(engine, [RuntimeError("CUDA error: out of memory")]))
    job_id = _job()
    assert rt.execute(job_id).status == "retry"
    assert rt.execute(job_id).status == "succeeded"
    job = _get(job_id)
    assert job.status == "succeeded" and job.attempts == 2 and job.error is None
