"""Aggregates behind the API's `/metrics` (Prometheus), each one SQL query over the job store.

The job store is the service's record of what ran, whichever worker ran it, so `/metrics` on any
API process reports the whole deployment: jobs and batches by status, token sums, and histograms of
phase durations and queue waits (bucket counts computed in SQL, cumulative as Prometheus wants).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from .models import Batch, Job, PhaseTiming, Result


def count_by_status(session: Session, model: Any = Job) -> dict[str, int]:
    """{status: count} of jobs (or batches, with model=Batch)."""
    rows = session.execute(select(model.status, func.count()).group_by(model.status)).all()
    session.commit()
    return {status: int(n) for status, n in rows}


def token_sums(session: Session) -> dict[str, int]:
    """Sums over every stored result: prompt, kept and completion tokens, and the number of results."""
    n, prompt, kept, completion = session.execute(
        select(func.count(), func.coalesce(func.sum(Result.prompt_tokens), 0), func.coalesce(func.sum(Result.kept_tokens), 0),
               func.coalesce(func.sum(Result.completion_tokens), 0))
    ).one()
    session.commit()
    return {"results": int(n), "prompt_tokens": int(prompt), "kept_tokens": int(kept),
            "completion_tokens": int(completion)}


def _histogram(session: Session, value, group, bounds: Sequence[float], where=None) -> dict[Any, dict[str, Any]]:
    cols = [func.count(), func.coalesce(func.sum(value), 0.0)]
    cols += [func.coalesce(func.sum(case((value <= b, 1), else_=0)), 0) for b in bounds]
    q = select(*( [group] if group is not None else []), *cols).where(value.is_not(None))
    if where is not None:
        q = q.where(where)
    if group is not None:
        q = q.group_by(group)
    out: dict[Any, dict[str, Any]] = {}
    for row in session.execute(q):
        row = tuple(row)
        key = row[0] if group is not None else None
        rest = row[1:] if group is not None else row
        count, total, *cum = rest
        out[key] = {"count": int(count), "sum": float(total), "buckets": [int(c) for c in cum]}
    session.commit()
    return out


def phase_histograms(session: Session, bounds_ms: Sequence[float]) -> dict[str, dict[str, Any]]:
    """{phase: {"count", "sum" (ms), "buckets": [cumulative count of ms <= bound for each bound]}}."""
    return _histogram(session, PhaseTiming.ms, PhaseTiming.phase, bounds_ms)


def queue_wait_histogram(session: Session, bounds_ms: Sequence[float]) -> dict[str, Any]:
    """The same shape over jobs' queue_wait_ms (submission to first claim), jobs that started."""
    return _histogram(session, Job.queue_wait_ms, None, bounds_ms).get(
        None, {"count": 0, "sum": 0.0, "buckets": [0] * len(bounds_ms)})


__all__ = ["count_by_status", "token_sums", "phase_histograms", "queue_wait_histogram", "Batch"]
