"""Query-string helpers shared by the jobs and batches endpoints."""

from __future__ import annotations

from typing import Callable, Sequence


def parse_statuses(status: str | None, known: Sequence[str], error: Callable[..., Exception]) -> list[str] | None:
    """`?status=a,b` → ["a", "b"] (None when absent); an unknown status raises error(422, message, type)."""
    if not status:
        return None
    statuses = [x.strip() for x in status.split(",") if x.strip()]
    bad = [x for x in statuses if x not in known]
    if bad:
        raise error(422, f"unknown status {', '.join(bad)} (known: {', '.join(known)})", "invalid_params")
    return statuses
