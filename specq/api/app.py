"""The REST API (FastAPI): the app, assembled from its routers.

    /v1/jobs…           specq.api.jobs      submit, poll, list, cancel, delete a job's data
    /v1/jobs/{id}/events specq.api.events   a job's events (SSE): status, progress, answer text
    /v1/batches…        specq.api.batches   many requests as one unit (OpenAI's Batch API + native
                                            JSONL/multipart); JSONL/CSV exports
    /v1/models          specq.api.openai_models  the workers' models (OpenAI format)
    /v1/chat/completions, /v1/completions   specq.api.openai_chat  OpenAI's, streaming or not
    /v1/files…          specq.api.files     OpenAI's Files API (batch input, batch output files)
    /healthz, /health, /readyz  specq.api.health  liveness (/health as llama-server and vLLM have it); can
                                            this API accept jobs
    any other path      specq.api.openai_unserved  an OpenAI-shaped 404 (/v1/embeddings, /v1/responses, …)
    /v1/workers         specq.api.health    the live workers (heartbeats)
    /v1/evidence        specq.api.evidence  mode auto's quality evidence rows (POST: admins)
    /metrics            specq.api.metrics   Prometheus text (admins only with keys on)
    /ui…, /docs         specq.api.ui        the web page; Swagger UI (every asset served here, no CDN)
    /openapi.json

Request and response bodies are the models of `specq.api.schemas`; who may call and which tenant's
rows each caller sees: `specq.api.auth` (SPECQ_AUTH). Every error is JSON
`{"error": {"message": "...", "type": "..."}}` (`specq.api.errors`). Before routing, every request
passes `specq.api.guard` (body size, Host/Origin in no-auth mode, NUL in the URL, HEAD, stream
slots); how connections are accepted and timed out: `specq.api.server`. The API stores a job, then
sends only its id to the broker by task name, so this process never imports the worker or llama.cpp.
"""

from __future__ import annotations

import logging

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError, ResponseValidationError
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema
from sqlalchemy.exc import DBAPIError, DisconnectionError, PendingRollbackError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from .. import __version__ as _version
from ..settings import ServiceSettings
from ..storage.retry import is_transient
from . import openai_schemas as O
from . import schemas as S
from .auth import admin_only, authenticator
from .errors import ApiError, describe, error_response, http_error_response
from .guard import BodyLimit, RequestGuard, StreamSlots
from .openai_unserved import unserved_response

log = logging.getLogger("specq.api")

