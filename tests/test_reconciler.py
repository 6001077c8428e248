"""The reconciler on a real SQLite job store and the real embedded broker (no worker): stale running
jobs are requeued and re-sent once even with several reconcilers at once, failed after max_attempts
with a clear message, cancelled when a cancel was requested; fresh ones are left alone; a message the
broker refuses is undone for the next sweep. And the store-write retry through lost connections."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError, OperationalError

from specq import monitor
from specq.reconciler import ReconcilerThread, reconcile_once, republish_queued
from specq.settings import ServiceSettings
from specq.storage import db, jobs
from specq.storage.models import Job, utcnow
from specq.storage.retry import retry_transient

DOC = "def add(a, b):\n    return a + b\n"


def _settings(tmp_path, **kw) -> ServiceSettings:
    base = dict(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}", queue="rq", stale_after=60.0)
    base.update(kw)
    s = ServiceSettings(**base)
    s.validate()
    return s


def _running_job(worker: str = "dead-host:1", heartbeat_age_s: float = 300.0, attempts: int = 1,
                 max_attempts: int = 3, phase: str | None = "decode", cancel: bool = False) -> str:
    with db.session() as s:
        job_id = jobs.create_job(s, text=DOC, params={"question": "q", "max_tokens": 4},
                                 max_attempts=max_attempts).id
        assert jobs.mark_running(s, job_id, worker=worker)
        s.execute(update(Job).where(Job.id == job_id).values(
            attempts=attempts, progress_phase=phase, cancel_requested=cancel,
            heartbeat_at=utcnow() - timedelta(seconds=heartbeat_age_s)))
        s.commit()
    return job_id


def _job(job_id: str) -> Job:
    with db.session() as s:
        return jobs.get_job(s, job_id)


def test_stale_job_is_requeued_and_sent_once(store, tmp_path):
    settings = _settings(tmp_path)
    stale, fresh = _running_job(), _running_job(worker="live-host:2", heartbeat_age_s=1.0)
    sweep = reconcile_once(settings)
    assert sweep.requeued == [stale] and not sweep.failed and not sweep.cancelled
    job = _job(stale)
    assert job.status == "queued" and job.worker is None and job.attempts == 1
    assert job.error.startswith("attempt 1 lost: worker dead-host:1 stopped heartbeating during decode (last heartbeat 20")
    assert job.error.endswith("; requeued")
    assert monitor.queue_depth(settings) == 1  # its id is back in the broker
    assert _job(fresh).status == "running"
    assert not reconcile_once(settings)  # nothing left to do
    # the next claim counts the next attempt
    with db.session() as s:
        assert jobs.mark_running(s, stale, worker="new-host:3")
    assert _job(stale).attempts == 2


def test_several_reconcilers_at_once_requeue_each_job_once(store, tmp_path):
    settings = _settings(tmp_path)
    ids = {_running_job() for _ in range(12)}
    sweeps = []

    def sweep() -> None:
        sweeps.append(reconcile_once(settings))

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    requeued = [j for sw in sweeps for j in sw.requeued]
    assert sorted(requeued) == sorted(ids)  # every job exactly once, across all four
    assert monitor.queue_depth(settings) == len(ids)


def test_no_attempts_left_fails_with_a_clear_message(store, tmp_path):
    job_id = _running_job(attempts=2, max_attempts=2, phase="score")
    sweep = reconcile_once(_settings(tmp_path))
    assert sweep.failed == [job_id]
    job = _job(job_id)
    assert job.status == "failed" and job.finished_at is not None
    assert job.error.startswith("failed after 2 attempts: worker dead-host:1 stopped heartbeating during score")
    assert not reconcile_once(_settings(tmp_path))


def test_cancel_requested_is_cancelled(store, tmp_path):
    job_id = _running_job(cancel=True)
    assert reconcile_once(_settings(tmp_path)).cancelled == [job_id]
    job = _job(job_id)
    assert job.status == "cancelled" and job.error.startswith("cancelled (worker dead-host:1 stopped heartbeating")


def test_unsent_message_is_undone_for_the_next_sweep(store, tmp_path):
    # nothing listens on port 1: the broker refuses the message
    job_id = _running_job()
    before = _job(job_id)
    sweep = reconcile_once(_settings(tmp_path, broker_url="redis://127.0.0.1:1/0"))
    assert sweep.unsent == [job_id] and not sweep.requeued
    after = _job(job_id)
    assert (after.status, after.worker, after.heartbeat_at, after.error) == ("running", before.worker,
                                                                           before.heartbeat_at, before.error)
    assert reconcile_once(_settings(tmp_path)).requeued == [job_id]  # broker back: sent


def test_after_a_store_outage_running_jobs_get_stale_after_to_heartbeat(store, tmp_path, monkeypatch):
    # a job whose heartbeat went stale while the store was down belongs to a live worker as likely as not
    settings = _settings(tmp_path, stale_after=1.5, progress_interval=0.2)
    thread = ReconcilerThread(settings)
    monkeypatch.setenv("SPECQ_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")  # nothing listens
    assert thread.sweep() is None  # a real failed sweep: connection refused
    monkeypatch.setenv("SPECQ_DATABASE_URL", store)
    job_id = _running_job(heartbeat_age_s=300.0)
    back = thread.sweep()  # the store is back: held, and the grace starts now
    assert back is not None and not back.requeued and _job(job_id).status == "running"
    assert thread.sweep().requeued == []  # still within stale_after of the store's return
    while time.monotonic() < thread.grace_until:
        time.sleep(0.1)
    assert thread.sweep().requeued == [job_id]  # no heartbeat in the grace: lost after all
    assert _job(job_id).status == "queued"


def test_republish_queued_sends_every_queued_job(store, tmp_path):
    settings = _settings(tmp_path)
    with db.session() as s:
        ids = [jobs.create_job(s, text=DOC, params={"question": "q"}).id for _ in range(3)]
    assert sorted(republish_queued(settings).republished) == sorted(ids)
    assert monitor.queue_depth(settings) == 3


def test_store_write_is_retried_through_lost_connections(store):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("UPDATE jobs", {}, ConnectionError("server closed the connection unexpectedly"))
        return "saved"

    with db.session() as s:
        assert retry_transient(s, flaky, what="saving", give_up_after=30, first_pause=0.01) == "saved"
        assert len(calls) == 3

        def broken():
            raise IntegrityError("INSERT", {}, ValueError("duplicate key"))

        with pytest.raises(IntegrityError):  # not a connection problem: raised at once
            retry_transient(s, broken, what="saving", give_up_after=30)

        def down():
            raise OperationalError("UPDATE jobs", {}, ConnectionError("connection refused"))

        with pytest.raises(OperationalError):  # still down after give_up_after: raised
            retry_transient(s, down, what="saving", give_up_after=0.05, first_pause=0.01)
