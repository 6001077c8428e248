"""Fencing (docs/reliability.md, "A job runs on one worker at a time"): every claim gets an attempt
token, every write a worker makes about its job is conditional on (job id, token, running), and a
worker whose claim was taken over can write nothing and stops its run.

Storage tests run on SQLite and on the real PostgreSQL server; the worker tests use the real engine
(tiny random-weight models) and a real SQLite store. A takeover is what the reconciler and a second
worker really do: the job's heartbeat goes stale, `stale.requeue_stale` (or `fail_stale`) moves it,
another worker's `mark_running` claims it.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text, update

from specq.contracts import Fenced
from specq.engine.options import EngineOptions
from specq.engine.result import RunResult
from specq.settings import ServiceSettings
from specq.storage import claims, db, deltas, jobs, results, stale
from specq.storage.models import Job, JobDelta, PhaseTiming, Result, utcnow

from service_helpers import empty_store

DOC = "def add(a, b):\n    return a + b\n"


@pytest.fixture(params=["sqlite", "postgresql"])
def s(request, tmp_path):
    with empty_store(request.param, tmp_path) as url:
        db.upgrade(url)
        with db.session(url) as session:
            yield session


def _result() -> RunResult:
    r = RunResult(text="stale answer", finish_reason="stop")
    r.timings_ms.update(decode=1.0, total=2.0)
    return r


def _go_stale(s, job_id: str, age_s: float = 3600.0) -> None:
    """The claim's worker stopped reaching the store: its heartbeat is `age_s` old."""
    s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow() - timedelta(seconds=age_s)))
    s.commit()


def _counts(s, job_id: str) -> tuple[int, int, int]:
    out = tuple(s.scalar(select(func.count()).select_from(t).where(t.job_id == job_id))
                for t in (Result, PhaseTiming, JobDelta))
    s.commit()
    return out  # type: ignore[return-value]


def _refused_everything(s, job_id: str, token: str) -> None:
    """Every kind of worker write with `token` is refused and changes nothing."""
    before = s.execute(select(Job.status, Job.attempt_token, Job.heartbeat_at, Job.progress_phase, Job.error,
                              Job.worker).where(Job.id == job_id)).one()
    s.commit()
    writes = [
        lambda: jobs.heartbeat(s, job_id, token=token),
        lambda: jobs.update_progress(s, job_id, "decode", 5, 9, token=token),
        lambda: results.save_result(s, job_id, _result(), token=token),
        lambda: jobs.mark_failed(s, job_id, "stale failure", token=token),
        lambda: jobs.mark_cancelled(s, job_id, "stale cancel", token=token),
        lambda: jobs.requeue(s, job_id, "stale retry", token=token),
        lambda: deltas.append(s, job_id, 1, 0, 0, "stale text", token=token),
    ]
    for write in writes:
        with pytest.raises(Fenced, match="no longer current"):
            write()
    after = s.execute(select(Job.status, Job.attempt_token, Job.heartbeat_at, Job.progress_phase, Job.error,
                             Job.worker).where(Job.id == job_id)).one()
    s.commit()
    assert tuple(after) == tuple(before)