#: request bodies that routes read themselves (JSON or multipart on one path): their models are added
#: to the OpenAPI components so the request bodies can refer to them
BODY_MODELS = [S.JobCreate, S.BatchLine, O.ChatCompletionRequest, O.CompletionRequest, O.BatchCreate,
               *S.EVENT_MODELS.values()]


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """The API app for `settings` (default: SPECQ_* from the environment)."""
    settings = settings or ServiceSettings.from_env()
    app = FastAPI(
        title="specq",
        version=_version,
        description="Long-prompt LLM jobs: submit a document and a question, poll for the answer and its "
        "per-phase timings.",
        lifespan=_lifespan(settings),
        # FastAPI's own /docs and /redoc load their scripts from a CDN: specq.api.ui serves /docs itself
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    # outermost last: the guard sees every request first, then the body limit, then the stream slots
    app.add_middleware(StreamSlots, limit=settings.resolved_max_streams)
    app.add_middleware(BodyLimit, limit=settings.resolved_max_request_bytes(), batch_limit=settings.max_batch_bytes)
    app.add_middleware(RequestGuard, settings=settings)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 405:
            allow = allowed_methods(app, request.scope)
            return error_response(405, f"{request.method} is not allowed on {request.url.path} (allowed: {allow})",
                                  "method_not_allowed", headers={"Allow": allow})
        if exc.status_code == 404 and not isinstance(exc, ApiError):  # no route matched: not a route's own 404
            return unserved_response(request.method, request.url.path)
        return http_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return error_response(422, describe(list(exc.errors())), "invalid_params")

    @app.exception_handler(ResponseValidationError)
    async def _response_error(request: Request, exc: ResponseValidationError):
        log.error("response of %s %s does not fit its schema: %s", request.method, request.url.path,
                  describe(list(exc.errors())))
        return error_response(500, "internal error: the response did not fit its schema", "internal")

    async def _store_error(request: Request, exc: Exception):
        """A store error raised in a route: 503 + Retry-After when it is transient (the store unreachable,
        restarting, busy (SQLite) or this request's transaction a deadlock victim: nothing was stored, each
        storage call being one transaction, and the same request may go through in a moment; SDKs retry
        it), else the 500 below. Handled here, inside the app, so the response goes out as any other."""
        if not is_transient(exc):
            return await _internal_error(request, exc)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        log.warning("store unavailable on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, first)
        return error_response(503, f"the job store is unavailable or busy ({type(exc).__name__}): try again shortly",
                              "unavailable")

    for store_error in (DBAPIError, DisconnectionError, PendingRollbackError):
        app.add_exception_handler(store_error, _store_error)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}", "internal")

    #: the caller (tenant, admin) of each request; SPECQ_AUTH=keys checks its key (specq.api.auth)
    caller_of = authenticator(settings)

    from .batches import batches_router
    from .calibrations import calibration_router
    from .documents import documents_router
    from .evidence import evidence_router
    from .events import events_router
    from .files import files_router
    from .health import health_router
    from .jobs import jobs_router
    from .metrics import metrics_router
    from .openai_chat import openai_router
    from .openai_models import ModelCatalog, models_router
    from .ui import ui_router

    catalog = ModelCatalog(settings)
    app.include_router(jobs_router(settings, caller_of))
    app.include_router(documents_router(settings, caller_of))
    app.include_router(evidence_router(caller_of))
    app.include_router(calibration_router(settings, caller_of))
    app.include_router(events_router(settings, caller_of))
    app.include_router(batches_router(settings, caller_of, catalog))
    app.include_router(models_router(catalog, caller_of))
    app.include_router(openai_router(settings, caller_of, catalog))
    app.include_router(files_router(settings, caller_of))
    app.include_router(health_router(settings, caller_of))
    app.include_router(ui_router(settings))
    # /metrics counts every tenant's jobs: with keys on, only admin keys may read it
    app.include_router(metrics_router(settings), dependencies=[Depends(admin_only(caller_of))])
    app.openapi = lambda: _openapi(app)
    return app


#: the methods `Allow` can list
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(app: FastAPI, scope) -> str:
    """The methods some route answers on this path (HEAD wherever GET is), for `Allow`."""
    methods = {m for m in METHODS
               if any(route.matches({**scope, "method": m})[0] == Match.FULL for route in app.router.routes)}
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def _openapi(app: FastAPI) -> dict:
    if app.openapi_schema is None:
        spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        _, defs = models_json_schema([(m, "validation") for m in BODY_MODELS],
                                     ref_template="#/components/schemas/{model}")
        spec.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        # what RequestGuard may answer before any route runs: 400 (a NUL in the URL, a bad Host), 403
        # (a cross-origin browser request without keys)
        common = {"400": "bad request (e.g. a NUL in the URL; a Host this API does not answer to)",
                  "403": "forbidden (e.g. a cross-origin browser request without API keys)"}
        for path_item in spec.get("paths", {}).values():
            for operation in path_item.values():
                for status, description in common.items():
                    operation.setdefault("responses", {}).setdefault(status, {
                        "description": description,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
        app.openapi_schema = spec
    return app.openapi_schema


def _lifespan(settings: ServiceSettings):
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        from .retention import RetentionTask

        task = RetentionTask(settings)
        task.start()
        try:
            yield
        finally:
            task.stop()

    return lifespan


__all__ = ["create_app", "ApiError", "allowed_methods"]
