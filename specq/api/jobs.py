"""The jobs API: submit a job, poll it, list jobs, cancel one, delete a finished one's data.

    POST   /v1/jobs             JSON `JobCreate` {text, question, params, filename}, or multipart
                                `file` + `question` + `params` (a JSON object as text)
                                -> 202 `JobCreated` {id, object, status}, Location: /v1/jobs/{id}
    GET    /v1/jobs/{id}        `JobOut`: status, progress, error, timestamps, input and, once it
                                succeeded, `result`
    GET    /v1/jobs/{id}/document  `JobDocument`: the document and question the job was given (the
                                kept spans of its result are character offsets into this text)
    GET    /v1/jobs             ?status=queued,running&batch_id=&limit=&offset= -> `JobList` (rows
                                without the document, system message or result: a file name, the
                                question's first 120 characters and the batch's name instead; a
                                succeeded row's `ran` says which mode ran and why)
    DELETE /v1/jobs/{id}        cancel: queued -> cancelled now; running -> stops at its next phase,
                                window or token
    DELETE /v1/jobs/{id}/data   a finished job's document, question, result and timings, and the job
                                itself, deleted (409 while it is queued or running)

Every body is validated by its model (`specq.api.schemas`) before anything is stored; the API stores
the job, then sends only its id to the broker by task name.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from ..contracts import InputError
from ..engine.inputs import check_text, decode_document
from ..engine.options import RunParams
from ..settings import ServiceSettings
from ..storage import db, jobs, lifecycle, limits, results
from ..storage.errors import InputTooLarge
from ..storage.keys import Caller
from ..storage.models import JOB_STATUSES, unix
from ..storage.quotas import QuotaExceeded, reserve_queued
from . import schemas as S
from .errors import ApiError, describe, from_validation, json_error, responses
from .query import OFFSET, limit_query, parse_statuses, status_query
from .views import job_summary, job_view

JSON_TYPES = ("application/json",)
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
#: a job id in a path: what `jobs.new_job_id` makes is 28 characters; anything over MAX_ID_CHARS is none
JobId = Path(..., min_length=1, max_length=S.MAX_ID_CHARS, description="a job id (job_…)")

JOB_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/JobCreate"}},
            "multipart/form-data": {"schema": S.JOB_FORM_SCHEMA},
        },
    }
}


def links(value: str, param: str, *operations: str) -> dict[str, Any]:
    """OpenAPI links from a response to `operations`, passing `value` (a runtime expression) as `param`
    (clients and schemathesis' stateful tests follow them: create -> read -> list -> cancel -> delete).
    Lists are link targets only: what a list holds depends on every earlier request, and a link whose
    source changes between two runs of the same generated sequence makes the sequence unreproducible."""
    return {op[0].upper() + op[1:]: {"operationId": op, "parameters": {param: value}} for op in operations}


def jobs_router(settings: ServiceSettings, caller_of: Callable[..., Caller]) -> APIRouter:
    router = APIRouter(tags=["jobs"])

    @router.post("/v1/jobs", status_code=202, openapi_extra=JOB_BODY_DOC, summary="Submit a job",
                 operation_id="createJob", response_model=S.JobCreated,
                 responses={202: {"links": {**links("$response.body#/id", "job_id", "getJob", "cancelJob",
                                                    "deleteJobData"),
                                            "ListJobs": {"operationId": "listJobs", "parameters": {"status": "queued"}}},
                                  "headers": {"Location": {"description": "/v1/jobs/{id}", "schema": {"type": "string"}}}},
                            **responses(400, 401, 404, 413, 415, 422, 429, 503)})  # 404: an unknown document_id
    async def submit_job(request: Request, caller: Caller = Depends(caller_of)) -> JSONResponse:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        document_id = None
        if ctype in JSON_TYPES:
            text, question, raw_params, filename, document_id = await _read_json(request)
        elif ctype in FORM_TYPES:
            text, question, raw_params, filename = await _read_form(request)
        else:
            raise ApiError(415, "send application/json {text, question, params} or multipart/form-data "
                                "with file, question and params", "unsupported_media_type")
        params = run_params(raw_params, question)
        job = await run_in_threadpool(_store_and_enqueue, settings, text, params, filename, caller.tenant,
                                      document_id=document_id)
        return JSONResponse(status_code=202, content=job, headers={"Location": f"/v1/jobs/{job['id']}"})

    @router.get("/v1/jobs/{job_id}", summary="A job: status, progress and, when done, its result",
                operation_id="getJob", response_model=S.JobOut, responses=responses(401, 404, 422))
    def get_job(job_id: str = JobId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            job = jobs.get_job(s, job_id, tenant=caller.scope)
            if job is None:
                raise ApiError(404, f"no job {job_id}", "not_found")
            return job_view(s, job)

    @router.get("/v1/jobs/{job_id}/document", summary="The document and question a job was given",
                operation_id="getJobDocument", response_model=S.JobDocument, responses=responses(401, 404, 422))
    def get_job_document(job_id: str = JobId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            inp = jobs.get_input(s, job_id, tenant=caller.scope)
            if inp is None:
                raise ApiError(404, f"no job {job_id}", "not_found")
            return {"id": job_id, "object": "job.document", "filename": inp.filename, "size_bytes": inp.size_bytes,
                    "question": inp.question or "", "text": inp.text}

    @router.get("/v1/jobs", summary="List jobs, newest first", operation_id="listJobs", response_model=S.JobList,
                responses=responses(401, 422))
    def list_jobs(
        status: str | None = status_query(JOB_STATUSES),
        batch_id: str | None = Query(None, min_length=1, max_length=S.MAX_ID_CHARS,
                                     description="only the jobs of this batch"),
        limit: int = limit_query(50),
        offset: int = OFFSET,
        caller: Caller = Depends(caller_of),
    ) -> dict[str, Any]:
        statuses = parse_statuses(status, JOB_STATUSES, ApiError)
        limit = min(limit, settings.max_list_limit)
        with db.session() as s:
            rows = jobs.list_jobs(s, status=statuses, tenant=caller.scope, batch_id=batch_id, limit=limit, offset=offset)
            total = jobs.count_jobs(s, status=statuses, tenant=caller.scope, batch_id=batch_id)
            specs = results.ran_specs(s, [j.id for j in rows if j.status == "succeeded"])
            labels = jobs.list_labels(s, [j.id for j in rows])
            return {"object": "list", "data": [job_summary(j, specs.get(j.id), labels.get(j.id)) for j in rows],
                    "total": total,
                    "limit": limit, "offset": offset}

    @router.delete("/v1/jobs/{job_id}", summary="Cancel a queued or running job", operation_id="cancelJob",
                   response_model=S.JobSummary, responses={200: {"links": links("$response.body#/id", "job_id",
                                                                                "getJob", "deleteJobData")},
                                                           **responses(401, 404, 409, 422)})
    def cancel_job(job_id: str = JobId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            job = jobs.request_cancel(s, job_id, tenant=caller.scope)
            if job is None:
                raise ApiError(404, f"no job {job_id}", "not_found")
            if job.status in ("succeeded", "failed"):
                raise ApiError(409, f"job {job_id} already {job.status}: nothing to cancel", "conflict")
            return job_summary(job, labels=jobs.list_labels(s, [job.id]).get(job.id))

    @router.delete("/v1/jobs/{job_id}/data", summary="Delete a finished job and all its data",
                   operation_id="deleteJobData", response_model=S.Deleted, responses=responses(401, 404, 409, 422))
    def delete_job_data(job_id: str = JobId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        return deleted("job", job_id, lambda s: 1 if lifecycle.delete_job(s, job_id, tenant=caller.scope) else None)

    return router


def deleted(kind: str, id_: str, delete: Callable[[Any], int | None]) -> dict[str, Any]:
    """Run `delete(session)` (the number of jobs deleted, None if there is no such `kind`) and answer
    like OpenAI's deletes: {id, object: "<kind>.deleted", deleted: true}; 404, or 409 if unfinished."""
    with db.session() as s:
        try:
            n = delete(s)
        except lifecycle.NotFinished as e:
            raise ApiError(409, str(e), "conflict") from None
    if n is None:
        raise ApiError(404, f"no {kind} {id_}", "not_found")
    return {"id": id_, "object": f"{kind}.deleted", "deleted": True, "jobs_deleted": n}


# --- reading a request ----------------------------------------------------------------------------------


def run_params(raw: dict[str, Any], question: str | None) -> RunParams:
    """RunParams from a request's (already schema-checked) params and question; 422 otherwise."""
    merged = dict(raw)
    if question is not None:
        merged["question"] = question
    try:
        return RunParams.from_dict(merged)
    except InputError as e:
        raise ApiError(422, f"params: {e}", "invalid_params") from None


def check_document(text: str, name: str = "text") -> None:
    """413 for a document over SPECQ_MAX_INPUT_BYTES, 422 for an empty or binary-looking one."""
    size = len(text.encode("utf-8", "surrogatepass"))
    limit = limits.max_input_bytes()
    if size > limit:
        raise ApiError(413, str(InputTooLarge(size, limit)), "too_large")
    try:
        check_text(text, name=name)
        S.storable(text)
    except (InputError, ValueError) as e:
        raise ApiError(422, f"{name}: {e}" if not str(e).startswith(name) else str(e), "invalid_input") from None


def text_or_document(text: str | None, document_id: str | None, where: str = "") -> None:
    """Exactly one of `text` and `document_id` (422 otherwise); a text is checked like a document."""
    if text is None and document_id is None:
        raise ApiError(422, f"{where}text: required (the document), or document_id (a stored document)",
                       "invalid_input")
    if text is not None and document_id is not None:
        raise ApiError(422, f"{where}give text or document_id, not both", "invalid_input")
    if text is not None:
        check_document(text)


async def _read_json(request: Request) -> tuple[str, str | None, dict, str | None, str | None]:
    raw = await request.body()
    return await run_in_threadpool(_parse_json, raw)  # megabytes of text: checked off the event loop


def _parse_json(raw: bytes) -> tuple[str, str | None, dict, str | None, str | None]:
    try:
        body = S.JobCreate.model_validate_json(raw)
    except ValidationError as e:
        raise from_validation(e) from None
    text_or_document(body.text, body.document_id)
    return body.text or "", body.question, S.params_dict(body.params), body.filename, body.document_id


def parse_params_field(raw: Any, name: str = "params") -> dict[str, Any]:
    """A form field holding RunParams as a JSON object -> the keys it sets; 422 otherwise."""
    if not isinstance(raw, str):
        raise ApiError(422, f"{name} must be a text field holding a JSON object", "invalid_params")
    try:
        return S.params_dict(S.RunParamsIn.model_validate_json(raw))
    except ValidationError as e:
        first = e.errors(include_url=False)[0] if e.errors() else {}
        if first.get("type") == "json_invalid":
            raise json_error(str(first.get("msg", "")), name, 422) from None
        if first.get("type") == "model_type" and not first.get("loc"):
            raise ApiError(422, f"{name} must be a JSON object", "invalid_params") from None
        raise ApiError(422, describe(e.errors(include_url=False), name), "invalid_params") from None


def form_text(form, name: str, type_: Any) -> str | None:
    """A text field of a form, checked against its schema type; None when absent."""
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(422, f"{name} must be a text field", "invalid_params")
    return check_field(value, name, type_)


def check_field(value: Any, name: str, type_: Any) -> Any:
    """`value` checked against a schema type (e.g. `schemas.Name`); 422 naming `name` otherwise."""
    try:
        return _adapter(type_).validate_python(value)
    except ValidationError as e:
        raise ApiError(422, describe(e.errors(include_url=False), name), "invalid_params") from None


_adapters: dict[int, Any] = {}


def _adapter(type_: Any):
    from pydantic import TypeAdapter

    key = id(type_)
    if key not in _adapters:
        _adapters[key] = TypeAdapter(type_)
    return _adapters[key]


async def _read_form(request: Request) -> tuple[str, str | None, dict, str | None]:
    try:
        form = await request.form(max_files=1, max_fields=8, max_part_size=1 << 20)
    except ApiError:
        raise
    except Exception as e:
        if getattr(e, "status_code", None) == 413:
            raise
        raise ApiError(400, f"bad multipart body: {str(e)[:200]}", "invalid_request") from None
    try:
        unknown = sorted(str(k)[:40] for k in set(form.keys()) - {"file", "question", "params"})
        if unknown:
            raise ApiError(422, f"unknown form field(s): {', '.join(unknown[:8])} (known: file, question, params; "
                                "engine options go in params as a JSON object)", "invalid_params")
        if len(form.getlist("file")) > 1 or len(form.getlist("question")) > 1 or len(form.getlist("params")) > 1:
            raise ApiError(422, "send each of file, question and params at most once", "invalid_params")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError(422, "file is required (a multipart file part)", "invalid_params")
        filename = check_field(upload.filename or "file", "the file name", S.Name)
        question = form_text(form, "question", S.Question)
        raw = form.get("params")
        params = parse_params_field(raw) if raw is not None else {}
        limit = limits.max_input_bytes()
        data = await upload.read(limit + 1)
        if len(data) > limit:
            size = upload.size if upload.size is not None else len(data)
            raise ApiError(413, str(InputTooLarge(max(size, len(data)), limit)), "too_large")
        try:
            text = await run_in_threadpool(decode_document, data, name=filename)  # off the event loop
        except InputError as e:
            raise ApiError(422, str(e), "invalid_input") from None
        return text, question, params, filename
    finally:
        await form.close()


def _store_and_enqueue(settings: ServiceSettings, text: str, params: RunParams | dict, filename: str | None,
                       tenant: str, stamps: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """Store the job (`fields`: kind, model, messages of an OpenAI request), then queue it; the response
    body, built before the job is queued. `stamps` (OpenAI routes) gets the job's trace stamp `queued`
    (storage.trace) and `created`, its created_at in unix seconds (the answer's `created`: no second
    read of the row)."""
    from ..broker import enqueue_job

    with db.session() as s:
        try:
            reserve_queued(s, tenant, 1, settings.max_queued_jobs)  # the insert below is in its transaction
            job = jobs.create_job(s, text=text, params=params, filename=filename, tenant=tenant,
                                  max_attempts=settings.max_attempts, queue=settings.queue, **fields)
        except QuotaExceeded as e:
            raise ApiError(429, str(e), "too_many_requests") from None
        except InputTooLarge as e:
            raise ApiError(413, str(e), "too_large") from None
        except jobs.UnknownDocument as e:
            raise ApiError(404, str(e), "not_found") from None
        body = S.JobCreated(id=job.id, status=job.status).model_dump(mode="json")
        json.dumps(body, allow_nan=False)  # serialisable, before any worker can see the job
        try:
            enqueue_job(job.id, settings)
        except Exception as e:
            message = f"could not queue the job: broker unreachable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            jobs.mark_failed(s, job.id, message)
            raise ApiError(503, message, "unavailable") from None
        if stamps is not None:
            stamps.update(queued=time.time(), created=unix(job.created_at))
        return body


store_and_enqueue = _store_and_enqueue

__all__ = ["jobs_router", "store_and_enqueue", "links", "deleted", "run_params", "check_document", "text_or_document", "parse_params_field",
           "form_text", "check_field", "JobId"]
