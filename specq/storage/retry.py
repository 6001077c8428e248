"""Retrying a store write through a database restart or failover.

A worker that has computed a result must not drop it because PostgreSQL restarted under it: the
connection errors below are transient (the pool's pre-ping opens a fresh connection once the server
is back), so the write is repeated with a growing pause until it goes through or `give_up_after`
seconds have passed. Every storage function is one transaction that rolls back on error, so repeating
one never half-applies it; the ones the worker repeats are idempotent (save_result, mark_*).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError, PendingRollbackError
from sqlalchemy.orm import Session

log = logging.getLogger("specq.storage")

T = TypeVar("T")


def is_transient(e: BaseException) -> bool:
    """A lost or refused connection, a server shutting down, SQLite busy: worth trying again."""
    if isinstance(e, (OperationalError, InterfaceError, DisconnectionError, PendingRollbackError)):
        return True
    return isinstance(e, DBAPIError) and bool(e.connection_invalidated)


def retry_transient(session: Session, fn: Callable[[], T], *, what: str, give_up_after: float,
                    first_pause: float = 0.5, max_pause: float = 5.0) -> T:
    """`fn()` (a storage call on `session`), repeated on transient errors for up to `give_up_after`
    seconds; then, or on any other error, the error is raised."""
    deadline = time.monotonic() + give_up_after
    pause = first_pause
    tries = 0
    while True:
        try:
            result = fn()
            if tries:
                log.warning("%s went through after %d retr%s", what, tries, "y" if tries == 1 else "ies")
            return result
        except Exception as e:
            if not is_transient(e) or time.monotonic() + pause > deadline:
                raise
            tries += 1
            log.warning("%s failed (%s: %s); retry %d in %.1fs", what, type(e).__name__,
                        str(e).strip().splitlines()[0] if str(e).strip() else "", tries, pause)
            try:
                session.rollback()
            except Exception:  # the connection is gone: the next try checks out a new one
                pass
            time.sleep(pause)
            pause = min(max_pause, pause * 2)


__all__ = ["is_transient", "retry_transient"]
