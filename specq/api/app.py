"""The REST API (FastAPI): submit jobs, poll them, list them, cancel them.

    POST   /v1/jobs         JSON {text, question, params} or multipart file + question + params
                            -> 202 {id, object, status}
    GET    /v1/jobs/{id}    the job: status, progress {phase, done, total}, error, timestamps and,
                            once it succeeded, `result` (the run result object)
    GET    /v1/jobs         ?status=queued,running&limit=&offset= -> {object: list, data, total}
    DELETE /v1/jobs/{id}    cancel: queued -> cancelled now; running -> stops at its next phase,
                            window or token
    GET    /healthz         database and broker reachable
    GET    /docs, /openapi.json

Who may call, and which tenant's jobs each caller sees: `specq.api.auth` (SPECQ_AUTH).
Every error is JSON `{"error": {"message": "...", "type": "..."}}` with a 4xx/5xx status. Params
are `RunParams` fields (the CLI's long options in snake_case); unknown or bad ones answer 422 and
nothing is stored. The API stores the job, then sends only its id to the broker by task name, so
this process never imports the worker or llama.cpp.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__ as _version
from ..contracts import InputError
from ..engine.inputs import check_text, decode_document
from ..engine.options import RunParams
from ..settings import ServiceSettings
from ..storage import db, jobs, results
from ..storage.errors import InputTooLarge
from ..storage.keys import Caller
from ..storage.quotas import QuotaExceeded, reserve_queued
from ..storage.models import JOB_STATUSES
from .auth import admin_only, authenticator
from .query import parse_statuses
from .validate import MAX_NAME_CHARS, check_storable

log = logging.getLogger("specq.api")

#: top-level keys of a JSON job request
_JSON_KEYS = {"text", "question", "params", "filename"}
#: fields of a multipart job request
_FORM_KEYS = {"file", "question", "params"}


class ApiError(HTTPException):
    def __init__(self, status_code: int, message: str, type_: str = "invalid_request") -> None:
        super().__init__(status_code=status_code, detail=message)
        self.type = type_


def _error(status: int, message: str, type_: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": type_}})


_TYPES = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          409: "conflict", 413: "too_large", 415: "unsupported_media_type", 422: "invalid_params",
          429: "too_many_requests", 503: "unavailable"}


class _BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, before reading them whole."""

    def __init__(self, app, limit: int, batch_limit: int | None = None) -> None:
        self.app = app
        self.limit = limit
        #: batch uploads (POST /v1/batches) carry many documents: their own, larger limit
        self.batch_limit = batch_limit or limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        batch = scope.get("path", "").startswith("/v1/batches")
        limit = self.batch_limit if batch else self.limit
        var = "SPECQ_MAX_BATCH_BYTES" if batch else "SPECQ_MAX_REQUEST_BYTES"
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    size = 0
                if size > limit:
                    resp = _error(413, f"request body is {size} bytes, over the limit of {limit} bytes "
                                       f"({var})", "too_large")
                    return await resp(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise ApiError(413, f"request body is over the limit of {limit} bytes ({var})",
                                   "too_large")
            return message

        return await self.app(scope, limited_receive, send)


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """The API app for `settings` (default: SPECQ_* from the environment)."""
    settings = settings or ServiceSettings.from_env()
    app = FastAPI(
        title="specq",
        version=_version,
        description="Long-prompt LLM jobs: submit a document and a question, poll for the answer and its "
        "per-phase timings.",
    )
    app.state.settings = settings
    app.add_middleware(_BodyLimit, limit=settings.resolved_max_request_bytes(), batch_limit=settings.max_batch_bytes)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        type_ = getattr(exc, "type", None) or _TYPES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        resp = _error(exc.status_code, message, type_)
        if exc.status_code == 401:
            resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("query", "path", "body"))
            parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
        return _error(422, "; ".join(parts) or "invalid request", "invalid_params")

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return _error(500, f"internal error: {type(exc).__name__}", "internal")

    #: the caller (tenant, admin) of each request; SPECQ_AUTH=keys checks its key (specq.api.auth)
    caller_of = authenticator(settings)

    # --- jobs -----------------------------------------------------------------------------------------
    job_body_doc = {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["text"],
                        "properties": {
                            "text": {"type": "string", "description": "the document (UTF-8 text)"},
                            "question": {"type": "string", "description": "the question asked about it"},
                            "params": {"type": "object", "description": "RunParams: keep, max_tokens, mode, …"},
                            "filename": {"type": "string", "description": "a name kept with the job"},
                        },
                        "additionalProperties": False,
                    }
                },
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["file"],
                        "properties": {
                            "file": {"type": "string", "format": "binary"},
                            "question": {"type": "string"},
                            "params": {"type": "string", "description": "a JSON object of RunParams"},
                        },
                    }
                },
            },
        }
    }

    @app.post("/v1/jobs", status_code=202, openapi_extra=job_body_doc, summary="Submit a job")
    async def submit_job(request: Request, caller: Caller = Depends(caller_of)) -> JSONResponse:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "application/json":
            text, question, raw_params, filename = await _read_json(request)
        elif ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
            text, question, raw_params, filename = await _read_form(request)
        else:
            raise ApiError(415, "send application/json {text, question, params} or multipart/form-data "
                                "with file, question and params", "unsupported_media_type")
        try:
            merged = dict(raw_params)
            if question is not None:
                merged["question"] = question
            params = RunParams.from_dict(merged)
        except InputError as e:
            raise ApiError(422, str(e), "invalid_params") from None
        job = await run_in_threadpool(_store_and_enqueue, settings, text, params, filename, caller.tenant)
        body = {"id": job.id, "object": "job", "status": job.status}
        return JSONResponse(status_code=202, content=body, headers={"Location": f"/v1/jobs/{job.id}"})

    @app.get("/v1/jobs/{job_id}", summary="A job: status, progress and, when done, its result")
    def get_job(job_id: str, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            job = jobs.get_job(s, job_id, tenant=caller.scope)
            if job is None:
                raise ApiError(404, f"no job {job_id}", "not_found")
            return _job_view(s, job, with_result=True)

    @app.get("/v1/jobs", summary="List jobs, newest first")
    def list_jobs(
        status: str | None = Query(None, description="one status or several, comma-separated"),
        limit: int = Query(50, ge=1),
        offset: int = Query(0, ge=0),
        caller: Caller = Depends(caller_of),
    ) -> dict[str, Any]:
        statuses = parse_statuses(status, JOB_STATUSES, ApiError)
        limit = min(limit, settings.max_list_limit)
        with db.session() as s:
            rows = jobs.list_jobs(s, status=statuses, tenant=caller.scope, limit=limit, offset=offset)
            total = jobs.count_jobs(s, status=statuses, tenant=caller.scope)
            return {"object": "list", "data": [_job_view(s, j) for j in rows], "total": total,
                    "limit": limit, "offset": offset}

    @app.delete("/v1/jobs/{job_id}", summary="Cancel a queued or running job")
    def cancel_job(job_id: str, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            job = jobs.request_cancel(s, job_id, tenant=caller.scope)
            if job is None:
                raise ApiError(404, f"no job {job_id}", "not_found")
            if job.status in ("succeeded", "failed"):
                raise ApiError(409, f"job {job_id} already {job.status}: nothing to cancel", "conflict")
            return _job_view(s, job)

    @app.get("/healthz", summary="Database and broker reachable")
    def healthz() -> JSONResponse:
        from ..broker import check_broker

        checks: dict[str, str] = {}
        ok = True
        try:
            with db.get_engine().connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            checks["database"] = "ok"
        except Exception as e:
            ok, checks["database"] = False, f"unreachable: {str(e).splitlines()[0]}"
        try:
            check_broker(settings)
            checks["broker"] = "ok"
        except Exception as e:
            ok, checks["broker"] = False, f"unreachable: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        body = {"status": "ok" if ok else "unavailable", "version": _version, **checks,
                "broker_kind": "embedded" if settings.embedded_broker else "redis", "queue": settings.queue}
        return JSONResponse(status_code=200 if ok else 503, content=body)

    # --- batches and metrics (specq.api.batches, specq.api.metrics) --------------------------------------
    from .batches import batches_router
    from .metrics import metrics_router

    app.include_router(batches_router(settings, caller_of, ApiError))
    # /metrics counts every tenant's jobs: with keys on, only admin keys may read it
    app.include_router(metrics_router(settings), dependencies=[Depends(admin_only(caller_of))])

    return app


# --- request parsing ----------------------------------------------------------------------------------


def _limit() -> int:
    return jobs.max_input_bytes()


async def _read_json(request: Request) -> tuple[str, str | None, dict, str | None]:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ApiError(400, f"request body is not valid JSON: {e}", "invalid_request") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object {text, question, params}", "invalid_request")
    unknown = sorted(set(data) - _JSON_KEYS)
    if unknown:
        raise ApiError(422, f"unknown field(s): {', '.join(unknown)} (known: {', '.join(sorted(_JSON_KEYS))}; "
                            "engine options go in params)", "invalid_params")
    text = data.get("text")
    if not isinstance(text, str):
        raise ApiError(422, "text is required and must be a string (the document)", "invalid_params")
    question = data.get("question")
    if question is not None and not isinstance(question, str):
        raise ApiError(422, "question must be a string", "invalid_params")
    params = data.get("params") or {}
    if not isinstance(params, dict):
        raise ApiError(422, "params must be a JSON object", "invalid_params")
    filename = data.get("filename")
    if filename is not None and not isinstance(filename, str):
        raise ApiError(422, "filename must be a string", "invalid_params")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > _limit():
        raise ApiError(413, str(InputTooLarge(size, _limit())), "too_large")
    try:
        text.encode("utf-8")
        check_text(text, name="text")
        check_storable(question, "question")
        check_storable(filename, "filename", MAX_NAME_CHARS)
        check_storable(params, "params")
    except UnicodeEncodeError:
        raise ApiError(422, "text contains lone surrogates; send UTF-8 text", "invalid_input") from None
    except InputError as e:
        raise ApiError(422, str(e), "invalid_input") from None
    return text, question, params, filename


async def _read_form(request: Request) -> tuple[str, str | None, dict, str | None]:
    try:
        form = await request.form(max_files=1, max_fields=8, max_part_size=1 << 20)
    except HTTPException:
        raise
    except Exception as e:
        raise ApiError(400, f"bad multipart body: {e}", "invalid_request") from None
    try:
        unknown = sorted(set(form.keys()) - _FORM_KEYS)
        if unknown:
            raise ApiError(422, f"unknown form field(s): {', '.join(unknown)} (known: file, question, params; "
                                "engine options go in params as a JSON object)", "invalid_params")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError(422, "file is required (a multipart file part)", "invalid_params")
        limit = _limit()
        data = await upload.read(limit + 1)
        filename = upload.filename or "file"
        if len(data) > limit:
            size = upload.size if upload.size is not None else len(data)
            raise ApiError(413, str(InputTooLarge(max(size, len(data)), limit)), "too_large")
        try:
            check_storable(filename, "the file name", MAX_NAME_CHARS)
            text = decode_document(data, name=filename)
        except InputError as e:
            raise ApiError(422, str(e), "invalid_input") from None
        question = form.get("question")
        if question is not None and not isinstance(question, str):
            raise ApiError(422, "question must be a text field", "invalid_params")
        params: dict = {}
        raw = form.get("params")
        if raw is not None:
            if not isinstance(raw, str):
                raise ApiError(422, "params must be a text field holding a JSON object", "invalid_params")
            if raw.strip():
                try:
                    params = json.loads(raw)
                except (ValueError, RecursionError) as e:
                    raise ApiError(422, f"params is not valid JSON: {e}", "invalid_params") from None
                if not isinstance(params, dict):
                    raise ApiError(422, "params must be a JSON object", "invalid_params")
        try:
            check_storable(question, "question")
            check_storable(params, "params")
        except InputError as e:
            raise ApiError(422, str(e), "invalid_input") from None
        return text, question, params, filename
    finally:
        await form.close()


def _store_and_enqueue(settings: ServiceSettings, text: str, params: RunParams, filename: str | None, tenant: str):
    from ..broker import enqueue_job

    with db.session() as s:
        try:
            reserve_queued(s, tenant, 1, settings.max_queued_jobs)  # the insert below is in its transaction
            job = jobs.create_job(s, text=text, params=params, filename=filename, tenant=tenant,
                                  max_attempts=settings.max_attempts)
        except QuotaExceeded as e:
            raise ApiError(429, str(e), "too_many_requests") from None
        except InputTooLarge as e:
            raise ApiError(413, str(e), "too_large") from None
        try:
            enqueue_job(job.id, settings)
        except Exception as e:
            message = f"could not queue the job: broker unreachable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            jobs.mark_failed(s, job.id, message)
            raise ApiError(503, message, "unavailable") from None
        return job


def _job_view(s, job, *, with_result: bool = False) -> dict[str, Any]:
    d = job.to_dict()
    if with_result:
        d["result"] = results.get_result(s, job.id) if job.status == "succeeded" else None
        inp = jobs.get_input(s, job.id)
        if inp is not None:
            d["input"] = {"filename": inp.filename, "size_bytes": inp.size_bytes, "question": inp.question}
    return d


__all__ = ["create_app"]