def test_stale_save_result_on_a_requeued_job_is_refused(s):
    job = jobs.create_job(s, text=DOC, max_attempts=3)
    a = jobs.mark_running(s, job.id, "host-a:1")
    jobs.update_progress(s, job.id, "decode", 1, 4, token=a)
    _go_stale(s, job.id)
    assert stale.requeue_stale(s, job.id, stale.cutoff(600), "attempt 1 lost; requeued")
    j = jobs.get_job(s, job.id)
    assert j.status == "queued" and j.attempt_token not in (None, a)  # the requeue bumped the token
    _refused_everything(s, job.id, a)
    assert jobs.get_job(s, job.id).status == "queued" and _counts(s, job.id) == (0, 0, 0)

    b = jobs.mark_running(s, job.id, "host-b:2")  # another worker claims it
    assert b and b != a
    _refused_everything(s, job.id, a)  # A still cannot write a heartbeat, progress, text or a result
    assert jobs.heartbeat(s, job.id, token=b) and jobs.update_progress(s, job.id, "decode", 2, 4, token=b)
    deltas.append(s, job.id, 2, 0, 0, "B's text", token=b)
    assert results.save_result(s, job.id, RunResult(text="B's answer"), token=b) is True
    j = jobs.get_job(s, job.id)
    assert j.status == "succeeded" and j.worker == "host-b:2" and j.attempts == 2
    assert results.get_result(s, job.id)["text"] == "B's answer"
    with pytest.raises(Fenced):
        results.save_result(s, job.id, _result(), token=a)


def test_stale_save_result_on_a_failed_job_is_refused(s):
    job = jobs.create_job(s, text=DOC, max_attempts=1)
    a = jobs.mark_running(s, job.id, "host-a:1")
    _go_stale(s, job.id)
    assert stale.fail_stale(s, job.id, stale.cutoff(600), "failed after 1 attempt: worker host-a:1 stopped")
    _refused_everything(s, job.id, a)
    j = jobs.get_job(s, job.id)
    assert j.status == "failed" and j.error.startswith("failed after 1 attempt") and _counts(s, job.id) == (0, 0, 0)


def test_stale_writes_on_a_cancelled_job_are_refused(s):
    job = jobs.create_job(s, text=DOC)
    a = jobs.mark_running(s, job.id, "host-a:1")
    jobs.request_cancel(s, job.id)
    _go_stale(s, job.id)
    assert stale.cancel_stale(s, job.id, stale.cutoff(600), "cancelled (worker stopped)")
    _refused_everything(s, job.id, a)
    assert jobs.get_job(s, job.id).status == "cancelled"


def test_a_stale_redelivery_and_an_own_reclaim_fence_the_earlier_claim(s):
    job = jobs.create_job(s, text=DOC, max_attempts=3, queue="q")
    a = jobs.mark_running(s, job.id, "host-a:1")
    _go_stale(s, job.id)
    claim = claims.claim_next(s, job.id, "host-b:2", queue="q", stale_after_s=600)  # redelivered message
    assert claim == claims.Claim(job.id, claim.token) and claim.token != a
    _refused_everything(s, job.id, a)
    again = claims.reclaim_own(s, job.id, "host-b:2")  # B's own message re-sent after a store error
    assert again and again != claim.token
    _refused_everything(s, job.id, claim.token)
    assert jobs.heartbeat(s, job.id, token=again)


def test_undone_requeue_keeps_the_stale_worker_fenced(s):
    job = jobs.create_job(s, text=DOC, max_attempts=3)
    a = jobs.mark_running(s, job.id, "host-a:1")
    _go_stale(s, job.id)
    found = stale.find_stale(s, stale.cutoff(600))
    assert stale.requeue_stale(s, job.id, stale.cutoff(600), "lost")
    assert stale.undo_requeue(s, found[0])  # the broker refused the message: running and stale again
    assert jobs.get_job(s, job.id).status == "running"
    _refused_everything(s, job.id, a)


