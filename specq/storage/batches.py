"""Batches (OpenAI Batch API-like): a batch owns jobs (jobs.batch_id) and moves through

    validating -> in_progress -> finalizing -> completed
         \\            \\             \\-> failed / expired
          \\-> failed    \\-> cancelling -> cancelled

Each transition stamps its `<status>_at` column. `request_counts` (total/completed/failed) are
recomputed from the batch's jobs by `refresh_request_counts`. Same conventions as jobs.py: a Session
first, one transaction per call.

The life of a batch in the service:

* `create_batch` (validating) -> `add_requests` (all jobs in one transaction; on bad input the API
  moves the batch to `failed` with `errors` instead) -> `in_progress`;
* `advance_batch` after every finished job (the worker) and on reads (the API): recount, and once
  every job is finished `in_progress -> finalizing -> completed`, or `cancelling -> cancelled`;
* `cancel_batch`: `cancelling`, queued jobs cancelled at once, running ones asked to stop; finished
  results stay;
* expiry: once `expires_at` (created_at + completion_window) has passed, `advance_batch` cancels the
  queued jobs and asks the running ones to stop, and the batch ends `expired` with the finished
  results kept (`expire_due` sweeps for such batches);
* when the last request ends, the output and error files are written in OpenAI's format
  (`batch_files`) in the same transaction that completes the batch;
* `iter_batch_jobs` pages through the batch's jobs in request (line) order for the result exports.

**The batch row's lock** (`_locked_batch`, `refresh_request_counts`) is PostgreSQL's `FOR NO KEY
UPDATE`, not `FOR UPDATE`: these transactions change the batch's columns, never its id, and a plain
`FOR UPDATE` also blocks the `FOR KEY SHARE` lock that PostgreSQL's foreign-key check on `jobs.batch_id`
takes. That check runs on a job UPDATE whenever the job row was already written in the same
transaction (a worker's claim writes its job twice), so a cancel holding the batch and waiting for that
job deadlocked with the claim waiting for the batch (the cancel got a 500, found by
tests/test_openai_sdk.py; tests/test_storage.py::test_a_batch_cancel_never_deadlocks_with_claims).
Deleting a batch still takes `FOR UPDATE` (lifecycle.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.orm import Session

from ..contracts import PRIORITY_BATCH
from .db import write_transaction
from .errors import InputTooLarge
from .models import BATCH_STATUSES, BATCH_TERMINAL, JOB_TERMINAL, Batch, Job, JobInput, utcnow

#: allowed batch status transitions
BATCH_TRANSITIONS: dict[str, tuple[str, ...]] = {
    "validating": ("in_progress", "failed", "cancelling", "cancelled"),
    "in_progress": ("finalizing", "failed", "expired", "cancelling"),
    "finalizing": ("completed", "failed", "expired"),
    "cancelling": ("cancelled",),
    "completed": (),
    "failed": (),
    "expired": (),
    "cancelled": (),
}


def new_batch_id() -> str:
    """`batch_` + 24 hex digits."""
    return "batch_" + secrets.token_hex(12)


def create_batch(
    session: Session,
    *,
    tenant: str = "default",
    endpoint: str | None = None,
    completion_window: str | None = None,
    input_filename: str | None = None,
    params: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    expires_at: datetime | None = None,
    input_file_id: str | None = None,
) -> Batch:
    """Insert a batch in status `validating`; return it."""
    batch = Batch(
        id=new_batch_id(),
        tenant=tenant,
        status="validating",
        endpoint=endpoint,
        completion_window=completion_window,
        input_filename=input_filename,
        params=dict(params or {}),
        metadata_=dict(metadata) if metadata is not None else None,
        request_total=0,
        request_completed=0,
        request_failed=0,
        created_at=utcnow(),
        expires_at=expires_at,
        input_file_id=input_file_id,
    )
    try:
        session.add(batch)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return batch


def _batch_query(batch_id: str, tenant: str | None):
    q = select(Batch).where(Batch.id == batch_id)
    return q.where(Batch.tenant == tenant) if tenant is not None else q


def get_batch(session: Session, batch_id: str, tenant: str | None = None) -> Batch | None:
    """The batch, or None (another tenant's batch is None too)."""
    batch = session.scalars(_batch_query(batch_id, tenant).execution_options(populate_existing=True)).one_or_none()
    session.commit()
    return batch


def list_batches(
    session: Session,
    *,
    tenant: str | None = None,
    status: str | Iterable[str] | None = None,
    limit: int = 50,
    offset: int = 0,
    after: str | None = None,
) -> list[Batch]:
    """Batches, newest first; with `after` (a batch id), only those listed after it (OpenAI's cursor).
    The cursor is looked up with the page's tenant filter: another tenant's batch id is an unknown
    cursor (the first page)."""
    q = select(Batch)
    if tenant is not None:
        q = q.where(Batch.tenant == tenant)
    if status is not None:
        q = q.where(Batch.status.in_([status] if isinstance(status, str) else list(status)))
    if after is not None:
        mark = session.execute(_batch_query(batch_id=after, tenant=tenant).with_only_columns(
            Batch.created_at, Batch.id)).one_or_none()
        if mark is not None:
            q = q.where(or_(Batch.created_at < mark[0], and_(Batch.created_at == mark[0], Batch.id < mark[1])))
    q = q.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(max(0, limit)).offset(max(0, offset))
    batches = list(session.scalars(q.execution_options(populate_existing=True)))
    session.commit()
    return batches


def set_batch_status(session: Session, batch_id: str, status: str, *, errors: Any = None) -> bool:
    """Move the batch to `status` if BATCH_TRANSITIONS allows it from its current status, stamping
    `<status>_at` (and storing `errors` if given). False if not allowed or no such batch."""
    if status not in BATCH_STATUSES:
        raise ValueError(f"unknown batch status {status!r} (known: {', '.join(BATCH_STATUSES)})")
    allowed_from = [s for s, targets in BATCH_TRANSITIONS.items() if status in targets]
    values: dict[str, Any] = {"status": status, f"{status}_at": utcnow()}
    if errors is not None:
        values["errors"] = errors
    try:
        n = session.execute(
            update(Batch)
            .where(and_(Batch.id == batch_id, Batch.status.in_(allowed_from)))
            .values(**values)
            .execution_options(synchronize_session=False)
        ).rowcount
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n == 1


def refresh_request_counts(session: Session, batch_id: str) -> dict[str, int]:
    """Recompute request_counts from the batch's jobs (completed = succeeded; failed = failed or
    cancelled), store them, and return {"total", "completed", "failed"}."""
    try:
        write_transaction(session)
        # lock the batch row: concurrent recounts run one after the other, so the last one sees every
        # job committed before it (and no older count overwrites a newer one)
        session.execute(select(Batch.id).where(Batch.id == batch_id).with_for_update(key_share=True))
        total, completed, failed = session.execute(
            select(
                func.count(),
                func.coalesce(func.sum(case((Job.status == "succeeded", 1), else_=0)), 0),
                func.coalesce(func.sum(case((Job.status.in_(("failed", "cancelled")), 1), else_=0)), 0),
            ).where(Job.batch_id == batch_id)
        ).one()
        counts = {"total": int(total), "completed": int(completed), "failed": int(failed)}
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(request_total=counts["total"], request_completed=counts["completed"],
                    request_failed=counts["failed"])
            .execution_options(synchronize_session=False)
        )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return counts

