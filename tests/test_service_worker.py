"""The worker's job handling with the real engine (tiny models) and a real SQLite job store:
redelivery does nothing, the time limit fails a job, transient errors are retried through a real
Celery worker (embedded broker) with backoff until they succeed or use up their attempts; and the
service settings' checks."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from specq.engine.options import EngineOptions
from specq.settings import ServiceSettings, SettingsError
from specq.storage import db, jobs
from specq.storage.models import PhaseTiming, Result

DOC = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def engine(tiny_models):
    from specq.engine.pipeline import Engine

    e = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                             n_ctx=512, n_threads=2))
    yield e
    e.close()


def _settings(tmp_path, **kw) -> ServiceSettings:
    base = dict(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}", queue="t", progress_interval=0.05,
                stale_after=5.0, retry_backoff=0.1, retry_backoff_max=0.5, warm_up=False)
    base.update(kw)
    s = ServiceSettings(**base)
    s.validate()
    return s


def _new_job(max_tokens: int = 4, max_attempts: int = 3) -> str:
    with db.session() as s:
        return jobs.create_job(s, text=DOC, params={"question": "what?", "max_tokens": max_tokens, "seed": 1},
                               max_attempts=max_attempts).id


def _rows(job_id: str) -> tuple[int, int]:
    with db.session() as s:
        return (s.scalar(select(func.count()).select_from(Result).where(Result.job_id == job_id)),
                s.scalar(select(func.count()).select_from(PhaseTiming).where(PhaseTiming.job_id == job_id)))


class FlakyEngine:
    """The real engine behind a fault injector: the first `fails` runs raise a transient error."""

    def __init__(self, engine, fails: int) -> None:
        self.engine, self.fails, self.calls = engine, fails, 0
        self.info, self.n_ctx = engine.info, engine.n_ctx

    def __getattr__(self, name):
        """Everything else (set_evidence, which the worker calls at start and per claim, ...) is the real engine's."""
        return getattr(self.engine, name)

    def run(self, document, params, progress=None, **kw):
        self.calls += 1
        if self.calls <= self.fails:
            raise ConnectionError("connection reset by peer")
        return self.engine.run(document, params, progress=progress, **kw)


def test_redelivered_job_does_nothing(engine, store, tmp_path):
    from specq.worker.runtime import WorkerRuntime

    rt = WorkerRuntime(_settings(tmp_path), engine=engine)
    job_id = _new_job()
    assert rt.execute(job_id).status == "succeeded"
    with db.session() as s:
        first = jobs.get_job(s, job_id)
    again = rt.execute(job_id)  # the broker delivers the same message again
    assert again.status == "skipped" and again.message == "succeeded"
    with db.session() as s:
        job = jobs.get_job(s, job_id)
    assert job.attempts == 1 and job.finished_at == first.finished_at
    n_results, n_timings = _rows(job_id)
    assert n_results == 1 and n_timings >= 5
    assert rt.execute("job_missing").status == "skipped"


def test_time_limit_fails_the_job(engine, store, tmp_path):
    from specq.worker.runtime import WorkerRuntime

    rt = WorkerRuntime(_settings(tmp_path, time_limit=0.01), engine=engine)
    job_id = _new_job(max_tokens=200)
    out = rt.execute(job_id)
    assert out.status == "failed"
    with db.session() as s:
        job = jobs.get_job(s, job_id)
    assert job.status == "failed" and "exceeded the time limit of 0.01s (SPECQ_TIME_LIMIT)" in job.error
    assert job.attempts == 1 and _rows(job_id) == (0, 0)


def _run_celery(settings, rt, job_ids, timeout=60.0):
    """A real Celery worker (solo pool, in a thread) on the embedded broker until the jobs finish."""
    from celery.contrib.testing.worker import start_worker

    from specq.broker import enqueue_job
    from specq.worker import app as worker_app

    app = worker_app.create_worker_app(settings)
    worker_app.set_runtime(rt)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10, loglevel="WARNING"):
            for job_id in job_ids:
                enqueue_job(job_id, settings)
            deadline = time.monotonic() + timeout
            while True:
                with db.session() as s:
                    states = [jobs.get_job(s, j).status for j in job_ids]
                if all(x in ("succeeded", "failed", "cancelled") for x in states):
                    return states
                assert time.monotonic() < deadline, states
                time.sleep(0.1)
    finally:
        worker_app.set_runtime(None)


def test_transient_error_is_retried_then_succeeds(engine, store, tmp_path):
    from specq.worker.runtime import WorkerRuntime

    settings = _settings(tmp_path)
    rt = WorkerRuntime(settings, engine=FlakyEngine(engine, fails=1))
    job_id = _new_job()
    assert _run_celery(settings, rt, [job_id]) == ["succeeded"]
    with db.session() as s:
        job = jobs.get_job(s, job_id)
    assert job.attempts == 2 and job.error is None
    assert _rows(job_id)[0] == 1