def test_a_takeover_and_a_stale_save_are_ordered(s):
    """The fenced UPDATE takes the row's lock: a save racing a takeover either lands first (and the
    takeover finds a succeeded job) or is refused; never both."""
    url = s.get_bind().url
    outcomes = []
    for i in range(6):
        job = jobs.create_job(s, text=DOC, max_attempts=3)
        a = jobs.mark_running(s, job.id, "host-a:1")
        _go_stale(s, job.id)
        got: dict[str, object] = {}

        def save() -> None:
            with db.session(url) as mine:
                try:
                    got["saved"] = results.save_result(mine, job.id, _result(), token=a)
                except Fenced:
                    got["saved"] = "fenced"

        def take_over() -> None:
            with db.session(url) as theirs:
                got["b"] = jobs.mark_running(theirs, job.id, "host-b:2", stale_after_s=600)

        threads = [threading.Thread(target=save), threading.Thread(target=take_over)]
        for t in (threads if i % 2 else threads[::-1]):
            t.start()
        for t in threads:
            t.join(30)
        j = jobs.get_job(s, job.id)
        if got["saved"] is True:
            assert got["b"] is None and j.status == "succeeded" and j.attempt_token == a
        else:
            assert got["saved"] == "fenced" and got["b"] and j.status == "running" and j.attempt_token == got["b"]
            assert _counts(s, job.id)[0] == 0
        outcomes.append(got["saved"])
    assert set(outcomes) <= {True, "fenced"}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0005_goes_down_and_up(backend, tmp_path):
    from alembic import command

    with empty_store(backend, tmp_path) as url:
        db.upgrade(url)
        with db.session(url) as s:
            job = jobs.create_job(s, text=DOC)
            assert jobs.mark_running(s, job.id, "w:1")
        cfg = db.alembic_config(url)
        with db.get_engine(url).begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0004")
        with db.get_engine(url).connect() as conn:
            cols = list(conn.execute(text("SELECT * FROM jobs")).keys())
            assert "attempt_token" not in cols and conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 1
        db.dispose_engines()
        assert db.upgrade(url) == db.head_revision() and db.head_revision() >= "0005"
        with db.session(url) as s:
            # a job left running by a worker from before 0005 has no token: its writes are refused
            assert jobs.get_job(s, job.id).attempt_token is None
            with pytest.raises(Fenced):
                jobs.heartbeat(s, job.id, token="0" * 16)


# --- the worker -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_models):
    from specq.engine.pipeline import Engine

    e = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                             n_ctx=512, n_threads=2))
    yield e
    e.close()


def _settings(tmp_path) -> ServiceSettings:
    st = ServiceSettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}", queue="t", progress_interval=0.05,
                         stale_after=5.0, retry_backoff=0.1, retry_backoff_max=0.5, warm_up=False)
    st.validate()
    return st


def _take_over(job_id: str) -> str:
    """What the reconciler and worker B do to a job whose worker stopped reaching the store. Worker A
    here still heartbeats every 50 ms, so its heartbeat is aged and the requeue tried until the
    reconciler's UPDATE lands between two of A's beats (as after an outage: no beat in between)."""
    with db.session() as s:
        for _ in range(200):
            _go_stale(s, job_id)
            if stale.requeue_stale(s, job_id, stale.cutoff(5.0), "attempt 1 lost; requeued"):
                break
        else:
            raise AssertionError("the requeue never won against A's heartbeats")
        token = jobs.mark_running(s, job_id, "host-b:2")
        assert token
        return token


class TakenOverEngine:
    """The real engine; during its run (at the first decode step, or after it returned) the job is
    taken over as above. Each progress call after that takes 20 ms, as a real decode step would, so an
    unfenced run would go on for seconds."""

    def __init__(self, engine, job_id: str, when: str = "decode") -> None:
        self.engine, self.job_id, self.when = engine, job_id, when
        self.info, self.n_ctx = engine.info, engine.n_ctx
        self.token_b: str | None = None
        self.taken_at = self.ended_at = 0.0
        self.calls_after = 0
        self.raised: BaseException | None = None

    def __getattr__(self, name):
        """Everything else (set_evidence, which the worker calls at start and per claim, ...) is the real engine's."""
        return getattr(self.engine, name)

    def run(self, document, params, progress=None, **kw):
        def hooked(phase, done, total):
            if self.when == "decode" and phase == "decode" and self.token_b is None:
                self.token_b = _take_over(self.job_id)
                self.taken_at = time.monotonic()
            if self.token_b is not None:
                self.calls_after += 1
                time.sleep(0.02)
            progress(phase, done, total)

        try:
            result = self.engine.run(document, params, progress=hooked, **kw)
        except BaseException as e:
            self.raised, self.ended_at = e, time.monotonic()
            raise
        if self.when == "end":
            self.token_b = _take_over(self.job_id)
        return result