# --- the service's batch life cycle ---------------------------------------------------------------------


@dataclass
class BatchRequest:
    """One request of a batch: a document and a question (a JSONL line or an uploaded file)."""

    custom_id: str
    text: str
    question: str = ""
    #: RunParams as a dict (already merged with the batch's defaults and checked by the caller)
    params: dict[str, Any] = field(default_factory=dict)
    filename: str | None = None
    #: job, chat (`messages`) or completion (`text` is the raw prompt): contracts.JOB_KINDS
    kind: str = "job"
    model: str | None = None
    messages: list[dict[str, str]] | None = None
    #: a stored document of the batch's tenant asked about instead of `text` (then "")
    document_id: str | None = None


def add_requests(
    session: Session,
    batch_id: str,
    requests: Sequence[BatchRequest],
    *,
    tenant: str = "default",
    max_attempts: int = 3,
    limit_bytes: int | None = None,
    queue: str | None = None,
) -> list[str]:
    """Insert one queued job (and its input) per request, all in ONE transaction; return the job ids
    in request order. Jobs get created_at one microsecond apart, so ordering by created_at keeps the
    line order. Raises InputTooLarge (nothing stored) for a document over the limit, and
    sqlalchemy.exc.IntegrityError for a custom_id repeated within the batch."""
    from .jobs import UnknownDocument, lock_documents, max_input_bytes, new_job_id

    limit = limit_bytes if limit_bytes is not None else max_input_bytes()
    base = utcnow()
    ids: list[str] = []
    try:
        # read under a share lock: a document deleted meanwhile is UnknownDocument, not an IntegrityError
        sizes = lock_documents(session, {r.document_id for r in requests if r.document_id}, tenant)
        rows_jobs, rows_inputs = [], []
        for i, r in enumerate(requests):
            if r.document_id:
                if r.document_id not in sizes:
                    raise UnknownDocument(r.document_id)
                size = sizes[r.document_id]
            else:
                size = len(r.text.encode("utf-8"))
            if size > limit:
                raise InputTooLarge(size, limit)
            job_id = new_job_id()
            ids.append(job_id)
            rows_jobs.append(Job(id=job_id, tenant=tenant, batch_id=batch_id, custom_id=r.custom_id, status="queued",
                                 kind=r.kind, model=r.model, priority=PRIORITY_BATCH, queue=queue,
                                 progress_done=0, progress_total=0, attempts=0, max_attempts=max_attempts,
                                 created_at=base + timedelta(microseconds=i),
                                 params={k: v for k, v in r.params.items() if k != "question"},
                                 cancel_requested=False))
            rows_inputs.append(JobInput(job_id=job_id, filename=r.filename, text=r.text, question=r.question or "",
                                        size_bytes=size, messages=r.messages, document_id=r.document_id))
        session.add_all(rows_jobs)
        session.flush()  # the job rows first: job_inputs references them
        session.add_all(rows_inputs)
        session.flush()
        session.execute(
            update(Batch).where(Batch.id == batch_id).values(request_total=len(ids))
            .execution_options(synchronize_session=False)
        )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return ids


