"""Jobs: create, read, list, and move through their states.

    queued --mark_running--> running --save_result--> succeeded
      |                        |  \\--mark_failed---> failed
      |                        |   \\-requeue------> queued (retry; attempts < max_attempts)
      \\--request_cancel--> cancelled <--mark_cancelled (after request_cancel set cancel_requested)

Every function takes a Session first and is one transaction: it commits (or rolls back) before it
returns, so a session can be reused across calls and reads always see fresh rows. State changes are
conditional UPDATEs (`... WHERE status = 'queued'`), so two workers, or a worker and the API, cannot
both win the same transition.

**Fencing.** A claim (`mark_running`, `claims.reclaim_own`) writes a new random `attempt_token` and
returns it; so does every transition the reconciler makes on a stale job (`stale`). Every write a
worker makes about its job afterwards — `heartbeat`, `update_progress`, `results.save_result`,
`mark_failed`, `mark_cancelled`, `requeue`, `deltas.append` — takes that token and is one UPDATE
`WHERE id = :id AND attempt_token = :token AND status = 'running'`. When it matches no row, the job
was requeued, failed or cancelled by the reconciler, or claimed by another worker, since this claim:
the function raises `contracts.Fenced` and changes nothing, and the worker stops its run (docs/
reliability.md). The UPDATE takes the row's lock, so a takeover and a fenced write are ordered: one
of them sees the other's token. A worker's own final transitions keep its token on the row, so a
write repeated after a lost commit acknowledgement (`storage.retry`) recognises itself and is not
fenced.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, false, func, or_, select, update
from sqlalchemy.orm import Session

from ..contracts import PRIORITY_INTERACTIVE, Fenced
from . import stale
from .db import write_transaction
from .errors import InputTooLarge
from .limits import max_input_bytes
from .models import Batch, Document, Job, JobInput, new_token, utcnow

#: error messages longer than this are cut
MAX_ERROR_CHARS = 4000
#: a running job whose heartbeat is older than this may be claimed again (its worker is gone)
DEFAULT_STALE_AFTER_S = 600.0


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
    The document is read under a share lock in the transaction that inserts the job (`lock_documents`),
    so a concurrent delete either comes first (UnknownDocument) or waits and finds the job (409).
    """
    limit = limit_bytes if limit_bytes is not None else max_input_bytes()
    size = len(text.encode("utf-8"))
    if document_id is not None:
        if text:
            raise ValueError("give text or document_id, not both")
        try:
            sizes = lock_documents(session, {document_id}, tenant)
        except BaseException:
            session.rollback()
            raise
        if document_id not in sizes:
            session.rollback()
            raise UnknownDocument(document_id)
        size = sizes[document_id]
    if size > limit:
        session.rollback()
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


def get_jobs(session: Session, job_ids: Iterable[str], chunk: int = 500) -> dict[str, Job]:
    """{id: job} for those of `job_ids` that exist, in one query per `chunk` ids (the API's event
    streams read every followed job's row together)."""
    ids = list(dict.fromkeys(job_ids))
    out: dict[str, Job] = {}
    for i in range(0, len(ids), chunk):
        q = select(Job).where(Job.id.in_(ids[i:i + chunk])).execution_options(populate_existing=True)
        out.update((j.id, j) for j in session.scalars(q))
    session.commit()
    return out


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


def lock_documents(session: Session, document_ids: Iterable[str], tenant: str) -> dict[str, int]:
    """{id: size_bytes} of those of `document_ids` that `tenant` has, read in a write transaction
    (begun here if none is open; SQLite: BEGIN IMMEDIATE) under a share lock (PostgreSQL: FOR KEY
    SHARE) that `documents.delete_document`'s FOR UPDATE waits for. The caller inserts the jobs that
    name them in the same transaction: checked-then-deleted documents were an IntegrityError (500)
    on PostgreSQL, and a deferred SQLite read-then-write a "database is locked" (docs/reliability.md)."""
    wanted = set(document_ids)
    if not wanted:
        return {}
    write_transaction(session)
    q = (select(Document.id, Document.size_bytes).where(Document.id.in_(wanted), Document.tenant == tenant)
         .with_for_update(read=True, key_share=True))
    return {doc_id: int(size) for doc_id, size in session.execute(q)}


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
    q = list_query(status=status, tenant=tenant, batch_id=batch_id, limit=limit, offset=offset)
    jobs = list(session.scalars(q.execution_options(populate_existing=True)))
    session.commit()
    return jobs


