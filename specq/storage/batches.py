"""Batches (OpenAI Batch API-like): a batch owns jobs (jobs.batch_id) and moves through

    validating -> in_progress -> finalizing -> completed
         \\            \\             \\-> failed / expired
          \\-> failed    \\-> cancelling -> cancelled

Each transition stamps its `<status>_at` column. `request_counts` (total/completed/failed) are
recomputed from the batch's jobs by `refresh_request_counts`. Same conventions as jobs.py: a Session
first, one transaction per call.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, func, select, update
from sqlalchemy.orm import Session

from .db import write_transaction
from .models import BATCH_STATUSES, Batch, Job, utcnow

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
    )
    try:
        session.add(batch)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return batch


def get_batch(session: Session, batch_id: str, tenant: str | None = None) -> Batch | None:
    """The batch, or None (another tenant's batch is None too)."""
    q = select(Batch).where(Batch.id == batch_id)
    if tenant is not None:
        q = q.where(Batch.tenant == tenant)
    batch = session.scalars(q.execution_options(populate_existing=True)).one_or_none()
    session.commit()
    return batch


def list_batches(
    session: Session,
    *,
    tenant: str | None = None,
    status: str | Iterable[str] | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[Batch]:
    """Batches, newest first."""
    q = select(Batch)
    if tenant is not None:
        q = q.where(Batch.tenant == tenant)
    if status is not None:
        q = q.where(Batch.status.in_([status] if isinstance(status, str) else list(status)))
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


__all__ = [
    "BATCH_TRANSITIONS",
    "new_batch_id",
    "create_batch",
    "get_batch",
    "list_batches",
    "set_batch_status",
    "refresh_request_counts",
]
