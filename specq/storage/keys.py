"""API keys: create (the secret is returned once), look up by secret, list, revoke.

A key is `sk-specq-` + 43 URL-safe characters (256 random bits). Only its sha256 is stored: the
secret is high-entropy, so a plain hash is as good as a slow one against a stolen table, and an
indexed equality lookup finds it without comparing secrets in Python. Same conventions as jobs.py:
a Session first, one transaction per call.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session

from .models import ApiKey, utcnow

KEY_PREFIX = "sk-specq-"
#: characters of the secret kept (in clear) to name a key in listings: the prefix + 8
SHOWN_CHARS = len(KEY_PREFIX) + 8
#: tenant names: what a path segment, a log field and a Prometheus label can hold without escaping
#: (matched whole with fullmatch: `$` would also accept a trailing newline)
TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class Caller:
    """Who sent a request: its tenant (owner of what it creates) and whether it may see every tenant."""

    tenant: str
    admin: bool = False
    key_id: str | None = None

    @property
    def scope(self) -> str | None:
        """The tenant filter for reads: None (every tenant) for an admin."""
        return None if self.admin else self.tenant


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
        raise ValueError(f"bad tenant name {tenant!r}: 1-64 characters, letters, digits, '.', '_', '-', "
                         "starting with a letter or digit")
    return tenant


def create_key(session: Session, tenant: str, *, admin: bool = False, name: str | None = None) -> tuple[ApiKey, str]:
    """Insert a new key for `tenant`; return (its row, the secret). The secret is not stored."""
    check_tenant(tenant)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(id="key_" + secrets.token_hex(8), tenant=tenant, admin=admin, name=name,
                 prefix=secret[:SHOWN_CHARS], key_hash=hash_key(secret), created_at=utcnow())
    try:
        session.add(row)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return row, secret


def find_caller(session: Session, secret: str) -> Caller | None:
    """The Caller a key belongs to, or None for an unknown or revoked key."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
        return None
    row = session.execute(
        select(ApiKey.id, ApiKey.tenant, ApiKey.admin)
        .where(and_(ApiKey.key_hash == hash_key(secret), ApiKey.revoked_at.is_(None)))
    ).one_or_none()
    session.commit()
    return None if row is None else Caller(tenant=row.tenant, admin=bool(row.admin), key_id=row.id)


def list_keys(session: Session, *, tenant: str | None = None, include_revoked: bool = False) -> list[ApiKey]:
    """Keys, oldest first (no secrets: only hashes are stored)."""
    q = select(ApiKey)
    if tenant is not None:
        q = q.where(ApiKey.tenant == tenant)
    if not include_revoked:
        q = q.where(ApiKey.revoked_at.is_(None))
    rows = list(session.scalars(q.order_by(ApiKey.created_at, ApiKey.id)))
    session.commit()
    return rows


def revoke_key(session: Session, ref: str) -> ApiKey | None:
    """Revoke the key whose id (`key_…`) or shown prefix is `ref`; return it, or None if there is none.
    Revoking twice keeps the first revocation time. A prefix that names several keys raises ValueError."""
    q = select(ApiKey).where(ApiKey.id == ref) if ref.startswith("key_") else select(ApiKey).where(ApiKey.prefix == ref)
    try:
        rows = list(session.scalars(q.execution_options(populate_existing=True)))
        if len(rows) > 1:
            raise ValueError(f"{ref!r} names {len(rows)} keys: revoke by id (key_…)")
        if not rows:
            session.rollback()
            return None
        session.execute(update(ApiKey).where(and_(ApiKey.id == rows[0].id, ApiKey.revoked_at.is_(None)))
                        .values(revoked_at=utcnow()).execution_options(synchronize_session=False))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    row = session.scalars(select(ApiKey).where(ApiKey.id == rows[0].id)
                          .execution_options(populate_existing=True)).one()
    session.commit()
    return row


__all__ = ["Caller", "KEY_PREFIX", "create_key", "find_caller", "list_keys", "revoke_key", "hash_key", "check_tenant"]