def attach_input_file(session: Session, batch_id: str, *, filename: str, data: bytes) -> str:
    """Store `data` as the batch's input file (purpose `batch`, the batch's tenant, `batch_id` set so it
    is deleted with the batch's data) and set the batch's input_file_id, in the session's transaction,
    and commit. The native create calls it under the tenant's file lock (quotas.reserve_file_bytes)."""
    from .files import CHUNK_BYTES, add_file

    try:
        tenant = session.scalar(select(Batch.tenant).where(Batch.id == batch_id))
        row = add_file(session, tenant=tenant, purpose="batch", filename=filename, batch_id=batch_id,
                       chunks=(data[i:i + CHUNK_BYTES] for i in range(0, max(len(data), 1), CHUNK_BYTES)))
        session.execute(update(Batch).where(Batch.id == batch_id).values(input_file_id=row.id)
                        .execution_options(synchronize_session=False))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return row.id


def _locked_batch(session: Session, batch_id: str, tenant: str | None = None) -> Batch | None:
    """The batch row, locked for this transaction's update (FOR NO KEY UPDATE: module doc, "The batch row's lock")."""
    q = _batch_query(batch_id, tenant).with_for_update(key_share=True)
    return session.scalars(q.execution_options(populate_existing=True)).one_or_none()


def _recount(session: Session, batch_id: str) -> tuple[dict[str, int], int]:
    total, completed, failed, pending = session.execute(
        select(
            func.count(),
            func.coalesce(func.sum(case((Job.status == "succeeded", 1), else_=0)), 0),
            func.coalesce(func.sum(case((Job.status.in_(("failed", "cancelled")), 1), else_=0)), 0),
            func.coalesce(func.sum(case((Job.status.in_(JOB_TERMINAL), 0), else_=1)), 0),
        ).where(Job.batch_id == batch_id)
    ).one()
    return {"total": int(total), "completed": int(completed), "failed": int(failed)}, int(pending)


def advance_batch(session: Session, batch_id: str, tenant: str | None = None) -> Batch | None:
    """Recount the batch's requests and, once none is queued or running, finish it:
    `in_progress -> finalizing -> completed` (both stamped), or `cancelling -> cancelled`.
    Idempotent and safe to call from several processes at once (the batch row is locked).
    Returns the batch afterwards, or None if there is no such batch (for `tenant`)."""
    try:
        write_transaction(session)
        batch = _locked_batch(session, batch_id, tenant)
        if batch is None:
            session.rollback()
            return None
        if batch.status in ("in_progress", "finalizing", "cancelling"):
            now = utcnow()
            if (batch.status != "cancelling" and not batch.expire_requested and batch.expires_at is not None
                    and now >= batch.expires_at):
                _stop_jobs(session, batch_id, now, "the batch's completion window ended before this request ran")
                batch.expire_requested = True
            counts, pending = _recount(session, batch_id)
            batch.request_total = counts["total"]
            batch.request_completed = counts["completed"]
            batch.request_failed = counts["failed"]
            if pending == 0:
                from .batch_files import write_batch_files

                write_batch_files(session, batch)
                if batch.status == "cancelling":
                    batch.status, batch.cancelled_at = "cancelled", now
                elif batch.expire_requested:
                    batch.status, batch.expired_at = "expired", now
                else:
                    batch.finalizing_at = batch.finalizing_at or now
                    batch.status, batch.completed_at = "completed", now
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return batch


