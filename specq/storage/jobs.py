"""Jobs: create, read, list, and move through their states.

    queued --mark_running--> running --save_result--> succeeded
      |                        |  \\--mark_failed---> failed
      |                        |   \\-requeue------> queued (retry; attempts < max_attempts)
      \\--request_cancel--> cancelled <--mark_cancelled (after request_cancel set cancel_requested)

Every function takes a Session first and is one transaction: it commits (or rolls back) before it
returns, so a session can be reused across calls and reads always see fresh rows. State changes are
conditional UPDATEs (`... WHERE status = 'queued'`), so two workers, or a worker and the API, cannot
both win the same transition.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, false, func, or_, select, update
from sqlalchemy.orm import Session

from ..contracts import PRIORITY_INTERACTIVE
from . import stale
from .db import write_transaction
from .errors import InputTooLarge
from .models import Document, Job, JobInput, utcnow

#: default cap on a document's UTF-8 size; SPECQ_MAX_INPUT_BYTES overrides it
DEFAULT_MAX_INPUT_BYTES = 8 * 1024 * 1024
#: error messages longer than this are cut
MAX_ERROR_CHARS = 4000
#: a running job whose heartbeat is older than this may be claimed again (its worker is gone)
DEFAULT_STALE_AFTER_S = 600.0


def max_input_bytes() -> int:
    """The document size limit in bytes: SPECQ_MAX_INPUT_BYTES, default 8 MiB."""
    raw = os.environ.get("SPECQ_MAX_INPUT_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_INPUT_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"SPECQ_MAX_INPUT_BYTES must be a whole number of bytes, not {raw!r}") from None
    if value <= 0:
        raise ValueError("SPECQ_MAX_INPUT_BYTES must be > 0")
    return value


def new_job_id() -> str:
    """A short unique id: `job_` + 24 hex digits (96 random bits)."""
    return "job_" + secrets.token_hex(12)


def _params_dict(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if hasattr(params, "to_dict"):
        return dict(params.to_dict())
    if isinstance(params, Mapping):
        return dict(params)
    raise TypeError(f"params must be a RunParams, a mapping or None, not {type(params).__name__}")


def _clip(message: str | None) -> str | None:
    if message is None:
        return None
    message = str(message)
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 1] + "…"


def create_job(
    session: Session,
    *,
    text: str,
    params: Any = None,
    question: str | None = None,
    filename: str | None = None,
    tenant: str = "default",
    batch_id: str | None = None,
    custom_id: str | None = None,
    max_attempts: int = 3,
    limit_bytes: int | None = None,
    kind: str = "job",
    model: str | None = None,
    messages: list[dict[str, str]] | None = None,
    priority: int | None = None,
    queue: str | None = None,
    document_id: str | None = None,
) -> Job:
    """Insert a queued job and its input; return the Job.

    `kind` "chat" stores `messages` (the text is then ""), "completion" a raw prompt as `text`.
    `priority` defaults to interactive (batch requests: contracts.PRIORITY_BATCH); `queue` is the
    broker queue it is sent to.

    `params` is a RunParams or its dict (stored as given, less its `question`, which job_inputs holds).
    `question` defaults to params' `question`.
    Raises InputTooLarge when `text` is over `limit_bytes` (default `max_input_bytes()`), and
    sqlalchemy.exc.IntegrityError for an unknown batch_id or a custom_id repeated within a batch.
    `document_id`: the job asks about that stored document (storage.documents) of the same tenant
    instead of `text` (which must then be ""); UnknownDocument if the tenant has no such document.
    """
    limit = limit_bytes if limit_bytes is not None else max_input_bytes()
    size = len(text.encode("utf-8"))
    if document_id is not None:
        from .documents import get_document

        if text:
            raise ValueError("give text or document_id, not both")
        doc = get_document(session, document_id, tenant=tenant)
        if doc is None:
            raise UnknownDocument(document_id)
        size = doc.size_bytes
    if size > limit:
        raise InputTooLarge(size, limit)
    if messages is not None:
        chat_size = sum(len(m.get("content", "").encode("utf-8")) for m in messages)
        if chat_size > limit:
            raise InputTooLarge(chat_size, limit)
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")
    p = _params_dict(params)
    if question is None:
        question = str(p.get("question") or "")
    p.pop("question", None)  # stored once, in job_inputs (it can be 64 KiB; lists return params)
    job = Job(
        id=new_job_id(),
        tenant=tenant,
        batch_id=batch_id,
        custom_id=custom_id,
        kind=kind,
        model=model,
        priority=PRIORITY_INTERACTIVE if priority is None else priority,
        queue=queue,
        status="queued",
        progress_done=0,
        progress_total=0,
        attempts=0,
        max_attempts=max_attempts,
        created_at=utcnow(),
        params=p,
        cancel_requested=False,
    )
    try:
        session.add(job)
        session.flush()  # the job row first: job_inputs references it
        session.add(JobInput(job_id=job.id, filename=filename, text=text, question=question, size_bytes=size,
                             messages=messages, document_id=document_id))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return job


def _job_query(job_id: str, tenant: str | None):
    q = select(Job).where(Job.id == job_id)
    if tenant is not None:
        q = q.where(Job.tenant == tenant)
    return q.execution_options(populate_existing=True)


def get_job(session: Session, job_id: str, tenant: str | None = None) -> Job | None:
    """The job, or None. With `tenant`, another tenant's job is None too (as if it did not exist)."""
    job = session.scalars(_job_query(job_id, tenant)).one_or_none()
    session.commit()
    return job


