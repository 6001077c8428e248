"""Results: one row per succeeded job plus its `timings_ms` as (job_id, phase, ms) rows."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ..contracts import CACHE_PHASES, CORE_PHASES, SCORE_PHASES
from .db import write_transaction
from .jobs import check_owned, owned
from .models import Job, PhaseTiming, Result, utcnow

#: result keys stored in their own columns (or rows); every other key goes to `results.extra`
_COLUMNS = ("text", "finish_reason", "usage", "timings_ms", "spec", "engine", "draft")
_PHASE_ORDER = {p: i for i, p in enumerate(CORE_PHASES + SCORE_PHASES + CACHE_PHASES)}
#: result keys batch exports leave out unless asked (`get_results(detail=True)`): per-job detail that a
#: page about one job reads, not a table of many (`selection`: kept spans and chunk scores, docs/result.md;
#: `trace`: the job's time stamps, storage.trace)
DETAIL_KEYS = ("selection", "trace")


def _result_dict(result: Any) -> dict[str, Any]:
    if hasattr(result, "to_dict"):
        return result.to_dict()
    if isinstance(result, Mapping):
        return dict(result)
    raise TypeError(f"result must be a RunResult or its dict, not {type(result).__name__}")


def _timings(raw: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for phase, ms in dict(raw or {}).items():
        try:
            value = float(ms)
        except (TypeError, ValueError):
            raise ValueError(f"timings_ms[{phase!r}] is not a number: {ms!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"timings_ms[{phase!r}] is not finite: {ms!r}")
        if not phase or len(str(phase)) > 64:
            raise ValueError(f"phase name must be 1-64 characters: {phase!r}")
        out[str(phase)] = value
    return out


def save_result(session: Session, job_id: str, result: Any, *, token: str,
                also: Callable[[Session], None] | None = None) -> bool:
    """Store the result of the attempt holding `token` in ONE transaction: the job -> succeeded with
    finished_at, the results row, and one phase_timings row per `timings_ms` key.

    `result` is a RunResult or `RunResult.to_dict()`. The first statement is the fenced UPDATE of the
    job (storage.jobs, "Fencing"): it takes the row's lock and matches only (job id, `token`,
    running), so a stale worker cannot turn a requeued, failed, cancelled or re-claimed job into
    `succeeded`; it raises contracts.Fenced then, changing nothing. True once stored; False if this
    attempt had stored it already (a write repeated after a lost commit acknowledgement). `also`: more
    writes of the same transaction (a calibration unit's outcome: storage/calibrations.store_record).
    """
    d = _result_dict(result)
    usage = d.get("usage") or {}
    timings = _timings(d.get("timings_ms"))
    try:
        write_transaction(session)
        now = utcnow()
        n = session.execute(
            update(Job)
            .where(owned(job_id, token))
            .values(status="succeeded", finished_at=now, error=None)
            .execution_options(synchronize_session=False)
        ).rowcount
        if n != 1:
            session.rollback()
            check_owned(session, job_id, token, done="succeeded")  # raises Fenced unless repeated
            return False
        session.add(
            Result(
                job_id=job_id,
                text=str(d.get("text") or ""),
                finish_reason=str(d.get("finish_reason") or "stop"),
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                kept_tokens=int(usage.get("kept_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                spec=dict(d.get("spec") or {}),
                engine=dict(d.get("engine") or {}),
                draft=dict(d.get("draft") or {}),
                extra={k: v for k, v in d.items() if k not in _COLUMNS},
                created_at=now,
            )
        )
        session.flush()
        session.add_all(PhaseTiming(job_id=job_id, phase=p, ms=ms) for p, ms in timings.items())
        session.flush()
        if also is not None:
            also(session)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return True


def get_timings(session: Session, job_id: str) -> dict[str, float]:
    """The job's timings_ms (core phases in their usual order, then the rest by name)."""
    rows = session.execute(select(PhaseTiming.phase, PhaseTiming.ms).where(PhaseTiming.job_id == job_id)).all()
    session.commit()
    rows.sort(key=lambda r: (_PHASE_ORDER.get(r.phase, len(_PHASE_ORDER)), r.phase))
    return {r.phase: r.ms for r in rows}


def get_result(session: Session, job_id: str, tenant: str | None = None) -> dict[str, Any] | None:
    """The stored result in `RunResult.to_dict()` shape, or None (no result yet / other tenant)."""
    q = select(Result).join(Job, Job.id == Result.job_id).where(Result.job_id == job_id)
    if tenant is not None:
        q = q.where(Job.tenant == tenant)
    row = session.scalars(q.execution_options(populate_existing=True)).one_or_none()
    if row is None:
        session.commit()
        return None
    timings = get_timings(session, job_id)
    return _as_dict(row, timings)


def _as_dict(row: Result, timings: dict[str, float], detail: bool = True) -> dict[str, Any]:
    leave_out = _COLUMNS if detail else _COLUMNS + DETAIL_KEYS
    return {
        "text": row.text,
        "finish_reason": row.finish_reason,
        "usage": {
            "prompt_tokens": row.prompt_tokens,
            "kept_tokens": row.kept_tokens,
            "completion_tokens": row.completion_tokens,
        },
        "timings_ms": timings,
        "spec": row.spec or {},
        "engine": row.engine or {},
        "draft": row.draft or {},
        **{k: v for k, v in (row.extra or {}).items() if k not in leave_out},
    }


def get_results(session: Session, job_ids: list[str], *, detail: bool = False) -> dict[str, dict[str, Any]]:
    """{job_id: result} for those of `job_ids` that have a result, in two queries (batch exports);
    without `detail`, the DETAIL_KEYS are left out."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return {}
    rows = list(session.scalars(select(Result).where(Result.job_id.in_(ids)).execution_options(populate_existing=True)))
    timings: dict[str, list[tuple[str, float]]] = {}
    for job_id, phase, ms in session.execute(
        select(PhaseTiming.job_id, PhaseTiming.phase, PhaseTiming.ms).where(PhaseTiming.job_id.in_(ids))
    ):
        timings.setdefault(job_id, []).append((phase, ms))
    session.commit()
    out = {}
    for row in rows:
        pairs = sorted(timings.get(row.job_id, []), key=lambda r: (_PHASE_ORDER.get(r[0], len(_PHASE_ORDER)), r[0]))
        out[row.job_id] = _as_dict(row, dict(pairs), detail)
    return out


def ran_specs(session: Session, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """{job_id: its result's `spec`} for those of `job_ids` that have a result, in one query: what
    ran (`mode`, `reason`, `cache`) for list rows, which carry no result."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return {}
    rows = session.execute(select(Result.job_id, Result.spec).where(Result.job_id.in_(ids))).all()
    session.commit()
    return {job_id: spec if isinstance(spec, dict) else {} for job_id, spec in rows}


def phase_order(phases: list[str]) -> list[str]:
    """Phases in their usual order: the core phases, the scoring sub-phases, then the rest by name."""
    return sorted(set(phases), key=lambda p: (_PHASE_ORDER.get(p, len(_PHASE_ORDER)), p))


__all__ = ["save_result", "get_result", "get_results", "get_timings", "phase_order", "ran_specs", "DETAIL_KEYS"]
