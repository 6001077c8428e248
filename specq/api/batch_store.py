"""Storing a parsed batch (native or OpenAI create): its completion window, the batch row, its jobs in
one transaction, the broker messages — or a `failed` batch with its errors; never half of it."""

from __future__ import annotations

import json
import logging
from typing import Any

from ..ascii_numbers import ascii_int
from ..settings import ServiceSettings
from ..storage import batches, db, jobs, lifecycle, limits
from ..storage.quotas import FileQuotaExceeded, QuotaExceeded, reserve_file_bytes, reserve_queued
from . import schemas as S
from .errors import ApiError

log = logging.getLogger("specq.api")

#: validation stops collecting errors after this many (native and OpenAI batch creates)
MAX_ERRORS = 100


def _response(s, batch_id: str) -> dict[str, Any]:
    """The batch as its response body, checked against BatchOut (so it serialises)."""
    body = S.BatchOut.model_validate(batches.get_batch(s, batch_id).to_dict()).model_dump(mode="json")
    json.dumps(body, allow_nan=False)
    return body


#: completion windows: a number and a unit; OpenAI's only value is 24h
WINDOW_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW_S = 30 * 86400


def parse_window(raw: str, param: str = "completion_window") -> float:
    """Seconds of a completion window (`24h`; specq also takes other durations from 1s to 30d); 400 otherwise."""
    text = raw.strip().lower()
    number, unit = ascii_int(text[:-1], max_digits=9), text[-1:]  # ASCII digits only ('²s', '٣s' are refused)
    if unit in WINDOW_UNITS and number is not None and 0 < number * WINDOW_UNITS[unit] <= MAX_WINDOW_S:
        return float(number * WINDOW_UNITS[unit])
    raise ApiError(400, f"completion_window must be a duration like 24h (1s to 30d), not {raw[:40]!r}",
                   "invalid_request_error", param=param)


def store_batch(settings: ServiceSettings, tenant: str, requests: list, errors: list, *, endpoint: str,
                completion_window: str | None, window_s: float | None, input_filename: str | None,
                params: dict[str, Any], metadata: dict[str, str] | None, input_data: bytes | None = None,
                input_file_id: str | None = None) -> dict[str, Any]:
    """Store a parsed batch: `failed` with its errors, or `in_progress` with one queued job per request
    (all in one transaction), then send them to the broker. With `input_data` (the native create) the
    input is stored as a file of the batch (purpose `batch`, counted against the tenant's file quota:
    413 over it; deleted with the batch's data); a batch that fails validation stores none. Nothing
    stays half-stored: on any error the batch, its jobs and that file are deleted."""
    from datetime import timedelta

    from ..broker import enqueue_job
    from ..storage.models import utcnow

    limit = limits.max_input_bytes()
    over = [e for e in errors if e["code"] == "too_many_requests"]
    if over:
        raise ApiError(422, over[0]["message"], "invalid_params")
    with db.session() as s:
        if not errors:
            try:  # refuse before creating the batch; checked again under the locks when the rows go in
                reserve_queued(s, tenant, len(requests), settings.max_queued_jobs)
                s.rollback()
                if input_data is not None:
                    reserve_file_bytes(s, tenant, len(input_data), settings.max_file_storage_bytes)
                    s.rollback()
            except QuotaExceeded as e:
                raise ApiError(429, str(e), "too_many_requests") from None
            except FileQuotaExceeded as e:
                raise ApiError(413, str(e), "too_large") from None
        batch = None
        try:
            now = utcnow()
            batch = batches.create_batch(
                s, tenant=tenant, endpoint=endpoint, completion_window=completion_window,
                input_filename=input_filename, params=params, metadata=metadata, input_file_id=input_file_id,
                expires_at=now + timedelta(seconds=window_s) if window_s else None)
            if errors:
                batches.set_batch_status(s, batch.id, "failed", errors={"object": "list", "data": errors})
                log.info("batch %s failed validation: %s", batch.id, errors[0]["message"])
                return _response(s, batch.id)
            if input_data is not None:
                try:  # under the tenant's file lock, in the transaction that stores the file
                    reserve_file_bytes(s, tenant, len(input_data), settings.max_file_storage_bytes)
                except FileQuotaExceeded as e:
                    raise ApiError(413, str(e), "too_large") from None
                batches.attach_input_file(s, batch.id, filename=(input_filename or "input.jsonl")[:255],
                                          data=input_data)
            try:
                reserve_queued(s, tenant, len(requests), settings.max_queued_jobs)  # add_requests commits it
                ids = batches.add_requests(s, batch.id, requests, tenant=tenant, max_attempts=settings.max_attempts,
                                           limit_bytes=limit, queue=settings.queue)
            except QuotaExceeded as e:
                raise ApiError(429, str(e), "too_many_requests") from None
            except jobs.UnknownDocument as e:  # deleted since the lines were checked
                raise ApiError(404, str(e), "not_found") from None
            batches.set_batch_status(s, batch.id, "in_progress")
            body = _response(s, batch.id)  # serialisable before any job is queued
        except BaseException:
            # nothing may stay half-stored: the batch (and any of its jobs) goes, the caller gets the error
            s.rollback()
            if batch is not None:
                lifecycle.discard_batch(s, batch.id)  # with the input file stored for it
            raise
        for i, job_id in enumerate(ids):
            try:
                enqueue_job(job_id, settings)
            except Exception as e:
                message = (f"could not queue the job: broker unreachable ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})")
                for rest in ids[i:]:
                    jobs.mark_failed(s, rest, message)
                batches.advance_batch(s, batch.id)
                raise ApiError(503, f"batch {batch.id}: {len(ids) - i} of {len(ids)} requests could not be queued: "
                                    f"{message}", "unavailable") from None
        log.info("batch %s: %d requests queued", batch.id, len(ids))
        return body


__all__ = ["store_batch", "parse_window", "WINDOW_UNITS", "MAX_WINDOW_S", "MAX_ERRORS"]