def get_input(session: Session, job_id: str, tenant: str | None = None) -> JobInput | None:
    """The job's document and question, or None (tenant-filtered like get_job). A job that references a
    stored document gets that document's text as `text` (the row is then detached from the session,
    so the text is never written back into job_inputs)."""
    q = select(JobInput, Document.text).join(Job, Job.id == JobInput.job_id).outerjoin(
        Document, and_(Document.id == JobInput.document_id, Document.tenant == Job.tenant)).where(JobInput.job_id == job_id)
    if tenant is not None:
        q = q.where(Job.tenant == tenant)
    got = session.execute(q.execution_options(populate_existing=True)).one_or_none()
    session.commit()
    if got is None:
        return None
    row, doc_text = got
    if row.document_id is not None and doc_text is not None and not row.text:
        session.expunge(row)
        row.text = doc_text
    return row


class UnknownDocument(LookupError):
    """A job named a document_id its tenant does not have."""

    def __init__(self, document_id: str) -> None:
        super().__init__(f"no document {document_id}")
        self.document_id = document_id


def _filtered(q, status: str | Iterable[str] | None, tenant: str | None, batch_id: str | None):
    if status is not None:
        statuses = [status] if isinstance(status, str) else list(status)
        q = q.where(Job.status.in_(statuses))
    if tenant is not None:
        q = q.where(Job.tenant == tenant)
    if batch_id is not None:
        q = q.where(Job.batch_id == batch_id)
    return q