def cancel_batch(session: Session, batch_id: str, tenant: str | None = None) -> Batch | None:
    """Cancel a batch: `cancelling`, its queued jobs cancelled at once and its running jobs asked to
    stop (they stop at their next phase, window or token); then `cancelled` once none is running.
    Finished jobs and their results stay. A batch that already finished is returned unchanged (the
    caller tells "completed" from "cancelled"). None if there is no such batch (for `tenant`)."""
    try:
        write_transaction(session)
        batch = _locked_batch(session, batch_id, tenant)
        if batch is None:
            session.rollback()
            return None
        if batch.status in ("validating", "in_progress", "finalizing"):
            now = utcnow()
            batch.status, batch.cancelling_at = "cancelling", now
            _stop_jobs(session, batch_id, now, None)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return advance_batch(session, batch_id, tenant)


def _stop_jobs(session: Session, batch_id: str, now: datetime, message: str | None) -> None:
    """The batch's queued jobs cancelled (with `message`), its running ones asked to stop."""
    session.execute(
        update(Job).where(and_(Job.batch_id == batch_id, Job.status == "queued"))
        .values(status="cancelled", cancel_requested=True, finished_at=now, error=message)
        .execution_options(synchronize_session=False)
    )
    session.execute(
        update(Job).where(and_(Job.batch_id == batch_id, Job.status == "running"))
        .values(cancel_requested=True)
        .execution_options(synchronize_session=False)
    )


def expire_due(session: Session, limit: int = 100) -> list[str]:
    """Move on every unfinished batch whose completion window has ended (advance_batch expires it); the
    ids of those now `expired`. The reconciler's sweeps and the API's lists call it."""
    ids = list(session.scalars(select(Batch.id).where(and_(
        Batch.status.in_(("in_progress", "finalizing")), Batch.expires_at.is_not(None),
        Batch.expires_at <= utcnow())).limit(limit)))
    session.commit()
    done = []
    for batch_id in ids:
        batch = advance_batch(session, batch_id)
        if batch is not None and batch.status == "expired":
            done.append(batch_id)
    return done


def find_batches(session: Session, name: str, *, tenant: str | None = None, limit: int = 50) -> list[Batch]:
    """Batches whose metadata `name` is `name` (`specq submit --batch NAME`), newest first."""
    named = Batch.metadata_["name"].as_string()
    if session.get_bind().dialect.name == "sqlite":
        # SQLite's JSON functions fail the whole query on one malformed value (NaN that older code
        # stored, nesting past 1,000 levels): such rows are skipped (CASE evaluates in order)
        named = case((func.json_valid(Batch.metadata_) == 1, named), else_=None)
    q = select(Batch).where(named == name)
    if tenant is not None:
        q = q.where(Batch.tenant == tenant)
    q = q.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(max(0, limit))
    rows = list(session.scalars(q.execution_options(populate_existing=True)))
    session.commit()
    return rows


def iter_batch_jobs(
    session: Session, batch_id: str, *, status: str | Iterable[str] | None = None, page: int = 200
) -> Iterator[list[tuple[Job, str | None]]]:
    """Pages of (job, input filename) of the batch in request order, filtered by status.

    Keyset pagination on (created_at, id): each page is its own short query (and transaction), so a
    long export never holds a transaction open."""
    statuses = None if status is None else ([status] if isinstance(status, str) else list(status))
    after: tuple[datetime, str] | None = None
    while True:
        q = (select(Job, JobInput.filename).outerjoin(JobInput, JobInput.job_id == Job.id)
             .where(Job.batch_id == batch_id))
        if statuses is not None:
            q = q.where(Job.status.in_(statuses))
        if after is not None:
            q = q.where(or_(Job.created_at > after[0], and_(Job.created_at == after[0], Job.id > after[1])))
        q = q.order_by(Job.created_at, Job.id).limit(page)
        rows = [(job, filename) for job, filename in session.execute(q.execution_options(populate_existing=True))]
        session.commit()
        if not rows:
            return
        yield rows
        if len(rows) < page:
            return
        last = rows[-1][0]
        after = (last.created_at, last.id)


def is_finished(batch: Batch) -> bool:
    return batch.status in BATCH_TERMINAL


__all__ = [
    "BATCH_TRANSITIONS",
    "new_batch_id",
    "create_batch",
    "get_batch",
    "list_batches",
    "set_batch_status",
    "refresh_request_counts",
    "BatchRequest",
    "add_requests",
    "attach_input_file",
    "advance_batch",
    "cancel_batch",
    "expire_due",
    "find_batches",
    "iter_batch_jobs",
    "is_finished",
]
