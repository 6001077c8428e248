"""The shadow-check table (`shadow_checks`, migration 0009): one row per check a worker ran or cancelled
(worker/shadow.py; the policy is engine/policy/shadow.py, which storage does not import).

`by_key` is what workers (to disable evidence rows), GET /v1/evidence and /metrics read: per job key, the
counts of each outcome. `version` (the table's largest id) changes with every check, so a worker reloads
its rows only when a check was written since (worker/evidence.py).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .models import ShadowCheck

OUTCOMES = ("agree", "disagree", "cancelled")


def record(session: Session, *, job_id: str, key_id: str, key: dict[str, Any], outcome: str, shadow_ms: float) -> ShadowCheck:
    """Store one check and commit."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome: must be one of {', '.join(OUTCOMES)}")
    rec = ShadowCheck(job_id=job_id, key_id=key_id, key=key, outcome=outcome, shadow_ms=float(shadow_ms))
    session.add(rec)
    session.commit()
    return rec


def version(session: Session) -> int:
    """Changes whenever a check is written (0: none yet)."""
    return int(session.scalar(select(func.max(ShadowCheck.id))) or 0)


def by_key(session: Session) -> list[dict[str, Any]]:
    """Per job key: {"key_id", "key", "agree", "disagree", "cancelled", "ms"} (`ms`: the checks' baseline wall
    time summed, cancelled ones to their cut), in the order keys were first checked."""
    counts: dict[str, dict[str, Any]] = {}
    q = (select(ShadowCheck.key_id, ShadowCheck.outcome, func.count(), func.min(ShadowCheck.id),
                func.sum(ShadowCheck.shadow_ms))
         .group_by(ShadowCheck.key_id, ShadowCheck.outcome))
    first: dict[str, int] = {}
    for kid, outcome, n, lo, ms in session.execute(q):
        c = counts.setdefault(kid, {"key_id": kid, "agree": 0, "disagree": 0, "cancelled": 0, "ms": 0.0})
        c[outcome] = int(n)
        c["ms"] += float(ms or 0.0)
        first[kid] = min(first.get(kid, lo), lo)
    for kid, lo in first.items():
        counts[kid]["key"] = session.scalar(select(ShadowCheck.key).where(ShadowCheck.id == lo))
    return [counts[k] for k in sorted(counts, key=first.__getitem__)]


def totals(session: Session) -> dict[str, int]:
    """Checks per outcome over every key."""
    out = {o: 0 for o in OUTCOMES}
    for outcome, n in session.execute(select(ShadowCheck.outcome, func.count()).group_by(ShadowCheck.outcome)):
        out[outcome] = int(n)
    return out


__all__ = ["record", "version", "by_key", "totals", "OUTCOMES"]
