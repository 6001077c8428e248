"""Query-string helpers shared by the jobs and batches endpoints."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from fastapi import Query

from .schemas import MAX_LIMIT, MAX_OFFSET


def status_query(known: Sequence[str]) -> Any:
    return Query(None, max_length=200, description="one status or several, comma-separated: " + ", ".join(known))


def limit_query(default: int) -> Any:
    return Query(default, ge=1, le=MAX_LIMIT, description="page size (cut to SPECQ_MAX_LIST_LIMIT)")


#: `offset` of a list
OFFSET = Query(0, ge=0, le=MAX_OFFSET)


def parse_statuses(status: str | None, known: Sequence[str], error: Callable[..., Exception]) -> list[str] | None:
    """`?status=a,b` → ["a", "b"] (None when absent); an unknown status raises error(422, message, type)."""
    if not status:
        return None
    statuses = [x.strip() for x in status.split(",") if x.strip()]
    bad = [x for x in statuses if x not in known]
    if bad:
        raise error(422, f"unknown status {', '.join(bad)} (known: {', '.join(known)})", "invalid_params")
    return statuses