def _new_job(max_tokens: int) -> str:
    with db.session() as s:
        return jobs.create_job(s, text=DOC, params={"question": "what?", "max_tokens": max_tokens, "seed": 1}).id


def _b_owns_it(job_id: str, token_b: str) -> None:
    with db.session() as s:
        j = jobs.get_job(s, job_id)
        assert (j.status, j.worker, j.attempt_token, j.attempts) == ("running", "host-b:2", token_b, 2)
        assert j.progress_phase is None and j.progress_done == 0  # A wrote no progress over B's claim
        assert _counts(s, job_id)[:2] == (0, 0)  # no result, no timings
        assert jobs.heartbeat(s, job_id, token=token_b)  # B can write


def test_a_worker_whose_claim_was_taken_over_stops_and_writes_nothing(engine, store, tmp_path):
    from specq.worker.runtime import WorkerRuntime

    job_id = _new_job(max_tokens=200)
    eng = TakenOverEngine(engine, job_id)
    rt = WorkerRuntime(_settings(tmp_path), engine=eng)
    out = rt.execute(job_id)
    assert out.status == "fenced" and out.job_id == job_id and "no longer current" in out.message
    assert isinstance(eng.raised, Fenced)  # the engine's own run ended by the progress callback
    # it stopped within a few heartbeat intervals (50 ms), not after up to 200 decode steps of 20 ms
    assert eng.ended_at - eng.taken_at < 3.0 and eng.calls_after < 100, (eng.ended_at - eng.taken_at, eng.calls_after)
    _b_owns_it(job_id, eng.token_b)
    assert rt.jobs_done == 0


def test_a_run_that_ends_after_a_takeover_saves_nothing(engine, store, tmp_path):
    from specq.worker.runtime import WorkerRuntime

    job_id = _new_job(max_tokens=4)
    eng = TakenOverEngine(engine, job_id, when="end")
    rt = WorkerRuntime(_settings(tmp_path), engine=eng)
    out = rt.execute(job_id)
    assert out.status == "fenced" and eng.raised is None
    _b_owns_it(job_id, eng.token_b)
    with db.session() as s:  # the job's stream is B's now: A, fenced, did not clear it
        deltas.append(s, job_id, 2, 0, 0, "B", token=eng.token_b)
        assert [d.text for d in deltas.read_after(s, job_id, attempt=1, seq=10**9)] == ["B"]


def test_redis_stream_refuses_an_older_attempt_once_a_newer_one_publishes():
    from service_helpers import REDIS_URL, redis_reachable

    from specq.contracts import redis_keys
    from specq.worker.stream import RedisChannel

    why = redis_reachable()
    if why:
        pytest.skip(why)
    ch = RedisChannel(REDIS_URL)
    job_id = "job_fence_" + __import__("secrets").token_hex(6)
    _, text_key, attempt_key = redis_keys(job_id)
    try:
        ch.publish(job_id, 1, 0, 0, "A1 ", False, token="a")
        ch.publish(job_id, 1, 1, 3, "A2 ", False, token="a")  # before any newer attempt: still written
        ch.publish(job_id, 2, 0, 0, "B1 ", False, token="b")  # the new attempt resets the text
        with pytest.raises(Fenced):
            ch.publish(job_id, 1, 2, 6, "A3 ", False, token="a")
        ch.publish(job_id, 2, 1, 3, "B2", True, token="b")
        assert ch.redis.get(text_key) == b"B1 B2" and ch.redis.get(attempt_key) == b"2"
    finally:
        ch.redis.delete(text_key, attempt_key)
