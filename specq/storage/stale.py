"""Running jobs whose worker stopped heartbeating, and the transitions the reconciler makes on them.

A worker writes its job's `heartbeat_at` every SPECQ_PROGRESS_INTERVAL seconds; a `running` job whose
heartbeat is older than a cutoff was left behind by a worker that was killed (SIGKILL, OOM, a lost
host). Each transition below is one conditional UPDATE that re-checks "still running and still stale":
that UPDATE is the claim, so when several reconcilers (one per worker, plus `specq reconcile`) look at
the same job, exactly one of them changes it and acts on it; the others see 0 rows and do nothing.
A worker that reclaims the job first (a redelivered message, `jobs.mark_running`) refreshes the
heartbeat, so the reconciler's UPDATE no longer matches either.

Every transition here also writes a new `attempt_token` that no worker holds, so the worker whose
heartbeat went stale — if it is not dead but only cut off (a database outage longer than
SPECQ_STALE_AFTER, a paused VM) — has every later write refused (`contracts.Fenced`) and stops its run:
it can no longer heartbeat a job another worker runs, nor save a result over a requeued or failed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, false, func, select, true, update
from sqlalchemy.orm import Session

from .db import write_transaction
from .models import Job, new_token, utcnow


@dataclass(frozen=True)
class StaleJob:
    """What the reconciler needs to know about one stale running job."""

    id: str
    batch_id: str | None
    worker: str | None
    attempts: int
    max_attempts: int
    cancel_requested: bool
    phase: str | None
    heartbeat_at: datetime | None
    error: str | None
    #: the broker queue it was sent to (None: rows from before queues were recorded)
    queue: str | None = None


def cutoff(stale_after_s: float) -> datetime:
    """Heartbeats older than this are stale."""
    return utcnow() - timedelta(seconds=stale_after_s)


def _last_sign_of_life():
    # mark_running always sets heartbeat_at; started_at covers rows written by hand or by old versions
    return func.coalesce(Job.heartbeat_at, Job.started_at, Job.created_at)


def stale_running(before: datetime):
    """SQL condition: a running job with no sign of life since `before` (also used by jobs.mark_running)."""
    return and_(Job.status == "running", _last_sign_of_life() < before)


def _stale(job_id: str, before: datetime):
    return and_(Job.id == job_id, stale_running(before))


def find_stale(session: Session, before: datetime, limit: int = 200) -> list[StaleJob]:
    """Running jobs whose last heartbeat is older than `before`, oldest first."""
    rows = session.execute(
        select(Job.id, Job.batch_id, Job.worker, Job.attempts, Job.max_attempts, Job.cancel_requested,
               Job.progress_phase, Job.heartbeat_at, Job.error, Job.queue)
        .where(stale_running(before))
        .order_by(_last_sign_of_life())
        .limit(limit)
    ).all()
    session.commit()
    return [StaleJob(r.id, r.batch_id, r.worker, r.attempts, r.max_attempts, bool(r.cancel_requested),
                     r.progress_phase, r.heartbeat_at, r.error, r.queue) for r in rows]


def count_stale(session: Session, before: datetime) -> int:
    """How many running jobs have no heartbeat since `before` (for /metrics)."""
    n = session.scalar(select(func.count()).select_from(Job)
                       .where(stale_running(before))) or 0
    session.commit()
    return int(n)


def _update(session: Session, where, **values) -> bool:
    try:
        write_transaction(session)
        n = session.execute(update(Job).where(where).values(**values)
                            .execution_options(synchronize_session=False)).rowcount
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n == 1


def requeue_stale(session: Session, job_id: str, before: datetime, message: str) -> bool:
    """Stale running job with attempts left and no cancel request -> queued, `message` as its error.
    False (nothing changed) if another reconciler or a worker got there first."""
    return _update(
        session,
        and_(_stale(job_id, before), Job.attempts < Job.max_attempts, Job.cancel_requested == false()),
        status="queued", worker=None, heartbeat_at=None, progress_phase=None, progress_done=0,
        progress_total=0, error=message[:4000], attempt_token=new_token(),
    )


def undo_requeue(session: Session, job: StaleJob) -> bool:
    """Put a job `requeue_stale` moved back as it was (running, stale) when its message could not be
    sent, so the next sweep tries again. False if a worker claimed it meanwhile. The token stays the
    one requeue_stale wrote: the stale worker stays fenced (the next sweep requeues the job again)."""
    return _update(
        session,
        and_(Job.id == job.id, Job.status == "queued", Job.worker.is_(None), Job.attempts == job.attempts),
        status="running", worker=job.worker, heartbeat_at=job.heartbeat_at, progress_phase=job.phase,
        error=job.error,
    )


def fail_stale(session: Session, job_id: str, before: datetime, message: str) -> bool:
    """Stale running job with no attempts left -> failed with `message`."""
    return _update(
        session,
        and_(_stale(job_id, before), Job.attempts >= Job.max_attempts, Job.cancel_requested == false()),
        status="failed", error=message[:4000], finished_at=utcnow(), attempt_token=new_token(),
    )


def cancel_stale(session: Session, job_id: str, before: datetime, message: str) -> bool:
    """Stale running job whose cancel was requested -> cancelled (its worker died before honouring it)."""
    return _update(
        session,
        and_(_stale(job_id, before), Job.cancel_requested == true()),
        status="cancelled", error=message[:4000], finished_at=utcnow(), attempt_token=new_token(),
    )


def queued_ids(session: Session, before: datetime, limit: int = 10_000) -> list[str]:
    """Ids of jobs queued since before `before`, oldest first (for re-sending lost broker messages)."""
    ids = list(session.scalars(select(Job.id).where(and_(Job.status == "queued", Job.created_at < before))
                               .order_by(Job.created_at).limit(limit)))
    session.commit()
    return ids


__all__ = ["StaleJob", "cutoff", "stale_running", "find_stale", "count_stale", "requeue_stale", "undo_requeue", "fail_stale", "cancel_stale",
           "queued_ids"]