def list_query(*, status: str | Iterable[str] | None = None, tenant: str | None = None,
               batch_id: str | None = None, limit: int = 50, offset: int = 0):
    """The SELECT of `list_jobs`: ordered by (created_at, id) descending, the order of the jobs index
    ix_jobs_created_at_id, so an unfiltered page is read off that index instead of sorting every job
    (tests/test_hardening_service.py::test_the_job_list_reads_a_page_off_its_index)."""
    q = _filtered(select(Job), status, tenant, batch_id)
    return q.order_by(Job.created_at.desc(), Job.id.desc()).limit(max(0, limit)).offset(max(0, offset))


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


#: list rows carry the first this many characters of a job's question (whole: GET /v1/jobs/{id})
QUESTION_PREVIEW_CHARS = 120


def list_labels(session: Session, job_ids: Iterable[str]) -> dict[str, dict[str, str | None]]:
    """{job_id: {filename, question, batch_name}} for the jobs of a list page, in one query whatever
    the page's size: the document's file name (the job's own, else its stored document's), the
    question's first QUESTION_PREVIEW_CHARS characters ("…" after a cut; only they are read, not
    a 64 KiB question) and its batch's `metadata.name`. A job without an input row is left out."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return {}
    n = QUESTION_PREVIEW_CHARS
    q = (select(JobInput.job_id, JobInput.filename, Document.filename, func.substr(JobInput.question, 1, n + 1),
                Batch.metadata_)
         .join(Job, Job.id == JobInput.job_id)
         .outerjoin(Document, and_(Document.id == JobInput.document_id, Document.tenant == Job.tenant))
         .outerjoin(Batch, Batch.id == Job.batch_id)
         .where(JobInput.job_id.in_(ids)))
    out: dict[str, dict[str, str | None]] = {}
    for job_id, own_name, doc_name, question, meta in session.execute(q):
        question = question or ""
        name = meta.get("name") if isinstance(meta, dict) else None
        out[job_id] = {"filename": own_name or doc_name,
                       "question": question if len(question) <= n else question[: n - 1] + "…",
                       "batch_name": name if isinstance(name, str) and name else None}
    session.commit()
    return out


def _set(session: Session, where: Any, **values: Any) -> int:
    result = session.execute(update(Job).where(where).values(**values).execution_options(synchronize_session=False))
    return result.rowcount


def owned(job_id: str, token: str):
    """SQL condition: the job is still running under the attempt holding `token` (module doc)."""
    return and_(Job.id == job_id, Job.attempt_token == token, Job.status == "running")


def check_owned(session: Session, job_id: str, token: str, *, done: str | None = None) -> bool:
    """After a fenced UPDATE matched no row (the caller rolled back): True if the job is still this
    attempt's and running (the UPDATE's extra condition did not hold), False if `done` is set and the
    row shows this attempt already made that transition (a repeated write); raises Fenced otherwise."""
    row = session.execute(select(Job.status, Job.attempt_token).where(Job.id == job_id)).one_or_none()
    session.commit()
    if row is not None and token is not None and row.attempt_token == token:
        if row.status == "running":
            return True
        if done is not None and row.status == done:
            return False
    state = "missing" if row is None else (f"{row.status}, another attempt's" if row.attempt_token != token
                                           else row.status)
    raise Fenced(f"job {job_id}: this worker's claim is no longer current (job {state}); its write was refused")


def _fenced_set(session: Session, job_id: str, token: str, *, extra: Any = None, done: str | None = None,
                **values: Any) -> bool:
    """One fenced UPDATE (module doc): True if it changed the row; False if `done` and this attempt had
    already made it, or if the job is still this attempt's but `extra` did not hold; Fenced otherwise."""
    where = owned(job_id, token) if extra is None else and_(owned(job_id, token), extra)
    try:
        write_transaction(session)
        n = _set(session, where, **values)
        if n == 1:
            session.commit()
            return True
        session.rollback()
    except BaseException:
        session.rollback()
        raise
    check_owned(session, job_id, token, done=done)
    return False


