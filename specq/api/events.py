"""GET /v1/jobs/{id}/events: a job's status, phase, progress and answer text as server-sent events
(the format: docs/service.md and `schemas.EVENT_MODELS`; how they are gathered: `job_stream`)."""

from __future__ import annotations

from typing import Any, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..ascii_numbers import ascii_int
from ..settings import ServiceSettings
from ..storage import db, jobs
from ..storage.keys import Caller
from .errors import ApiError, responses
from .jobs import JobId
from .job_stream import follow, sse

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
EVENTS_DOC = {200: {"content": {"text/event-stream": {"schema": {
    "type": "string", "description": "server-sent events: status, phase, progress, delta, reset, done "
    "(data: #/components/schemas/EventStatus, EventPhase, EventProgress, EventDelta, EventReset, EventDone)"}}},
    "description": "the job's events until it finishes"}}


def visible(job_id: str, scope: str | None) -> bool:
    with db.session() as s:
        return jobs.get_job(s, job_id, tenant=scope) is not None


def last_event_id(request: Request) -> int:
    """Characters of the answer the client has (`Last-Event-ID` of a reconnecting EventSource)."""
    raw = request.headers.get("last-event-id", "").strip()
    n = ascii_int(raw, max_digits=11)  # '²'.isdigit() is true, int('²') raises: ASCII digits only
    return 0 if n is None else n


def events_router(settings: ServiceSettings, caller_of: Callable[..., Caller]) -> APIRouter:
    router = APIRouter(tags=["jobs"])

    @router.get("/v1/jobs/{job_id}/events", summary="A job's events (SSE): status, phase, progress, answer text",
                operation_id="getJobEvents", response_class=StreamingResponse,
                responses={**EVENTS_DOC, **responses(401, 404, 422, 503)})
    async def job_events(request: Request, job_id: str = JobId, caller: Caller = Depends(caller_of)):
        if not await run_in_threadpool(visible, job_id, caller.scope):
            raise ApiError(404, f"no job {job_id}", "not_found")
        return StreamingResponse(_stream(settings, job_id, last_event_id(request)), media_type="text/event-stream",
                                 headers=SSE_HEADERS)

    return router


async def _stream(settings: ServiceSettings, job_id: str, start: int):
    async for name, data in follow(settings, job_id, start):
        yield sse(name, data, _id(name, data))


def _id(name: str, data: Any) -> int | None:
    return data["offset"] + len(data["text"]) if name == "delta" else None


__all__ = ["events_router", "SSE_HEADERS", "last_event_id"]
