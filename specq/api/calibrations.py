"""Calibrations through the service (issue 48 item 3; storage/calibrations.py, worker/calibration.py).

    POST   /v1/calibrations        admin only: {"lines": [{"text" | "document_id", "question", "answer"?}, ...],
                                   "lengths"?, "keep"?, "n"?, "task"?, "max_tokens"?} (the settings of `specq
                                   calibrate`). One unit (a job of kind `calibration`, lowest priority) per line
                                   and keep, run by the deployment's own workers. A line with `path` (a server
                                   path is never read), a malformed line, or a `document_id` the admin's tenant
                                   does not have: 400 naming the line, nothing stored. 201 with the calibration.
    GET    /v1/calibrations        admin only: every calibration, newest first (status, progress done/total)
    GET    /v1/calibrations/{id}   admin only: one, with the evidence rows written for it (`rows`)
    DELETE /v1/calibrations/{id}   admin only: cancel (queued units cancelled, running ones stopped; rows already
                                   written stay)

Rows are deployment-wide, so every route is an admin's. A read also writes the rows of any (length, keep) whose
units are all done and whose rows a worker did not get to write (it stopped between the two), exactly once.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from .. import __version__
from ..engine.calibration_lines import LineError, parse_line
from ..engine.policy.calibration_rows import DEFAULT_EDGES, service_rows
from ..settings import ServiceSettings
from ..storage import calibrations as store, db, jobs
from ..storage.keys import Caller
from ..storage.limits import max_input_bytes
from .auth import admin_only
from .errors import ApiError, responses
from .evidence import evidence_listing

#: the most lines one calibration takes
MAX_LINES = 5000


class CalibrationSettings(BaseModel):
    """The settings of `specq calibrate` (cli/calibrate.py), typed; `lines` are checked one by one after."""

    model_config = ConfigDict(extra="forbid")

    lines: list[Any] = Field(..., min_length=1, max_length=MAX_LINES)
    lengths: list[int] = Field(default_factory=lambda: list(DEFAULT_EDGES), min_length=1, max_length=32)
    keep: list[float] = Field(default_factory=lambda: [0.3], min_length=1, max_length=16)
    n: int = Field(0, ge=0, description="questions per length and keep at most, in line order (0: all)")
    task: Literal["lookup", "two-place", "aggregation", "review"] = "lookup"
    max_tokens: int = Field(32, ge=1, le=4096)

    @field_validator("lengths")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(x <= 0 for x in v):
            raise ValueError("lengths are positive token counts")
        return sorted(set(v))

    @field_validator("keep")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        if any(not 0.0 < k <= 1.0 for k in v):
            raise ValueError("each keep must be in (0, 1]")
        return list(dict.fromkeys(v))


#: the request body in /openapi.json (the route reads the raw body: each line is checked, and named, by parse_line)
BODY_DOC = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    **CalibrationSettings.model_json_schema(),
    "properties": {**CalibrationSettings.model_json_schema()["properties"],
                   "lines": {"type": "array", "minItems": 1, "maxItems": MAX_LINES, "description":
                             "one question a line: {\"text\" | \"document_id\", \"question\", \"answer\"?}",
                             "items": {"type": "object", "additionalProperties": False, "required": ["question"],
                                       "properties": {"text": {"type": "string"}, "document_id": {"type": "string"},
                                                      "question": {"type": "string"}, "answer": {"type": "string"}}}}}}}}}}


def _checked(body: bytes) -> tuple[CalibrationSettings, list[dict[str, Any]]]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the body must be a JSON object: {\"lines\": [...], \"keep\"?, \"lengths\"?, \"n\"?, "
                            "\"task\"?, \"max_tokens\"?}") from None
    try:
        cfg = CalibrationSettings.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        raise ApiError(400, f"{where}: {err['msg']}", param=where) from None
    lines = []
    for i, obj in enumerate(cfg.lines, 1):
        try:
            ln = parse_line(obj, f"line {i}", paths=False)
        except LineError as e:
            raise ApiError(400, str(e), param=f"lines.{i - 1}") from None
        lines.append({**ln, "line": i})
    return cfg, lines


def calibration_router(settings: ServiceSettings, caller_of: Callable[..., Caller]) -> APIRouter:
    router = APIRouter(tags=["calibrations"])
    admin = admin_only(caller_of)

    def finish(s, cal) -> None:
        """Rows of complete groups that no worker wrote yet (module doc); a group whose rows would not validate
        stays unwritten (the worker that finished its last unit logged why)."""
        try:
            store.write_groups(s, cal.id, service_rows(cal.id, specq=__version__, written_by="api"))
        except ValueError:
            pass

    @router.post("/v1/calibrations", status_code=201, summary="Calibrate mode auto on the deployment's workers (admin)",
                 operation_id="createCalibration", openapi_extra=BODY_DOC,
                 responses=responses(400, 401, 403, 413, 503))
    async def create_calibration(request: Request, caller: Caller = Depends(admin)) -> JSONResponse:
        cfg, lines = _checked(await request.body())

        def save() -> dict[str, Any]:
            from ..broker import enqueue_job

            with db.session() as s:
                try:
                    cal, ids = store.create(
                        s, tenant=caller.tenant, lines=lines, queue=settings.queue, max_attempts=settings.max_attempts,
                        limit_bytes=max_input_bytes(),
                        settings={"lengths": cfg.lengths, "keep": cfg.keep, "n": cfg.n, "task": cfg.task,
                                  "max_tokens": cfg.max_tokens, "lines": len(lines)},
                        params={"max_tokens": cfg.max_tokens, "task": cfg.task})
                except store.LineRefused as e:
                    raise ApiError(e.status, str(e)) from None
                body = store.summary(s, cal)  # built before any unit is queued (a worker may claim one at once)
                for job_id in ids:
                    try:
                        enqueue_job(job_id, settings)
                    except Exception as e:
                        message = (f"could not queue the calibration's units: broker unreachable ({type(e).__name__})")
                        for j in ids:
                            jobs.mark_failed(s, j, message)
                        raise ApiError(503, message, "unavailable") from None
                return body

        return JSONResponse(await run_in_threadpool(save), status_code=201)

    @router.get("/v1/calibrations", summary="Calibrations (admin)", operation_id="listCalibrations",
                responses=responses(401, 403))
    async def list_calibrations(limit: int = 50, caller: Caller = Depends(admin)) -> JSONResponse:
        def read() -> dict[str, Any]:
            with db.session() as s:
                out = []
                for cal in store.list_calibrations(s, caller.scope, limit=max(1, min(limit, 500))):
                    if cal.finished_at is None:
                        finish(s, cal)
                    out.append(store.summary(s, cal))
                return {"object": "list", "data": out}

        return JSONResponse(await run_in_threadpool(read))

    def one(cal_id: str, caller: Caller) -> dict[str, Any]:
        with db.session() as s:
            cal = store.get(s, cal_id, caller.scope)
            if cal is None:
                raise ApiError(404, f"no calibration {cal_id[:64]}", "not_found")
            finish(s, cal)
            out = store.summary(s, store.get(s, cal_id))
        # the rows as GET /v1/evidence lists them (passes, why not, in use, shadow checks)
        ids = {i for group in out["rows_written"].values() for i in group}
        out["rows"] = [r for r in evidence_listing()["data"] if r.get("id") in ids] if ids else []
        return out

    @router.get("/v1/calibrations/{cal_id}", summary="A calibration and its rows (admin)",
                operation_id="getCalibration", responses=responses(401, 403, 404))
    async def get_calibration(cal_id: str, caller: Caller = Depends(admin)) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(one, cal_id, caller))

    @router.delete("/v1/calibrations/{cal_id}", summary="Cancel a calibration (admin)",
                   operation_id="cancelCalibration", responses=responses(401, 403, 404))
    async def cancel_calibration(cal_id: str, caller: Caller = Depends(admin)) -> JSONResponse:
        def cancel() -> dict[str, Any]:
            with db.session() as s:
                if not store.request_cancel(s, cal_id, caller.scope):
                    raise ApiError(404, f"no calibration {cal_id[:64]}", "not_found")
            return one(cal_id, caller)

        return JSONResponse(await run_in_threadpool(cancel))

    return router


__all__ = ["calibration_router", "CalibrationSettings", "MAX_LINES"]
