"""Which job a worker runs when a message reaches it, and claims beyond `jobs.mark_running`.

**A message is a ticket, its job id a hint** (`claim_next`). Every stored job gets one message, so a
queue's messages are never fewer than its queued jobs; but a worker that receives a message claims
the job that should run next in its queue, not necessarily the one the message names:

1. the named job itself when it is a redelivery (running, its worker's heartbeat stale) or this
   worker's own interrupted job (`reclaim_own`) — the reliability rules of docs/reliability.md;
2. otherwise, among the queue's queued jobs (a retried job only once its backoff `not_before` passed,
   unless the message names it): the lowest `priority` first (interactive requests before batch
   requests), then the tenant with the fewest running jobs in the queue, then the tenant served
   longest ago (`claim_turns`), then that tenant's oldest job.

So a chat request behind a 50,000-request batch runs at the next free slot, and a second tenant's
batch interleaves with the first's instead of waiting for it — on Redis and on the embedded broker
alike, since the choice is made in SQL at claim time. A message whose job ran under another message
claims another job or, when none is queued, nothing (it is acknowledged and dropped).

Every claim returns the attempt's token with the job id (`Claim`); the worker passes it to every
write it makes about the job, which is refused (`contracts.Fenced`) once another claim or the
reconciler has taken the job over (storage.jobs, "Fencing").
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import NamedTuple

from sqlalchemy import and_, false, func, or_, select, update
from sqlalchemy.orm import Session

from . import jobs as _jobs
from .db import write_transaction
from .models import ClaimTurn, Job, utcnow

#: times claim_next retries when another worker claimed its pick first
CLAIM_RETRIES = 8


class Claim(NamedTuple):
    """A claimed job: its id and this attempt's token (pass it to every write about the job)."""

    job_id: str
    token: str


def _in_queue(queue: str | None):
    return or_(Job.queue == queue, Job.queue.is_(None)) if queue is not None else Job.id.is_not(None)


def pick_next(session: Session, queue: str | None, hint: str | None = None,
              exclude: Sequence[str] = ()) -> str | None:
    """The id of the job the next claim in `queue` should take (module doc, rule 2), or None."""
    pick = _pick(session, queue, hint, exclude)
    return pick[0] if pick is not None else None


def _pick(session: Session, queue: str | None, hint: str | None, exclude: Sequence[str]) -> tuple[str, str] | None:
    """pick_next's job id and its tenant (the claim records the tenant's turn without reading it again)."""
    now = utcnow()
    ready = or_(Job.not_before.is_(None), Job.not_before <= now)
    if hint is not None:
        ready = or_(ready, Job.id == hint)
    cand = and_(Job.status == "queued", _in_queue(queue), ready)
    if exclude:
        cand = and_(cand, Job.id.not_in(list(exclude)))
    best = {t: p for t, p in session.execute(select(Job.tenant, func.min(Job.priority)).where(cand).group_by(Job.tenant))}
    if not best:
        session.commit()
        return None
    running = dict(session.execute(select(Job.tenant, func.count()).where(and_(Job.status == "running", _in_queue(queue)))
                                   .group_by(Job.tenant)).all())
    turns = dict(session.execute(select(ClaimTurn.tenant, ClaimTurn.last_claim_at)
                                 .where(ClaimTurn.queue == (queue or ""))).all())
    epoch = now.replace(year=1970, month=1, day=1)
    tenant = min(best, key=lambda t: (best[t], running.get(t, 0), turns.get(t) or epoch, t))
    job_id = session.scalar(select(Job.id).where(and_(cand, Job.tenant == tenant, Job.priority == best[tenant]))
                            .order_by(Job.created_at, Job.id).limit(1))
    session.commit()
    return (job_id, tenant) if job_id is not None else None


def claim_next(session: Session, hint: str, worker: str, *, queue: str | None,
               stale_after_s: float | None = _jobs.DEFAULT_STALE_AFTER_S, live: Container[str] = ()) -> Claim | None:
    """Claim the job to run for a message naming `hint` (module doc): the Claim (job id and attempt
    token), or None if there is none.

    live: the jobs running in this worker process now (its serving slots): a message naming one of
    them never claims it again (neither as stale nor through `reclaim_own`), it claims the next job.

    A transaction the caller left open (a read) is committed first: each claim step is a write
    transaction of its own (SQLite: BEGIN IMMEDIATE, which waits on the busy timeout), whereas an
    UPDATE inside an older read transaction fails at once with "database is locked" on SQLite when
    another connection (the API adding jobs) wrote since that read began."""
    if session.in_transaction():
        session.commit()
    token = None if hint in live or not _running(session, hint) else (
        _jobs.mark_running(session, hint, worker, stale_after_s=stale_after_s, only_stale=True)
        or reclaim_own(session, hint, worker, live=live))
    if token:
        return Claim(hint, token)
    lost: list[str] = []
    for _ in range(CLAIM_RETRIES):
        pick = _pick(session, queue, hint, exclude=lost)
        if pick is None:
            return None
        job_id, tenant = pick
        token = _jobs.mark_running(session, job_id, worker, stale_after_s=None)
        if token:
            _take_turn(session, queue or "", tenant)
            return Claim(job_id, token)
        lost.append(job_id)  # another worker claimed it between our pick and our claim
    return None


def _running(session: Session, job_id: str) -> bool:
    """Whether the job is `running` (one read, then the read transaction ends). Only a running job can be
    a redelivery or this worker's own interrupted job (rule 1); the usual message names a queued job, and
    this read spares it rule 1's two write transactions, which change nothing then (issue 50: a
    follow-up's claim was a chain of store round trips)."""
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    session.commit()
    return status == "running"


def _take_turn(session: Session, queue: str, tenant: str) -> None:
    """Record that `tenant` was served from `queue` now (best effort: fairness, not correctness)."""
    try:
        dialect = session.get_bind().dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        stmt = insert(ClaimTurn).values(queue=queue, tenant=tenant, last_claim_at=utcnow())
        session.execute(stmt.on_conflict_do_update(index_elements=["queue", "tenant"],
                                                   set_={"last_claim_at": stmt.excluded.last_claim_at}))
        session.commit()
    except Exception:
        session.rollback()


def reclaim_own(session: Session, job_id: str, worker: str, *, live: Container[str] = ()) -> str | None:
    """Claim again a job left `running` by this very worker process (`worker` = its "host:pid").

    A job in `live` (the jobs running in this process now: its serving slots, group-claimed ones
    included) is never claimed again: None. Any other `running` job of this worker delivered to it
    again (the store failed while it was finishing the job, and the task was re-sent) has nobody
    running it: start a new attempt (attempts + 1, fresh heartbeat, a new attempt token: the
    interrupted attempt's writes are refused) if attempts are left and no cancel was requested; its
    token. None otherwise, changing nothing.
    """
    if job_id in live:
        return None
    now = utcnow()
    token = _jobs.new_token()
    try:
        write_transaction(session)
        n = session.execute(
            update(Job)
            .where(
                and_(
                    Job.id == job_id,
                    Job.status == "running",
                    Job.worker == worker,
                    Job.attempts < Job.max_attempts,
                    Job.cancel_requested == false(),
                )
            )
            .values(attempts=Job.attempts + 1, started_at=now, heartbeat_at=now, attempt_token=token,
                    progress_phase=None, progress_done=0, progress_total=0)
            .execution_options(synchronize_session=False)
        ).rowcount
        if n != 1:
            session.rollback()
            return None
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return token


__all__ = ["Claim", "claim_next", "pick_next", "reclaim_own", "CLAIM_RETRIES"]
