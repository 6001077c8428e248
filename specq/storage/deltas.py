"""Answer text of running jobs as rows, for event streams on the embedded default (no Redis).

The worker's `DeltaPublisher` appends at most one row per job every ~50 ms (`append`); each API event
stream polls for rows after the last one it has seen (`read_after`); `clear` deletes a job's rows once
it has ended (the stored result holds the whole text then). One row: (job_id, attempt, seq) ->
(offset, text, final); offsets count characters of that attempt's answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.orm import Session

from .db import write_transaction
from .jobs import check_owned, owned
from .models import Job, JobDelta, utcnow


@dataclass(frozen=True)
class Delta:
    attempt: int
    seq: int
    offset: int
    text: str
    final: bool


def append(session: Session, job_id: str, attempt: int, seq: int, offset: int, text: str, final: bool = False, *,
           token: str) -> None:
    """One row of the attempt holding `token`, fenced like every worker write (storage.jobs,
    "Fencing"): the job's heartbeat is bumped in the same transaction by an UPDATE that matches only
    (job id, `token`, running); raises contracts.Fenced (nothing written) when it matches no row."""
    try:
        write_transaction(session)
        n = session.execute(update(Job).where(owned(job_id, token)).values(heartbeat_at=utcnow())
                            .execution_options(synchronize_session=False)).rowcount
        if n != 1:
            session.rollback()
            check_owned(session, job_id, token)  # raises Fenced (the job is not this attempt's any more)
            return
        session.add(JobDelta(job_id=job_id, attempt=attempt, seq=seq, offset=offset, text=text, final=final,
                             created_at=utcnow()))
        session.commit()
    except BaseException:
        session.rollback()
        raise


def read_after(session: Session, job_id: str, attempt: int = 0, seq: int = -1, limit: int = 1000) -> list[Delta]:
    """The job's rows after (attempt, seq), in order."""
    q = (select(JobDelta).where(and_(JobDelta.job_id == job_id,
                                     or_(JobDelta.attempt > attempt, and_(JobDelta.attempt == attempt, JobDelta.seq > seq))))
         .order_by(JobDelta.attempt, JobDelta.seq).limit(limit))
    rows = [Delta(r.attempt, r.seq, r.offset, r.text, bool(r.final)) for r in session.scalars(q)]
    session.commit()
    return rows


def clear(session: Session, job_id: str) -> int:
    try:
        n = session.execute(delete(JobDelta).where(JobDelta.job_id == job_id)).rowcount
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n


__all__ = ["Delta", "append", "read_after", "clear"]
