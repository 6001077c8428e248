"""Is the service up, can it take jobs, and who works on them.

    GET /healthz      liveness: this process answers (checks nothing else; always 200), with
                      `instance`, the name of this API process (SPECQ_INSTANCE_ID, set by `specq up`)
    GET /readyz       readiness: 200 when this API can accept jobs — the job store answers, its schema
                      is at the newest migration, the broker answers — else 503 naming what is not;
                      `workers_ready` counts the workers of this API's queue (SPECQ_QUEUE) with a
                      fresh heartbeat that say they are ready (jobs are accepted with none: they
                      wait in the queue); `workers_not_ready` says why each other one is not (e.g.
                      a model file missing: specq.worker.model_wait)
    GET /health       as llama-server and vLLM serve it (what their users' probes and scripts call):
                      200 `{"status": "ok"}` when /readyz would be 200, else 503 (type
                      `unavailable_error`, llama-server's) naming what is not ready
    GET /v1/workers   the live workers from their heartbeats (`specq.monitor`): name, device,
                      backend, model, slots, busy, current jobs (admins only), heartbeat age

Heartbeat records are written by workers of any version, so every field is read defensively: a
missing `ready` counts as ready (workers before it existed wrote their first heartbeat only once
their models were loaded), missing `slots` as 1, `current_jobs` falls back to `current_job`.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any, Callable

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from .. import __version__ as _version
from ..settings import ServiceSettings
from ..storage.keys import Caller
from . import schemas as S
from .errors import error_response, responses


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


def _number(value: Any, default: float | None = None) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            return default
    return float(value) if math.isfinite(value) else default


def _int(value: Any, default: int | None = None) -> int | None:
    n = _number(value)
    return int(n) if n is not None and abs(n) < 2**53 else default


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)[:300]


def worker_view(rec: dict[str, Any], now: float, admin: bool) -> dict[str, Any]:
    """One heartbeat record as a `WorkerOut`."""
    jobs = rec.get("current_jobs")
    if not isinstance(jobs, list):
        jobs = [rec["current_job"]] if rec.get("current_job") else []
    jobs = [str(j)[:64] for j in jobs if j][:256]
    slots = _int(rec.get("slots"), 1) or 1
    busy = _int(rec.get("busy"), len(jobs))
    ready = rec.get("ready", True)
    return {
        "name": str(rec.get("name") or "?")[:300],
        "host": _text(rec.get("host")),
        "pid": _int(rec.get("pid")),
        "queue": _text(rec.get("queue")),
        "device": _text(rec.get("device", rec.get("gpu"))),
        "backend": _text(rec.get("backend")),
        "model": _text(rec.get("model", rec.get("target"))),
        "ready": ready if isinstance(ready, bool) else str(ready).lower() in ("1", "true", "yes"),
        "not_ready": _text(rec.get("not_ready")),
        "slots": max(1, slots),
        "busy": max(0, busy if busy is not None else len(jobs)),
        "current_jobs": jobs if admin else [],
        "jobs_done": max(0, _int(rec.get("jobs_done"), 0) or 0),
        "heartbeat_age_s": round(max(0.0, now - (_number(rec.get("ts"), 0.0) or 0.0)), 3),
        "started_at": _number(rec.get("started_at")),
    }


def _heartbeats(settings: ServiceSettings) -> list[dict[str, Any]]:
    from ..monitor import read_heartbeats

    return [r for r in read_heartbeats(settings) if isinstance(r, dict)]


def readiness(settings: ServiceSettings) -> dict[str, Any]:
    """The `Ready` body (blocking: run it in a thread)."""
    from ..broker import check_broker
    from ..storage import db

    body: dict[str, Any] = {"version": _version, "broker_kind": "embedded" if settings.embedded_broker else "redis",
                            "queue": settings.queue, "workers_ready": 0}
    ok = True
    try:
        with db.get_engine().connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        body["database"] = "ok"
        current, head = db.current_revision(), db.head_revision()
        body["migrations"] = "ok" if current == head else f"the schema is at {current or 'nothing'}, not {head}: " \
                                                            "run `specq db upgrade`"
        ok = ok and current == head
    except Exception as e:
        ok = False
        body["database"] = f"unreachable: {_first_line(e)}"
        body["migrations"] = "unknown (database unreachable)"
    try:
        check_broker(settings)
        body["broker"] = "ok"
        now = time.time()
        mine = [worker_view(r, now, False) for r in _heartbeats(settings) if r.get("queue") == settings.queue]
        body["workers_ready"] = sum(1 for w in mine if w["ready"])
        body["workers_not_ready"] = [f"{w['name']}: {w['not_ready'] or 'loading'}" for w in mine if not w["ready"]]
    except Exception as e:
        ok = False
        body["broker"] = f"unreachable: {_first_line(e)}"
    body["status"] = "ready" if ok else "unavailable"
    return body


def health_router(settings: ServiceSettings, caller_of: Callable[..., Caller]) -> APIRouter:
    router = APIRouter(tags=["health"])
    # which API process answers: `specq up` checks that the API on its port is the one it started
    instance = settings.instance_id or secrets.token_hex(8)

    @router.get("/healthz", summary="Liveness: this API process answers", response_model=S.Health,
                operation_id="healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "version": _version, "instance": instance}

    @router.get("/readyz", summary="Readiness: store, schema and broker ready to accept jobs",
                response_model=S.Ready, operation_id="readyz",
                responses={503: {"model": S.Ready, "description": "not ready", "headers": {
                    "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}}})
    async def readyz() -> JSONResponse:
        body = await run_in_threadpool(readiness, settings)
        body = S.Ready(**body).model_dump(mode="json")
        return JSONResponse(status_code=200 if body["status"] == "ready" else 503, content=body,
                            headers={} if body["status"] == "ready" else {"Retry-After": "10"})

    @router.get("/health", summary="Health as llama-server and vLLM serve it: 200 once this API can accept jobs",
                operation_id="health", response_model=S.Health,
                responses={503: {"model": S.ErrorBody, "description": "not ready (what is not, as /readyz says)"}})
    async def health() -> JSONResponse:
        body = await run_in_threadpool(readiness, settings)
        if body["status"] == "ready":
            return JSONResponse({"status": "ok", "version": _version})
        what = "; ".join(f"{k} {body[k]}" for k in ("database", "migrations", "broker") if body.get(k) != "ok")
        return error_response(503, f"not ready: {what or body['status']}", "unavailable_error")

    @router.get("/v1/workers", summary="Live workers: device, model, slots, busy, heartbeat age",
                response_model=S.WorkerList, operation_id="listWorkers", responses=responses(401, 503))
    def workers(caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        from .errors import ApiError

        try:
            records = _heartbeats(settings)
        except Exception as e:
            raise ApiError(503, f"the broker is unreachable: {_first_line(e)}", "unavailable") from None
        now = time.time()
        data = sorted((worker_view(r, now, caller.admin) for r in records), key=lambda w: w["name"])
        return {"object": "list", "data": data}

    return router


__all__ = ["health_router", "readiness", "worker_view"]
