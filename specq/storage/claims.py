"""Claims a worker may make beyond `jobs.mark_running` (the service's worker uses these)."""

from __future__ import annotations

from sqlalchemy import and_, false, select, update
from sqlalchemy.orm import Session

from .db import write_transaction
from .models import Job, utcnow


def reclaim_own(session: Session, job_id: str, worker: str) -> bool:
    """Claim again a job left `running` by this very worker process (`worker` = its "host:pid").

    A worker runs one job at a time per process, so when its own `running` job is delivered to it
    again (the store failed while it was finishing the job, and the task was re-sent), nobody is
    running it: start a new attempt (attempts + 1, fresh heartbeat) if attempts are left and no
    cancel was requested. False otherwise, changing nothing.
    """
    now = utcnow()
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
            .values(attempts=Job.attempts + 1, started_at=now, heartbeat_at=now, progress_phase=None,
                    progress_done=0, progress_total=0)
            .execution_options(synchronize_session=False)
        ).rowcount
        if n != 1:
            session.rollback()
            return False
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return True


def job_status(session: Session, job_id: str) -> str | None:
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    session.commit()
    return status


__all__ = ["reclaim_own", "job_status"]
