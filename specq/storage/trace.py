"""A job's trace: where its time went, from the server's own clocks (issue 50, "where a follow-up's time
goes").

Stamps are unix seconds (float). Kept without a migration: the job row's `created_at` (stored),
`started_at` (claimed) and `finished_at` (done), and the rest in the result's `trace` object (stored in
`results.extra`, so only a succeeded job has them):

* the worker's, written with the result: `engine_start` (the job handed to the engine), `first_token`
  (its first answer text left the engine), `engine_done`;
* the API's (OpenAI routes only; a native job's POST and its event stream are separate requests),
  merged into it once the response was sent (`add_stamps`): `accepted` (the request's body read),
  `queued` (the broker took the message), `first_byte` (the stream's first chunk, or the whole answer
  without `stream`), `first_text` (the first chunk with answer text).

`queued` and `claimed` race: a worker may claim the job before the API's send returns.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import Job, Result

#: the stamps in the order a job passes them
STAMPS = ("accepted", "stored", "queued", "claimed", "engine_start", "first_token", "first_byte", "first_text",
          "engine_done", "done")
#: the stamps the API merges into the result's trace
API_STAMPS = ("accepted", "queued", "first_byte", "first_text")


def _unix(value) -> float | None:
    return value.timestamp() if value is not None else None


def job_trace(job: Job, result: dict[str, Any] | None) -> dict[str, float | None]:
    """Every stamp of STAMPS (None where unknown) from the job's row and its result."""
    saved = (result or {}).get("trace") or {}
    out: dict[str, float | None] = {k: _number(saved.get(k)) for k in STAMPS}
    out["stored"] = _unix(job.created_at)
    out["claimed"] = _unix(job.started_at)
    out["done"] = _unix(job.finished_at) if job.status in ("succeeded", "failed", "cancelled") else None
    return out


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def add_stamps(session: Session, job_id: str, stamps: dict[str, float]) -> bool:
    """Merge the API's `stamps` (keys of API_STAMPS) into the job's stored trace; False when the job has no
    result (it did not succeed: nothing to merge into)."""
    try:
        row = session.scalars(select(Result).where(Result.job_id == job_id).with_for_update()).one_or_none()
        if row is None:
            session.commit()
            return False
        extra = dict(row.extra or {})
        trace = dict(extra.get("trace") or {})
        trace.update({k: float(v) for k, v in stamps.items() if k in API_STAMPS and v is not None})
        extra["trace"] = trace
        row.extra = extra
        session.commit()
        return True
    except BaseException:
        session.rollback()
        raise


__all__ = ["STAMPS", "API_STAMPS", "job_trace", "add_stamps"]