def mark_running(
    session: Session, job_id: str, worker: str, *, stale_after_s: float | None = DEFAULT_STALE_AFTER_S,
    only_stale: bool = False,
) -> str | None:
    """Claim the job for `worker`: its new attempt token (module doc, "Fencing"), or None if it is not
    runnable (so the caller must do nothing).

    Runnable: queued, or running with a heartbeat older than `stale_after_s` (its worker died and the
    broker redelivered it; None turns that off) and attempts left and no cancel requested. Succeeded,
    failed and cancelled jobs are never claimed. On success: status running, attempts + 1,
    started_at/heartbeat_at now, progress reset, a new attempt_token (any earlier holder's writes are
    refused from now on), and queue_wait_ms (submission to first claim) set once.
    """
    now = utcnow()
    token = new_token()
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
            attempt_token=token,
            progress_phase=None,
            progress_done=0,
            progress_total=0,
            not_before=None,
        )
        if claimed != 1:
            session.rollback()
            return None
        created_at = session.scalar(select(Job.created_at).where(Job.id == job_id))
        wait_ms = max(0.0, (now - created_at).total_seconds() * 1000.0) if created_at else 0.0
        _set(session, and_(Job.id == job_id, Job.queue_wait_ms.is_(None)), queue_wait_ms=round(wait_ms, 3))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return token


def update_progress(session: Session, job_id: str, phase: str, done: int = 0, total: int = 0, *,
                    token: str) -> bool:
    """Record progress of the attempt holding `token` (and bump its heartbeat): True, or raises
    Fenced (the job is no longer running under that token; nothing changed)."""
    return _fenced_set(session, job_id, token, progress_phase=phase, progress_done=int(done),
                       progress_total=int(total), heartbeat_at=utcnow())


def heartbeat(session: Session, job_id: str, *, token: str) -> bool:
    """Bump the heartbeat of the attempt holding `token`: True, or raises Fenced."""
    return _fenced_set(session, job_id, token, heartbeat_at=utcnow())


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


def mark_cancelled(session: Session, job_id: str, message: str | None = None, *, token: str) -> bool:
    """The attempt holding `token` honoured a cancel request: running -> cancelled. True; False if this
    attempt had already done so (a repeated write); raises Fenced if the job is no longer its."""
    return _fenced_set(session, job_id, token, done="cancelled", status="cancelled", cancel_requested=True,
                       finished_at=utcnow(), error=_clip(message))


def mark_failed(session: Session, job_id: str, message: str, *, token: str | None = None) -> bool:
    """The job -> failed with `message`.

    With `token` (a worker): the attempt holding it fails its running job; True, False if this attempt
    had already failed it (a repeated write), Fenced if the job is no longer its. Without (the API, when
    the broker refused a new job's message): a queued job only; False if it is not queued (a worker
    may have claimed it: its attempt decides).
    """
    if token is not None:
        return _fenced_set(session, job_id, token, done="failed", status="failed", error=_clip(message),
                           finished_at=utcnow())
    try:
        n = _set(
            session,
            and_(Job.id == job_id, Job.status == "queued"),
            status="failed",
            error=_clip(message),
            finished_at=utcnow(),
        )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n == 1


def requeue(session: Session, job_id: str, message: str | None = None, *, token: str, delay_s: float = 0.0) -> bool:
    """The attempt holding `token` gives its running job back: queued for another attempt, keeping
    `message` as its last error; other deliveries do not claim it for `delay_s` seconds (its backoff;
    its own retry message may). True also when this attempt had already requeued it (a repeated write).

    False (nothing changed) when the job has used all its attempts or has a cancel request; the
    caller then marks it failed or cancelled. Raises Fenced if the job is no longer this attempt's.
    """
    changed = _fenced_set(
        session, job_id, token,
        extra=and_(Job.attempts < Job.max_attempts, Job.cancel_requested == false()),
        done="queued",
        status="queued",
        worker=None,
        heartbeat_at=None,
        progress_phase=None,
        progress_done=0,
        progress_total=0,
        error=_clip(message),
        not_before=utcnow() + timedelta(seconds=delay_s) if delay_s > 0 else None,
    )
    if changed:
        return True
    # no row changed: either the extra condition failed (still ours, running) or it was requeued already
    return get_status_token(session, job_id) == ("queued", token)


def get_status_token(session: Session, job_id: str) -> tuple[str, str | None] | None:
    """(status, attempt_token) of the job, or None."""
    row = session.execute(select(Job.status, Job.attempt_token).where(Job.id == job_id)).one_or_none()
    session.commit()
    return None if row is None else (row.status, row.attempt_token)


__all__ = [
    "DEFAULT_STALE_AFTER_S",
    "new_job_id",
    "create_job",
    "get_job",
    "get_jobs",
    "get_input",
    "list_labels",
    "QUESTION_PREVIEW_CHARS",
    "list_jobs",
    "lock_documents",
    "UnknownDocument",
    "list_query",
    "count_jobs",
    "mark_running",
    "new_token",
    "owned",
    "check_owned",
    "get_status_token",
    "update_progress",
    "heartbeat",
    "request_cancel",
    "is_cancel_requested",
    "mark_cancelled",
    "mark_failed",
    "requeue",
]