def test_transient_errors_use_up_attempts_then_fail(engine, store, tmp_path):
    from specq.worker.runtime import WorkerRuntime

    settings = _settings(tmp_path, max_attempts=2)
    rt = WorkerRuntime(settings, engine=FlakyEngine(engine, fails=99))
    job_id = _new_job(max_attempts=2)
    assert _run_celery(settings, rt, [job_id]) == ["failed"]
    with db.session() as s:
        job = jobs.get_job(s, job_id)
    assert job.attempts == 2
    assert job.error == "failed after 2 attempts: ConnectionError: connection reset by peer"
    assert _rows(job_id) == (0, 0)


def test_input_error_is_not_retried(engine, store, tmp_path):
    from specq.worker.runtime import WorkerRuntime

    settings = _settings(tmp_path)
    rt = WorkerRuntime(settings, engine=engine)
    with db.session() as s:
        job_id = jobs.create_job(s, text="y = 2\n" * 200, params={"max_tokens": 4}).id
    assert _run_celery(settings, rt, [job_id]) == ["failed"]
    with db.session() as s:
        job = jobs.get_job(s, job_id)
    assert job.attempts == 1 and "exceeds the target's context of 512 tokens" in job.error


# --- settings --------------------------------------------------------------------------------------------


def test_settings_from_env_and_checks():
    s = ServiceSettings.from_env({"SPECQ_TIME_LIMIT": "120", "SPECQ_QUEUE": "gpu0", "SPECQ_WARM_UP": "no",
                                  "SPECQ_N_GPU_LAYERS": "-1", "SPECQ_BROKER_URL": "redis://h:6379/0"})
    assert s.time_limit == 120 and s.queue == "gpu0" and s.warm_up is False and s.n_gpu_layers == -1
    assert s.resolved_visibility_timeout == 720 and not s.embedded_broker
    assert ServiceSettings.from_env({}).embedded_broker
    with pytest.raises(SettingsError, match="SPECQ_VISIBILITY_TIMEOUT .* must be longer than SPECQ_TIME_LIMIT"):
        ServiceSettings.from_env({"SPECQ_TIME_LIMIT": "600", "SPECQ_VISIBILITY_TIMEOUT": "300"})
    with pytest.raises(SettingsError, match=r"\+ 60s \(660s\)"):  # above the hard kill, not just the limit
        ServiceSettings.from_env({"SPECQ_TIME_LIMIT": "600", "SPECQ_VISIBILITY_TIMEOUT": "630"})
    assert ServiceSettings.from_env({"SPECQ_TIME_LIMIT": "600", "SPECQ_VISIBILITY_TIMEOUT": "661"}).hard_time_limit == 660
    with pytest.raises(SettingsError, match="SPECQ_CONCURRENCY has a bad value: 'two'"):
        ServiceSettings.from_env({"SPECQ_CONCURRENCY": "two"})
    opts = ServiceSettings.from_env({"SPECQ_SCORE_MATH": "numpy", "SPECQ_N_PARALLEL": "4"}).engine_options()
    assert (opts.score_math, opts.n_parallel) == ("numpy", 4)
    assert ServiceSettings.from_env({}).engine_options().score_math == "auto"
    with pytest.raises(SettingsError, match="SPECQ_SCORE_MATH must be auto, numpy or torch"):
        ServiceSettings.from_env({"SPECQ_SCORE_MATH": "cupy"})
    # command-line overrides win over the environment
    assert ServiceSettings.from_env({"SPECQ_QUEUE": "a"}, queue="b").queue == "b"
    opts = ServiceSettings(target="/m/t.gguf", threads=3, flash_attn=False).engine_options()
    assert (opts.target, opts.n_threads, opts.flash_attn) == ("/m/t.gguf", 3, False)
    assert EngineOptions().speculator == opts.speculator
    # CUDA graphs: off unless asked for (EngineOptions.cuda_graphs says why)
    assert ServiceSettings.from_env({}).engine_options().cuda_graphs is False
    assert ServiceSettings.from_env({"SPECQ_CUDA_GRAPHS": "on"}).engine_options().cuda_graphs is True


def test_backoff_doubles_up_to_its_cap():
    s = ServiceSettings(retry_backoff=2, retry_backoff_max=10)
    assert [s.backoff(a) for a in (1, 2, 3, 4)] == [2, 4, 8, 10]
    assert s.backoff(1, jitter=1) == 2.5 and s.backoff(1, jitter=-1) == 1.5


def test_own_interrupted_job_is_reclaimed_others_are_not(engine, store, tmp_path):
    """A job this worker left `running` (the store failed as it finished, the task was re-sent) is run
    again by it; a job running elsewhere with a fresh heartbeat is left alone."""
    from specq.worker.runtime import WorkerRuntime

    rt = WorkerRuntime(_settings(tmp_path), engine=engine)
    mine, theirs = _new_job(), _new_job()
    with db.session() as s:
        assert jobs.mark_running(s, mine, worker=rt.name)
        assert jobs.mark_running(s, theirs, worker="other-host:1")
    assert rt.execute(theirs).status == "skipped"
    assert rt.execute(mine).status == "succeeded"
    with db.session() as s:
        assert jobs.get_job(s, mine).attempts == 2
        t = jobs.get_job(s, theirs)
    assert t.status == "running" and t.worker == "other-host:1" and t.attempts == 1
