"""Per-tenant limits checked inside the write transaction that adds jobs.

`reserve_queued` counts the tenant's unfinished (queued or running) jobs under a per-tenant lock
(PostgreSQL: a transaction-level advisory lock; SQLite: the write lock of BEGIN IMMEDIATE), so two
API processes submitting at once cannot both slip under the limit. The caller inserts its jobs in
the same transaction, which releases the lock when it commits.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from .db import write_transaction
from .models import Job


class QuotaExceeded(Exception):
    """Adding the jobs would put the tenant over its limit; the message says by how much."""


def _lock_key(tenant: str) -> int:
    # a signed 64-bit number per tenant, in a space of our own (the "specq-quota:" salt)
    return int.from_bytes(hashlib.sha256(f"specq-quota:{tenant}".encode()).digest()[:8], "big", signed=True)


def unfinished_jobs(session: Session, tenant: str) -> int:
    """The tenant's queued and running jobs (no lock; in the caller's transaction)."""
    n = session.scalar(select(func.count()).select_from(Job)
                       .where(Job.tenant == tenant, Job.status.in_(("queued", "running"))))
    return int(n or 0)


def reserve_queued(session: Session, tenant: str, adding: int, limit: int) -> None:
    """Begin a write transaction, lock the tenant, and raise QuotaExceeded (rolled back) if `adding`
    more jobs would put it over `limit` queued-or-running jobs (0 = no limit). On success the
    transaction stays open: insert the jobs in it."""
    if limit <= 0:
        return
    write_transaction(session)
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key(tenant)})
    current = unfinished_jobs(session, tenant)
    if current + adding > limit:
        session.rollback()
        what = "1 more job" if adding == 1 else f"{adding} more jobs"
        raise QuotaExceeded(f"tenant {tenant} has {current} queued or running jobs; {what} would exceed the limit of "
                            f"{limit} (SPECQ_MAX_QUEUED_JOBS): wait for some to finish")


__all__ = ["QuotaExceeded", "reserve_queued", "unfinished_jobs"]
