"""Documents: a text stored once and asked about by many jobs (POST /v1/documents).

A document is a `documents` row: id `doc_` + 24 hex digits, tenant, sha256 of its UTF-8 text, name,
text, size. One tenant's same text is one document (`put_document` returns the existing row, unique
on (tenant, sha256)); reads are filtered by tenant like jobs, so another tenant's document is None
and no two tenants ever share one. Jobs reference it through `job_inputs.document_id` instead of
storing the text again (storage.jobs.create_job / get_input).
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import and_, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .db import write_transaction
from .errors import InputTooLarge
from .limits import max_input_bytes
from .models import Document, Job, JobInput, JOB_TERMINAL, utcnow


def new_document_id() -> str:
    return "doc_" + secrets.token_hex(12)


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class DocumentInUse(Exception):
    """A queued or running job still asks about the document."""


def put_document(session: Session, *, tenant: str, text: str, filename: str | None = None,
                 limit_bytes: int | None = None) -> tuple[Document, bool]:
    """Store `text` for `tenant`, or find the tenant's document with the same text: (row, created).

    Raises InputTooLarge over `limit_bytes` (default SPECQ_MAX_INPUT_BYTES, as for job documents)."""
    limit = limit_bytes if limit_bytes is not None else max_input_bytes()
    size = len(text.encode("utf-8"))
    if size > limit:
        raise InputTooLarge(size, limit)
    digest = text_sha256(text)
    found = find_by_hash(session, tenant, digest)
    if found is not None:
        return found, False
    row = Document(id=new_document_id(), tenant=tenant, sha256=digest, filename=filename, text=text,
                   size_bytes=size, created_at=utcnow())
    try:
        session.add(row)
        session.commit()
    except IntegrityError:  # the same text stored at the same moment by another request: that one wins
        session.rollback()
        found = find_by_hash(session, tenant, digest)
        if found is None:
            raise
        return found, False
    except BaseException:
        session.rollback()
        raise
    return row, True


def find_by_hash(session: Session, tenant: str, digest: str) -> Document | None:
    row = session.scalars(select(Document).where(and_(Document.tenant == tenant, Document.sha256 == digest))
                          .execution_options(populate_existing=True)).one_or_none()
    session.commit()
    return row


def get_document(session: Session, document_id: str, tenant: str | None = None) -> Document | None:
    """The document, or None; with `tenant`, another tenant's document is None too."""
    q = select(Document).where(Document.id == document_id)
    if tenant is not None:
        q = q.where(Document.tenant == tenant)
    row = session.scalars(q.execution_options(populate_existing=True)).one_or_none()
    session.commit()
    return row


def list_documents(session: Session, tenant: str | None = None, *, limit: int = 50, offset: int = 0) -> list[Document]:
    q = select(Document)
    if tenant is not None:
        q = q.where(Document.tenant == tenant)
    rows = list(session.scalars(q.order_by(Document.created_at.desc(), Document.id).limit(limit).offset(offset)))
    session.commit()
    return rows


def jobs_using(session: Session, document_id: str, *, unfinished: bool = False) -> int:
    q = select(func.count()).select_from(JobInput).join(Job, Job.id == JobInput.job_id).where(
        JobInput.document_id == document_id)
    if unfinished:
        q = q.where(Job.status.not_in(JOB_TERMINAL))
    n = int(session.scalar(q) or 0)
    session.commit()
    return n


def delete_document(session: Session, document_id: str, tenant: str | None = None) -> bool | None:
    """Delete the document (None: no such document of `tenant`). Raises DocumentInUse while a queued
    or running job asks about it; finished jobs keep their rows with document_id NULL (text empty)."""
    try:
        # a writer from the start (SQLite: BEGIN IMMEDIATE): a deferred read that then writes fails with
        # "database is locked" when another writer committed in between (it cannot wait for the lock)
        write_transaction(session)
        q = select(Document).where(Document.id == document_id)
        if tenant is not None:
            q = q.where(Document.tenant == tenant)
        row = session.scalars(q.with_for_update()).one_or_none()
        if row is None:
            session.rollback()
            return None
        busy = session.scalar(select(func.count()).select_from(JobInput).join(Job, Job.id == JobInput.job_id).where(
            and_(JobInput.document_id == document_id, Job.status.not_in(JOB_TERMINAL))))
        if busy:
            session.rollback()
            raise DocumentInUse(f"document {document_id} is asked about by {busy} queued or running job(s): "
                                "cancel them or wait until they finish")
        # explicit, not only ON DELETE SET NULL: SQLite enforces foreign keys only with its pragma on
        session.execute(update(JobInput).where(JobInput.document_id == document_id).values(document_id=None))
        session.delete(row)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return True


__all__ = ["put_document", "get_document", "find_by_hash", "list_documents", "delete_document", "jobs_using",
           "DocumentInUse", "new_document_id", "text_sha256"]
