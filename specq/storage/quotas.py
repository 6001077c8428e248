"""Per-tenant limits checked inside the write transaction that adds jobs or files.

`reserve_queued` counts the tenant's unfinished (queued or running) jobs, `reserve_file_bytes` the
bytes of its files, each under a per-tenant lock (PostgreSQL: a transaction-level advisory lock, one
key space per limit; SQLite: the write lock of BEGIN IMMEDIATE), so two requests at once (in one API
process or several) cannot both slip under the limit. The caller inserts its jobs or its file in the
same transaction, which releases the lock when it commits.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from .calibrations import KIND as CALIBRATION
from .db import write_transaction
from .models import Job


class QuotaExceeded(Exception):
    """Adding the jobs would put the tenant over its limit; the message says by how much."""


def _lock_key(tenant: str, space: str = "specq-quota") -> int:
    # a signed 64-bit number per tenant, in a space of our own (the salt: one per limit)
    return int.from_bytes(hashlib.sha256(f"{space}:{tenant}".encode()).digest()[:8], "big", signed=True)


def _lock_tenant(session: Session, tenant: str, space: str) -> None:
    """Begin a write transaction and hold the tenant's lock of `space` until it ends."""
    write_transaction(session)
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key(tenant, space)})


def unfinished_jobs(session: Session, tenant: str) -> int:
    """The tenant's queued and running jobs (no lock; in the caller's transaction). Calibration units are not
    counted: they are the deployment's (POST /v1/calibrations, admin only), bounded by its own line limit, and
    must not turn an admin's own jobs away."""
    n = session.scalar(select(func.count()).select_from(Job)
                       .where(Job.tenant == tenant, Job.status.in_(("queued", "running")), Job.kind != CALIBRATION))
    return int(n or 0)


def reserve_queued(session: Session, tenant: str, adding: int, limit: int) -> None:
    """Begin a write transaction, lock the tenant, and raise QuotaExceeded (rolled back) if `adding`
    more jobs would put it over `limit` queued-or-running jobs (0 = no limit). On success the
    transaction stays open: insert the jobs in it."""
    if limit <= 0:
        return
    _lock_tenant(session, tenant, "specq-quota")
    current = unfinished_jobs(session, tenant)
    if current + adding > limit:
        session.rollback()
        what = "1 more job" if adding == 1 else f"{adding} more jobs"
        raise QuotaExceeded(f"tenant {tenant} has {current} queued or running jobs; {what} would exceed the limit of "
                            f"{limit} (SPECQ_MAX_QUEUED_JOBS): wait for some to finish")


def reserve_file_bytes(session: Session, tenant: str, adding: int, limit: int) -> None:
    """Begin a write transaction, lock the tenant's files, and raise FileQuotaExceeded (rolled back) if
    `adding` more bytes would put its files over `limit` (SPECQ_MAX_FILE_STORAGE_BYTES; batches'
    output files are not counted). On success the transaction stays open: insert the file in it."""
    from .files import tenant_bytes

    _lock_tenant(session, tenant, "specq-files")
    used = tenant_bytes(session, tenant, commit=False)
    if used + adding > limit:
        session.rollback()
        raise FileQuotaExceeded(f"this tenant's files would hold {used + adding} bytes, over the limit of {limit} "
                                "(SPECQ_MAX_FILE_STORAGE_BYTES): delete some (DELETE /v1/files/{id})")


class FileQuotaExceeded(Exception):
    """Storing the file would put the tenant's files over SPECQ_MAX_FILE_STORAGE_BYTES."""


__all__ = ["QuotaExceeded", "FileQuotaExceeded", "reserve_queued", "reserve_file_bytes", "unfinished_jobs"]
