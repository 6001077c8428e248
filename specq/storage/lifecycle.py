"""Deleting what finished: one job's or one batch's data on request, and everything finished longer
ago than SPECQ_RETENTION.

Deleting a job deletes its row, its document and question (job_inputs), its result and its phase
timings, in one transaction (a batch: also its files — output, errors, and the input a native create
stored for it); afterwards the job is a 404 like any unknown id. Only finished jobs
(succeeded, failed, cancelled) and finished batches (completed, failed, expired, cancelled) are
deleted: a queued or running job is cancelled first. A job of a batch is deleted with its batch (so
a batch's counts, results and stats stay whole), never alone.

`sweep_retention` deletes, page by page (short transactions), the standalone jobs that finished
before the cutoff and the batches that finished before it, with their jobs. The API process runs it
periodically when SPECQ_RETENTION is set (`specq.api.retention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, delete, func, select
from sqlalchemy.orm import Session

from ..contracts import BATCH_TERMINAL, JOB_TERMINAL
from .db import write_transaction
from .models import Batch, File, FileChunk, Job, JobInput, PhaseTiming, Result

#: jobs (or batches) deleted per transaction by the retention sweep
PAGE = 200


class NotFinished(Exception):
    """The job or batch is not finished (or a job belongs to a batch); the message says what to do."""


def _delete_jobs(session: Session, job_ids) -> int:
    """Delete these jobs and everything of theirs (the caller commits). Explicit, not only ON DELETE
    CASCADE, so a database without foreign-key enforcement is cleaned up as well."""
    for table in (PhaseTiming, Result, JobInput):
        session.execute(delete(table).where(table.job_id.in_(job_ids)).execution_options(synchronize_session=False))
    return session.execute(delete(Job).where(Job.id.in_(job_ids)).execution_options(synchronize_session=False)).rowcount


def _delete_batch_files(session: Session, batch_id: str) -> None:
    """Delete the batch's files: its output and error files and the input a native create stored for
    it (the caller commits). Explicit, like _delete_jobs; an uploaded input file (OpenAI's create) has
    no batch_id and stays, as on OpenAI."""
    ids = select(File.id).where(File.batch_id == batch_id)
    session.execute(delete(FileChunk).where(FileChunk.file_id.in_(ids)).execution_options(synchronize_session=False))
    session.execute(delete(File).where(File.batch_id == batch_id).execution_options(synchronize_session=False))


def delete_job(session: Session, job_id: str, tenant: str | None = None) -> bool:
    """Delete a finished standalone job and its data; False if there is no such job (for `tenant`).
    Raises NotFinished for a queued or running job and for a job of a batch."""
    try:
        write_transaction(session)
        q = select(Job.status, Job.batch_id).where(Job.id == job_id)
        if tenant is not None:
            q = q.where(Job.tenant == tenant)
        row = session.execute(q.with_for_update()).one_or_none()
        if row is None:
            session.rollback()
            return False
        if row.batch_id is not None:
            raise NotFinished(f"job {job_id} belongs to batch {row.batch_id}: delete the batch's data "
                              f"(DELETE /v1/batches/{row.batch_id}/data)")
        if row.status not in JOB_TERMINAL:
            raise NotFinished(f"job {job_id} is {row.status}: cancel it first (DELETE /v1/jobs/{job_id}), then "
                              "delete its data once it is cancelled")
        _delete_jobs(session, [job_id])
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return True


def delete_batch(session: Session, batch_id: str, tenant: str | None = None) -> int | None:
    """Delete a finished batch with all its jobs and their data; the number of jobs deleted, or None
    if there is no such batch (for `tenant`). Raises NotFinished for an unfinished batch."""
    try:
        write_transaction(session)
        q = select(Batch.status).where(Batch.id == batch_id)
        if tenant is not None:
            q = q.where(Batch.tenant == tenant)
        status = session.scalar(q.with_for_update())
        if status is None:
            session.rollback()
            return None
        if status not in BATCH_TERMINAL:
            raise NotFinished(f"batch {batch_id} is {status}: cancel it first (POST /v1/batches/{batch_id}/cancel), "
                              "then delete its data once it is cancelled")
        n = _delete_jobs(session, select(Job.id).where(Job.batch_id == batch_id))
        _delete_batch_files(session, batch_id)
        session.execute(delete(Batch).where(Batch.id == batch_id).execution_options(synchronize_session=False))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n


def discard_batch(session: Session, batch_id: str) -> None:
    """Delete a batch and its jobs whatever their status: undoing a batch whose creation failed half-way
    (before any of its jobs was queued)."""
    try:
        write_transaction(session)
        _delete_jobs(session, select(Job.id).where(Job.batch_id == batch_id))
        _delete_batch_files(session, batch_id)
        session.execute(delete(Batch).where(Batch.id == batch_id).execution_options(synchronize_session=False))
        session.commit()
    except BaseException:
        session.rollback()
        raise


@dataclass
class Swept:
    jobs: int = 0
    batches: int = 0

    def summary(self) -> str:
        return f"{self.jobs} jobs and {self.batches} batches deleted"


def sweep_retention(session: Session, cutoff: datetime) -> Swept:
    """Delete standalone jobs that finished before `cutoff`, and batches that finished before it
    (with their jobs). Each page of PAGE is its own transaction."""
    out = Swept()
    while True:
        try:
            write_transaction(session)
            ids = list(session.scalars(
                select(Job.id).where(and_(Job.batch_id.is_(None), Job.status.in_(JOB_TERMINAL),
                                          func.coalesce(Job.finished_at, Job.created_at) < cutoff)).limit(PAGE)))
            if ids:
                out.jobs += _delete_jobs(session, ids)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        if len(ids) < PAGE:
            break
    finished_at = func.coalesce(Batch.completed_at, Batch.failed_at, Batch.expired_at, Batch.cancelled_at,
                                Batch.created_at)
    while True:
        batch_ids = list(session.scalars(select(Batch.id).where(and_(Batch.status.in_(BATCH_TERMINAL),
                                                                     finished_at < cutoff)).limit(PAGE)))
        session.commit()
        for batch_id in batch_ids:
            try:
                n = delete_batch(session, batch_id)
            except NotFinished:  # moved on meanwhile (it cannot: finished batches stay finished)
                continue
            if n is not None:
                out.jobs += n
                out.batches += 1
        if len(batch_ids) < PAGE:
            break
    return out


__all__ = ["delete_job", "delete_batch", "discard_batch", "sweep_retention", "NotFinished", "Swept"]
