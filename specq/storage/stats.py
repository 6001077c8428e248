"""Per-phase timing statistics over a set of jobs (a batch, a list of ids, a tenant).

Percentiles follow PostgreSQL's `percentile_cont` (linear interpolation between the two nearest
ranks). On PostgreSQL the whole aggregation is one SQL query; on other backends (SQLite) the SQL
query returns the values ordered by phase and ms and the percentiles are taken in Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Float, func, select
from sqlalchemy.orm import Session

from .models import Job, PhaseTiming, Result


def percentile_cont(sorted_values: list[float], q: float) -> float:
    """`percentile_cont(q)` of ascending `sorted_values` (not empty)."""
    n = len(sorted_values)
    rank = q * (n - 1)
    lo = int(rank)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def phase_stats(
    session: Session,
    job_ids: Iterable[str] | None = None,
    *,
    batch_id: str | None = None,
    tenant: str | None = None,
    phases: Iterable[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """{phase: {"count", "mean", "p50", "p95", "min", "max"}} over the timings of the chosen jobs.

    Jobs are chosen by `job_ids`, `batch_id` and/or `tenant` (all given filters apply; none = every
    job). `phases` limits the phases reported. Phases are returned in name order.
    """
    ids = None if job_ids is None else list(dict.fromkeys(job_ids))
    if ids is not None and not ids:
        return {}
    conditions = []
    if ids is not None:
        conditions.append(PhaseTiming.job_id.in_(ids))
    if phases is not None:
        wanted = list(phases)
        if not wanted:
            return {}
        conditions.append(PhaseTiming.phase.in_(wanted))
    need_join = batch_id is not None or tenant is not None
    if batch_id is not None:
        conditions.append(Job.batch_id == batch_id)
    if tenant is not None:
        conditions.append(Job.tenant == tenant)

    def _from(q):
        if need_join:
            q = q.join(Job, Job.id == PhaseTiming.job_id)
        return q.where(*conditions)

    stats: dict[str, dict[str, Any]] = {}
    if session.get_bind().dialect.name == "postgresql":
        q = _from(
            select(
                PhaseTiming.phase,
                func.count(),
                func.avg(PhaseTiming.ms),
                func.percentile_cont(0.5).within_group(PhaseTiming.ms),
                func.percentile_cont(0.95).within_group(PhaseTiming.ms),
                func.min(PhaseTiming.ms),
                func.max(PhaseTiming.ms),
            ).select_from(PhaseTiming)
        ).group_by(PhaseTiming.phase).order_by(PhaseTiming.phase)
        for phase, count, mean, p50, p95, lo, hi in session.execute(q):
            stats[phase] = {
                "count": int(count),
                "mean": float(mean),
                "p50": float(p50),
                "p95": float(p95),
                "min": float(lo),
                "max": float(hi),
            }
    else:
        q = _from(select(PhaseTiming.phase, PhaseTiming.ms).select_from(PhaseTiming)).order_by(
            PhaseTiming.phase, PhaseTiming.ms
        )
        groups: dict[str, list[float]] = {}
        for phase, ms in session.execute(q):
            groups.setdefault(phase, []).append(float(ms))
        for phase, values in groups.items():
            stats[phase] = {
                "count": len(values),
                "mean": sum(values) / len(values),
                "p50": percentile_cont(values, 0.5),
                "p95": percentile_cont(values, 0.95),
                "min": values[0],
                "max": values[-1],
            }
    session.commit()
    return stats


def batch_summary(session: Session, batch_id: str) -> dict[str, Any]:
    """What `GET /v1/batches/{id}/stats` reports, aggregated in SQL over the batch's results:
    {"count", "kept_ratio_mean", "prompt_tokens_mean", "kept_tokens_mean", "completion_tokens_mean",
    "first_started_at", "last_finished_at", "wall_s", "jobs_per_s", "phases": phase_stats(...)}.
    `count` is the number of succeeded requests (those with a result); the kept ratio of a request is
    kept_tokens / prompt_tokens (requests with no prompt tokens are left out of the mean)."""
    ratio = func.cast(Result.kept_tokens, Float) / func.nullif(Result.prompt_tokens, 0)
    count, kept_ratio, prompt, kept, completion = session.execute(
        select(func.count(Result.job_id), func.avg(ratio), func.avg(Result.prompt_tokens), func.avg(Result.kept_tokens),
               func.avg(Result.completion_tokens))
        .select_from(Result).join(Job, Job.id == Result.job_id).where(Job.batch_id == batch_id)
    ).one()
    first, last = session.execute(
        select(func.min(Job.started_at), func.max(Job.finished_at)).where(Job.batch_id == batch_id, Job.status == "succeeded")
    ).one()
    session.commit()
    first, last = _aware(first), _aware(last)
    wall = (last - first).total_seconds() if first is not None and last is not None else None
    return {
        "count": int(count or 0),
        "kept_ratio_mean": None if kept_ratio is None else float(kept_ratio),
        "prompt_tokens_mean": None if prompt is None else float(prompt),
        "kept_tokens_mean": None if kept is None else float(kept),
        "completion_tokens_mean": None if completion is None else float(completion),
        "first_started_at": _iso(first),
        "last_finished_at": _iso(last),
        "wall_s": wall,
        "jobs_per_s": (int(count) / wall) if wall and count else None,
        "phases": phase_stats(session, batch_id=batch_id),
    }


def batch_phases(session: Session, batch_id: str) -> list[str]:
    """The phases any result of the batch reports (the CSV export's timing columns)."""
    rows = session.scalars(
        select(PhaseTiming.phase).distinct().join(Job, Job.id == PhaseTiming.job_id).where(Job.batch_id == batch_id)
    ).all()
    session.commit()
    from .results import phase_order

    return phase_order(list(rows))


def _aware(value):
    # min()/max() over a UTCDateTime column come back through the column type on PostgreSQL, as naive
    # text on SQLite
    if value is None:
        return None
    if isinstance(value, str):
        from datetime import datetime

        value = datetime.fromisoformat(value)
    from datetime import timezone

    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


__all__ = ["phase_stats", "percentile_cont", "batch_summary", "batch_phases"]