def list_jobs(
    session: Session,
    *,
    status: str | Iterable[str] | None = None,
    tenant: str | None = None,
    batch_id: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[Job]:
    """Jobs, newest first, filtered by status (one or several), tenant and batch."""
    q = _filtered(select(Job), status, tenant, batch_id)
    q = q.order_by(Job.created_at.desc(), Job.id.desc()).limit(max(0, limit)).offset(max(0, offset))
    jobs = list(session.scalars(q.execution_options(populate_existing=True)))
    session.commit()
    return jobs


def count_jobs(
    session: Session,
    *,
    status: str | Iterable[str] | None = None,
    tenant: str | None = None,
    batch_id: str | None = None,
) -> int:
    """How many jobs list_jobs would return without limit/offset."""
    n = session.scalar(_filtered(select(func.count()).select_from(Job), status, tenant, batch_id)) or 0
    session.commit()
    return int(n)


def _set(session: Session, where: Any, **values: Any) -> int:
    result = session.execute(update(Job).where(where).values(**values).execution_options(synchronize_session=False))
    return result.rowcount


def mark_running(
    session: Session, job_id: str, worker: str, *, stale_after_s: float | None = DEFAULT_STALE_AFTER_S,
    only_stale: bool = False,
) -> bool:
    """Claim the job for `worker`; False if it is not runnable (so the caller must do nothing).

    Runnable: queued, or running with a heartbeat older than `stale_after_s` (its worker died and the
    broker redelivered it; None turns that off) and attempts left and no cancel requested. Succeeded,
    failed and cancelled jobs are never claimed. On success: status running, attempts + 1,
    started_at/heartbeat_at now, progress reset, and queue_wait_ms (submission to first claim) set
    once.
    """
    now = utcnow()
    runnable = Job.status == "queued"
    if only_stale:
        runnable = false()
    if stale_after_s is not None:
        runnable = or_(
            runnable,
            and_(
                stale.stale_running(now - timedelta(seconds=stale_after_s)),
                Job.attempts < Job.max_attempts,
                Job.cancel_requested == false(),
            ),
        )
    try:
        write_transaction(session)
        claimed = _set(
            session,
            and_(Job.id == job_id, runnable),
            status="running",
            attempts=Job.attempts + 1,
            started_at=now,
            heartbeat_at=now,
            worker=worker,
            progress_phase=None,
            progress_done=0,
            progress_total=0,
            not_before=None,
        )
        if claimed != 1:
            session.rollback()
            return False
        created_at = session.scalar(select(Job.created_at).where(Job.id == job_id))
        wait_ms = max(0.0, (now - created_at).total_seconds() * 1000.0) if created_at else 0.0
        _set(session, and_(Job.id == job_id, Job.queue_wait_ms.is_(None)), queue_wait_ms=round(wait_ms, 3))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return True


def update_progress(session: Session, job_id: str, phase: str, done: int = 0, total: int = 0) -> bool:
    """Record progress of a running job (and bump its heartbeat); False if it is not running."""
    try:
        n = _set(
            session,
            and_(Job.id == job_id, Job.status == "running"),
            progress_phase=phase,
            progress_done=int(done),
            progress_total=int(total),
            heartbeat_at=utcnow(),
        )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n == 1


def heartbeat(session: Session, job_id: str) -> bool:
    """Bump a running job's heartbeat; False if it is not running."""
    try:
        n = _set(session, and_(Job.id == job_id, Job.status == "running"), heartbeat_at=utcnow())
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n == 1


def request_cancel(session: Session, job_id: str, tenant: str | None = None) -> Job | None:
    """Cancel a job: queued -> cancelled now; running -> cancel_requested=True (the worker stops it).

    Finished jobs are left as they are. Returns the job afterwards, or None if there is no such job
    (for `tenant`).
    """
    where = Job.id == job_id if tenant is None else and_(Job.id == job_id, Job.tenant == tenant)
    try:
        write_transaction(session)
        n = _set(session, and_(where, Job.status == "queued"), status="cancelled", cancel_requested=True,
                 finished_at=utcnow())
        if n == 0:
            _set(session, and_(where, Job.status == "running"), cancel_requested=True)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return get_job(session, job_id, tenant)


def is_cancel_requested(session: Session, job_id: str) -> bool:
    """True if the job should stop: cancel requested, already cancelled, or gone."""
    row = session.execute(select(Job.cancel_requested, Job.status).where(Job.id == job_id)).one_or_none()
    session.commit()
    if row is None:
        return True
    return bool(row.cancel_requested) or row.status == "cancelled"


def mark_cancelled(session: Session, job_id: str, message: str | None = None) -> bool:
    """A queued or running job -> cancelled (the worker honoured a cancel request); False otherwise."""
    try:
        n = _set(
            session,
            and_(Job.id == job_id, Job.status.in_(("queued", "running"))),
            status="cancelled",
            cancel_requested=True,
            finished_at=utcnow(),
            error=_clip(message),
        )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n == 1


def mark_failed(session: Session, job_id: str, message: str) -> bool:
    """A queued or running job -> failed with `message`; False if it already finished (or is missing)."""
    try:
        n = _set(
            session,
            and_(Job.id == job_id, Job.status.in_(("queued", "running"))),
            status="failed",
            error=_clip(message),
            finished_at=utcnow(),
        )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n == 1


def requeue(session: Session, job_id: str, message: str | None = None, *, delay_s: float = 0.0) -> bool:
    """A running job -> queued for another attempt, keeping `message` as its last error; other
    deliveries do not claim it for `delay_s` seconds (its backoff; its own retry message may).

    False (nothing changed) when the job is not running, has used all its attempts, or has a
    cancel request; the caller then marks it failed or cancelled.
    """
    try:
        n = _set(
            session,
            and_(
                Job.id == job_id,
                Job.status == "running",
                Job.attempts < Job.max_attempts,
                Job.cancel_requested == false(),
            ),
            status="queued",
            worker=None,
            heartbeat_at=None,
            progress_phase=None,
            progress_done=0,
            progress_total=0,
            error=_clip(message),
            not_before=utcnow() + timedelta(seconds=delay_s) if delay_s > 0 else None,
        )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n == 1


__all__ = [
    "DEFAULT_MAX_INPUT_BYTES",
    "DEFAULT_STALE_AFTER_S",
    "max_input_bytes",
    "new_job_id",
    "create_job",
    "get_job",
    "get_input",
    "list_jobs",
    "count_jobs",
    "mark_running",
    "update_progress",
    "heartbeat",
    "request_cancel",
    "is_cancel_requested",
    "mark_cancelled",
    "mark_failed",
    "requeue",
]
