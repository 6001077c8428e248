"""Who is calling: the API's authentication dependency (SPECQ_AUTH).

* ``none`` (default): no key is asked for; every caller is the one local user, tenant ``default``,
  who sees every job (the single-user `specq up`).
* ``keys``: `Authorization: Bearer sk-specq-…` must name a key made by `specq keys create` and not
  revoked, else 401. The key's tenant owns what the request creates, and reads are filtered to it, so
  another tenant's id answers 404 exactly like an unknown one. Admin keys read every tenant (what
  they create is still their own tenant's) and are the only keys that may read /metrics.

Each request looks its key up by hash in the job store (one indexed SELECT; no cache, so a revoke
takes effect on the next request).
"""

from __future__ import annotations

from fastapi import Depends, Request
from starlette.exceptions import HTTPException

from ..settings import ServiceSettings
from ..storage import db
from ..storage.keys import Caller, find_caller

#: the caller of a service without keys
LOCAL_USER = Caller(tenant="default", admin=True)


class Unauthorized(HTTPException):
    type = "unauthorized"

    def __init__(self, message: str, status_code: int = 401) -> None:
        super().__init__(status_code=status_code, detail=message)
        if status_code == 403:
            self.type = "forbidden"


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise Unauthorized("missing API key: send `Authorization: Bearer <key>` (the CLI sends SPECQ_API_KEY; "
                           "`specq keys create` makes one)")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("malformed Authorization header: send `Authorization: Bearer <key>`")
    return token.strip()


def authenticator(settings: ServiceSettings):
    """The FastAPI dependency that returns the request's Caller (or raises 401)."""

    def caller(request: Request) -> Caller:
        if settings.auth != "keys":
            return LOCAL_USER
        secret = _bearer(request)
        with db.session() as s:
            found = find_caller(s, secret)
        if found is None:
            raise Unauthorized("unknown or revoked API key")
        return found

    return caller


def admin_only(caller_dep):
    """A dependency that lets only admin callers through (403 for a tenant key)."""

    def admin(caller: Caller = Depends(caller_dep)) -> Caller:
        if not caller.admin:
            raise Unauthorized("this endpoint needs an admin key (`specq keys create --admin`)", 403)
        return caller

    return admin


__all__ = ["authenticator", "admin_only", "Caller", "LOCAL_USER", "Unauthorized"]
