"""The batches API (OpenAI Batch API-like): many documents and questions as one unit of work.

    POST /v1/batches                  multipart: `input` = a JSONL file, one request per line
                                      {"custom_id", "text", "question", "params"}; or one or more
                                      `file` parts (documents, custom_id = file name) + `question`;
                                      both with optional `params` (defaults for every request, a JSON
                                      object) and `metadata` (a JSON object; `name` names the batch).
                                      Or the JSONL itself as the body (content-type application/jsonl).
                                      -> 200 the batch: `in_progress`, or `failed` with `errors`
                                      (each with the line number of a bad request)
    GET  /v1/batches                  ?status=&name=&limit=&offset= -> {object: list, data, total}
    GET  /v1/batches/{id}             the batch: status, request_counts, timestamps, metadata
    GET  /v1/batches/{id}/results     JSONL, one line per succeeded request, in request order:
                                      {"id", "custom_id", "status", "result": <run result object>}
                                      without `selection` (?include=selection adds it);
                                      ?format=csv flattens usage and timings into columns
    GET  /v1/batches/{id}/errors      JSONL of failed and cancelled requests {"id", "custom_id",
                                      "status", "error": {"message"}}
    GET  /v1/batches/{id}/stats       count, per-phase p50/p95/mean, mean kept ratio (SQL)
    POST /v1/batches/{id}/cancel      cancelling -> cancelled; finished results stay
    DELETE /v1/batches/{id}/data      a finished batch, its jobs and all their data deleted, with its
                                      files (output, errors, the input this create stored; 409 while it
                                      runs)

Bodies are validated by the models of `specq.api.schemas` (`BatchLine` per JSONL line,
`BatchFormFields` for the form) before anything is stored. CSV cells that a spreadsheet would run as
a formula (starting with = + - @, a tab or a carriage return) get a leading `'` (OWASP CSV injection);
JSONL is exported as stored.

The batch's jobs are ordinary jobs (`batch_id`, `custom_id`): the workers run them like any other,
and each finished job moves its batch on (`storage.batches.advance_batch`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Iterator
from typing import Any, Callable

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ConfigDict, TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from ..contracts import InputError
from ..engine.inputs import check_text, decode_document
from ..engine.options import RunParams
from ..settings import ServiceSettings
from ..storage import batches, db, lifecycle, limits, results, stats
from ..storage.keys import Caller
from ..storage.models import BATCH_STATUSES
from . import schemas as S
from .errors import ApiError, describe, json_error, responses
from .batch_store import MAX_ERRORS, parse_window, store_batch
from .jobs import check_field, deleted, form_text, links, parse_params_field
from .query import OFFSET, limit_query, parse_statuses, status_query
from .views import batch_summary

log = logging.getLogger("specq.api")

#: form fields of POST /v1/batches
FORM_KEYS = {"input", "file", "question", "params", "metadata", "completion_window", "endpoint"}
JSONL_TYPES = {"application/jsonl", "application/x-ndjson", "application/x-jsonlines", "application/json-lines"}
#: CSV columns before the per-phase timing columns (`<phase>_ms`)
CSV_COLUMNS = ["custom_id", "job_id", "status", "filename", "answer", "finish_reason", "prompt_tokens", "kept_tokens",
               "completion_tokens", "kept_ratio", "mode", "draft", "accept_rate", "queue_wait_ms"]
#: first characters that make a spreadsheet read a cell as a formula (OWASP "CSV injection")
CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
BatchId = Path(..., min_length=1, max_length=S.MAX_ID_CHARS, description="a batch id (batch_…)")

#: the request body of POST /v1/batches, for /openapi.json (the route reads the body itself)
BATCH_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/BatchCreate"}},
            "multipart/form-data": {"schema": S.BATCH_FORM_SCHEMA},
            "application/jsonl": {"schema": {"type": "string", "description": "the JSONL itself: one "
                                             "BatchLine (#/components/schemas/BatchLine) per line"}},
        },
    }
}
JSONL_RESPONSE = {"application/jsonl": {"schema": {"type": "string", "description": "one JSON object per line"}}}
CSV_RESPONSE = {"text/csv": {"schema": {"type": "string", "description": "CSV with a header row; cells starting "
                                        "with = + - @ tab or CR are prefixed with '"}}}


BATCH_LINKS = {**links("$response.body#/id", "batch_id", "getBatch", "cancelBatch", "getBatchResults",
                       "getBatchErrors", "getBatchStats", "deleteBatchData"),
               "ListBatches": {"operationId": "listBatches", "parameters": {"limit": 5}}}


class _Invalid(Exception):
    def __init__(self, line: int | None, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.item = {"line": line, "code": code, "message": message, "param": param}


def batches_router(settings: ServiceSettings, caller_of: Callable[..., Caller], catalog=None) -> APIRouter:
    """The /v1/batches routes; `caller_of` is the API's auth dependency (its Caller's `scope` filters
    every read by tenant)."""
    router = APIRouter(tags=["batches"])

    def _get(s, batch_id: str, scope: str | None):
        batch = batches.get_batch(s, batch_id, tenant=scope)
        if batch is None:
            raise ApiError(404, f"no batch {batch_id}", "not_found")
        if batch.status in ("in_progress", "finalizing", "cancelling"):
            batch = batches.advance_batch(s, batch_id, scope) or batch
        return batch

    @router.post("/v1/batches", summary="Create a batch from a JSONL file or several documents",
                 openapi_extra=BATCH_BODY_DOC, response_model=S.BatchOut, operation_id="createBatch",
                 responses={200: {"links": BATCH_LINKS}, **responses(400, 401, 404, 413, 415, 422, 429, 503)})
    async def create_batch(request: Request, caller: Caller = Depends(caller_of)) -> JSONResponse:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        fields = S.BatchFormFields()
        if ctype == "application/json":  # OpenAI's create: {input_file_id, endpoint, completion_window, metadata}
            from .openai_batches import create_from_file

            batch = await run_in_threadpool(create_from_file, settings, caller.tenant, await request.body(), catalog)
            return JSONResponse(status_code=200, content=batch, headers={"Location": f"/v1/batches/{batch['id']}"})
        if ctype in JSONL_TYPES:
            body = await request.body()
            source = ("jsonl", body, None)
        elif ctype == "multipart/form-data":
            source, fields = await _read_batch_form(request, settings)
        else:
            raise ApiError(415, "send application/json {input_file_id, endpoint, completion_window} (OpenAI's create), "
                                "multipart/form-data (an `input` JSONL file, or `file` parts + question + params) or "
                                "a JSONL body (content-type application/jsonl)", "unsupported_media_type")
        batch = await run_in_threadpool(_create, settings, caller.tenant, source, fields)
        return JSONResponse(status_code=200, content=batch, headers={"Location": f"/v1/batches/{batch['id']}"})

    @router.get("/v1/batches", summary="List batches, newest first", response_model=S.BatchList,
                operation_id="listBatches",
                responses=responses(401, 422))
    def list_batches(
        status: str | None = status_query(BATCH_STATUSES),
        name: str | None = Query(None, max_length=S.MAX_METADATA_VALUE_CHARS,
                                 description="only batches whose metadata name is this"),
        limit: int = limit_query(20),
        after: str | None = Query(None, max_length=S.MAX_ID_CHARS, description="the last id of the previous page "
                                  "(OpenAI's cursor)"),
        offset: int = OFFSET,
        caller: Caller = Depends(caller_of),
    ) -> dict[str, Any]:
        statuses = parse_statuses(status, BATCH_STATUSES, ApiError)
        limit = min(limit, settings.max_list_limit)
        with db.session() as s:
            batches.expire_due(s)
            if name:
                rows = [b for b in batches.find_batches(s, name, tenant=caller.scope, limit=offset + limit + 1)
                        if statuses is None or b.status in statuses][offset:]
            else:
                rows = batches.list_batches(s, tenant=caller.scope, status=statuses, limit=limit + 1, offset=offset,
                                            after=after)
            more, rows = len(rows) > limit, rows[:limit]
            data = []
            for b in rows:
                if b.status in ("in_progress", "finalizing", "cancelling"):
                    b = batches.advance_batch(s, b.id) or b
                data.append(batch_summary(b))
            return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None, "has_more": more, "limit": limit, "offset": offset}

    @router.get("/v1/batches/{batch_id}", summary="A batch: status, request counts, timestamps",
                operation_id="getBatch", response_model=S.BatchOut, responses=responses(401, 404, 422))
    def get_batch(batch_id: str = BatchId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            return _get(s, batch_id, caller.scope).to_dict()

    @router.post("/v1/batches/{batch_id}/cancel", summary="Cancel a batch (finished results stay)",
                 operation_id="cancelBatch", response_model=S.BatchOut,
                 responses={200: {"links": links("$response.body#/id", "batch_id", "getBatch", "deleteBatchData",
                                                 "getBatchErrors")}, **responses(401, 404, 409, 422)})
    def cancel_batch(batch_id: str = BatchId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            batch = batches.cancel_batch(s, batch_id, caller.scope)
            if batch is None:
                raise ApiError(404, f"no batch {batch_id}", "not_found")
            if batch.status in ("completed", "failed", "expired"):
                raise ApiError(409, f"batch {batch_id} already {batch.status}: nothing to cancel", "conflict")
            return batch.to_dict()

    @router.delete("/v1/batches/{batch_id}/data", summary="Delete a finished batch, its jobs and all their data",
                   operation_id="deleteBatchData", response_model=S.Deleted, responses=responses(401, 404, 409, 422))
    def delete_batch_data(batch_id: str = BatchId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        return deleted("batch", batch_id, lambda s: lifecycle.delete_batch(s, batch_id, tenant=caller.scope))

    @router.get("/v1/batches/{batch_id}/results", summary="Results of the succeeded requests: JSONL or CSV",
                response_class=StreamingResponse, operation_id="getBatchResults",
                responses={200: {"content": {**JSONL_RESPONSE, **CSV_RESPONSE}, "description": "one line per "
                                 "succeeded request, in request order"}, **responses(401, 404, 422, 503)})
    def batch_results(batch_id: str = BatchId, format: str = Query("jsonl", pattern="^(jsonl|csv)$"),
                      include: str | None = Query(None, pattern="^selection$", description="`selection`: add each "
                                                  "result's kept spans and chunk scores (JSONL only; docs/result.md)"),
                      caller: Caller = Depends(caller_of)):
        with db.session() as s:
            batch = _get(s, batch_id, caller.scope)
        if format == "csv":
            return StreamingResponse(_csv_lines(batch.id), media_type="text/csv; charset=utf-8",
                                     headers={"Content-Disposition": f'attachment; filename="{batch.id}.csv"'})
        return StreamingResponse(_result_lines(batch.id, detail=include == "selection"), media_type="application/jsonl")

    @router.get("/v1/batches/{batch_id}/errors", summary="Failed and cancelled requests: JSONL",
                response_class=StreamingResponse, operation_id="getBatchErrors",
                responses={200: {"content": JSONL_RESPONSE, "description": "one line per failed or cancelled "
                                 "request"}, **responses(401, 404, 422, 503)})
    def batch_errors(batch_id: str = BatchId, caller: Caller = Depends(caller_of)):
        with db.session() as s:
            batch = _get(s, batch_id, caller.scope)
        return StreamingResponse(_error_lines(batch.id), media_type="application/jsonl")

    @router.get("/v1/batches/{batch_id}/stats", summary="Per-phase p50/p95, mean kept ratio (computed in SQL)",
                operation_id="getBatchStats", response_model=S.BatchStats, responses=responses(401, 404, 422))
    def batch_stats(batch_id: str = BatchId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            batch = _get(s, batch_id, caller.scope)
            summary = stats.batch_summary(s, batch.id)
        return {"object": "batch.stats", "batch_id": batch.id, "status": batch.status,
                "request_counts": batch.to_dict()["request_counts"], **summary}

    return router


# --- creating a batch ------------------------------------------------------------------------------------


async def _read_batch_form(request: Request, settings: ServiceSettings):
    try:
        form = await request.form(max_files=settings.max_batch_requests + 1, max_fields=16, max_part_size=1 << 20)
    except Exception as e:
        if getattr(e, "status_code", None) == 413:
            raise
        raise ApiError(400, f"bad multipart body: {str(e)[:200]}", "invalid_request") from None
    try:
        unknown = sorted(str(k)[:40] for k in set(form.keys()) - FORM_KEYS)
        if unknown:
            raise ApiError(422, f"unknown form field(s): {', '.join(unknown[:8])} (known: {', '.join(sorted(FORM_KEYS))})",
                           "invalid_params")
        for key in FORM_KEYS - {"file"}:
            if len(form.getlist(key)) > 1:
                raise ApiError(422, f"send {key} at most once", "invalid_params")
        inputs = [u for u in form.getlist("input") if isinstance(u, UploadFile)]
        files = [u for u in form.getlist("file") if isinstance(u, UploadFile)]
        if len(inputs) != len(form.getlist("input")) or len(files) != len(form.getlist("file")):
            raise ApiError(422, "input and file must be file parts", "invalid_params")
        if bool(inputs) == bool(files):
            raise ApiError(422, "send either one `input` part (a JSONL file, one request per line) or one or more "
                                "`file` parts (documents)", "invalid_params")
        fields = S.BatchFormFields.model_construct(
            params=parse_params_field(form["params"]) if "params" in form else None,
            metadata=_metadata_field(form.get("metadata")),
            question=form_text(form, "question", S.Question),
            completion_window=form_text(form, "completion_window", S.Text(32)),
            endpoint=form_text(form, "endpoint", S.Text(128)),
        )
        names = [check_field(u.filename or f"file{i}", "a file name", S.Name)
                 for i, u in enumerate(inputs + files, 1)]
        if inputs:
            source = ("jsonl", await inputs[0].read(), names[0])
        else:
            if len(files) > settings.max_batch_requests:
                raise ApiError(422, f"{len(files)} files, over the limit of {settings.max_batch_requests} per batch "
                                    "(SPECQ_MAX_BATCH_REQUESTS)", "invalid_params")
            docs = [(name, await u.read(limits.max_input_bytes() + 1)) for name, u in zip(names, files)]
            source = ("files", docs, None)
        return source, fields
    finally:
        await form.close()


def _metadata_field(raw) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ApiError(422, "metadata must be a text field holding a JSON object", "invalid_params")
    try:
        return _METADATA.validate_json(raw)
    except ValidationError as e:
        first = e.errors(include_url=False)[0] if e.errors() else {}
        if first.get("type") == "json_invalid":
            raise json_error(str(first.get("msg", "")), "metadata", 422) from None
        if first.get("type") == "dict_type" and not first.get("loc"):
            raise ApiError(422, "metadata must be a JSON object of string values", "invalid_params") from None
        raise ApiError(422, describe(e.errors(include_url=False), "metadata"), "invalid_params") from None


_METADATA = TypeAdapter(S.Metadata, config=ConfigDict(strict=True))


def _line_error(n: int, e: ValidationError) -> _Invalid:
    errors = e.errors(include_url=False, include_input=False)
    first = errors[0] if errors else {}
    loc = first.get("loc") or ()
    field_ = str(loc[0]) if loc else None
    if first.get("type") == "json_invalid":
        e = json_error(str(first.get("msg", "")), f"line {n}")
        return _Invalid(n, "invalid_json" if e.status_code == 400 else "invalid_input", e.detail)
    if first.get("type") == "model_type" and not loc:
        return _Invalid(n, "invalid_request", f"line {n} must be a JSON object {{custom_id, text, question, params}}")
    if field_ == "custom_id" and first.get("type") in ("missing", "string_too_short", "string_type"):
        return _Invalid(n, "missing_custom_id", f"line {n}: custom_id is required (a string of 1-255 characters)",
                        "custom_id")
    if field_ == "text" and first.get("type") in ("missing", "string_type"):
        return _Invalid(n, "missing_text", f"line {n}: text is required and must be a string", "text")
    code = "invalid_params" if field_ == "params" else "invalid_request"
    return _Invalid(n, code, f"line {n}: {describe(errors)}", field_)


def _check_params(defaults: dict[str, Any], own: dict[str, Any], question: str | None) -> tuple[dict, str]:
    merged = {**defaults, **own}
    if question is not None:
        merged["question"] = question
    params = RunParams.from_dict(merged)
    d = params.to_dict()
    return d, str(d.pop("question", "") or "")


def _check_line_text(n: int, text: str, limit: int) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise _Invalid(n, "too_large", f"line {n}: text is {size} bytes, over the limit of {limit} bytes "
                                       "(SPECQ_MAX_INPUT_BYTES)", "text")
    try:
        S.storable(text)
        check_text(text, name="text")
    except (InputError, ValueError) as e:
        message = str(e) if str(e).startswith("text") else f"text {e}"
        raise _Invalid(n, "invalid_input", f"line {n}: {message}", "text") from None


def _parse_jsonl(data: bytes, defaults: dict[str, Any], limit: int, max_requests: int,
                 known_document: Callable[[str], bool] | None = None):
    """(requests, errors): one BatchRequest per non-blank line, or an error naming the line.
    `known_document(id)`: whether the batch's tenant has that stored document (lines may name one)."""
    requests: list[batches.BatchRequest] = []
    errors: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(data.splitlines(), 1):
        if len(errors) >= MAX_ERRORS:
            break
        if not raw.strip():
            continue
        try:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _Invalid(n, "invalid_encoding", f"line {n} is not UTF-8") from None
            try:
                line = S.BatchLine.model_validate_json(raw)
            except ValidationError as e:
                raise _line_error(n, e) from None
            cid = line.custom_id
            if cid in seen:
                raise _Invalid(n, "duplicate_custom_id", f"line {n}: custom_id {cid[:100]!r} already used on line "
                                                         f"{seen[cid]}", "custom_id")
            seen[cid] = n
            if (line.text is None) == (line.document_id is None):
                raise _Invalid(n, "missing_text", f"line {n}: give either text (the document) or document_id "
                                                  "(a stored document), exactly one", "text")
            if line.document_id is not None:
                if known_document is not None and not known_document(line.document_id):
                    raise _Invalid(n, "unknown_document", f"line {n}: no document {line.document_id[:80]}",
                                   "document_id")
            else:
                _check_line_text(n, line.text, limit)
            try:
                params, q = _check_params(defaults, S.params_dict(line.params), line.question)
            except InputError as e:
                raise _Invalid(n, "invalid_params", f"line {n}: {e}", "params") from None
            requests.append(batches.BatchRequest(custom_id=cid, text=line.text or "", question=q, params=params,
                                                 filename=line.filename, document_id=line.document_id))
            if len(requests) > max_requests:
                raise _Invalid(n, "too_many_requests", f"more than {max_requests} requests (SPECQ_MAX_BATCH_REQUESTS)")
        except _Invalid as e:
            errors.append(e.item)
            if e.item["code"] == "too_many_requests":
                break
    if not requests and not errors:
        errors.append({"line": None, "code": "empty_file", "message": "the batch has no requests (no non-blank lines)",
                       "param": None})
    return requests, errors


def _parse_files(docs: list[tuple[str, bytes]], defaults: dict[str, Any], limit: int):
    requests: list[batches.BatchRequest] = []
    errors: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    try:
        params, question = _check_params(defaults, {}, None)
    except InputError as e:
        return [], [{"line": None, "code": "invalid_params", "message": str(e), "param": "params"}]
    for n, (name, data) in enumerate(docs, 1):
        try:
            if name in seen:
                raise _Invalid(n, "duplicate_custom_id", f"file {n} ({name}): the same name as file {seen[name]}; "
                                                         "file names are the custom_ids and must differ", "file")
            seen[name] = n
            if len(data) > limit:
                raise _Invalid(n, "too_large", f"file {n} ({name}) is over the limit of {limit} bytes "
                                               "(SPECQ_MAX_INPUT_BYTES)", "file")
            try:
                text = decode_document(data, name=name)
            except InputError as e:
                raise _Invalid(n, "invalid_input", f"file {n}: {e}", "file") from None
            requests.append(batches.BatchRequest(custom_id=name, text=text, question=question, params=params,
                                                 filename=name))
        except _Invalid as e:
            errors.append(e.item)
    if not requests and not errors:
        errors.append({"line": None, "code": "empty_batch", "message": "the batch has no files", "param": None})
    return requests, errors


def _document_checker(tenant: str) -> Callable[[str], bool]:
    """Whether `tenant` has a stored document of that id (memoised: a batch names few documents)."""
    from ..storage import documents

    seen: dict[str, bool] = {}

    def known(document_id: str) -> bool:
        if document_id not in seen:
            with db.session() as s:
                seen[document_id] = documents.get_document(s, document_id, tenant=tenant) is not None
        return seen[document_id]

    return known


def _create(settings: ServiceSettings, tenant: str, source, fields: S.BatchFormFields) -> dict[str, Any]:
    """The native create: parse the JSONL or the documents, store the input as a file (so the batch has
    an input_file_id), then the batch and its jobs."""
    kind, payload, input_name = source
    limit = limits.max_input_bytes()
    defaults = dict(fields.params or {})
    if fields.question is not None:
        defaults["question"] = fields.question
    # parse before storing anything: an upload over a limit is refused with a 4xx and leaves no row
    if kind == "jsonl":
        requests, errors = _parse_jsonl(payload, defaults, limit, settings.max_batch_requests,
                                        known_document=_document_checker(tenant))
        data = payload
    else:
        requests, errors = _parse_files(payload, defaults, limit)
        data = b"".join((json.dumps({"custom_id": r.custom_id, "text": r.text, "question": r.question,
                                     "params": r.params, "filename": r.filename}, ensure_ascii=False) + "\n").encode()
                        for r in requests)
    window = parse_window(fields.completion_window) if fields.completion_window else None
    return store_batch(settings, tenant, requests, errors, endpoint=fields.endpoint or "/v1/jobs",
                       completion_window=fields.completion_window or None, window_s=window,
                       input_filename=input_name if kind == "jsonl" else f"{len(payload)} files",
                       params={k: v for k, v in defaults.items() if k != "question"}, metadata=fields.metadata,
                       input_data=data)


# --- exports -------------------------------------------------------------------------------------------------


def _pages(batch_id: str, statuses, detail: bool = False) -> Iterator[tuple[list, dict[str, dict]]]:
    with db.session() as s:
        for page in batches.iter_batch_jobs(s, batch_id, status=statuses):
            ids = [job.id for job, _ in page]
            found = results.get_results(s, ids, detail=detail) if "succeeded" in statuses else {}
            yield page, found


def _result_lines(batch_id: str, detail: bool = False) -> Iterator[bytes]:
    for page, found in _pages(batch_id, ("succeeded",), detail):
        out = []
        for job, _filename in page:
            result = found.get(job.id)
            if result is None:
                continue
            out.append(json.dumps({"id": job.id, "custom_id": job.custom_id, "status": job.status, "result": result},
                                  ensure_ascii=False))
        if out:
            yield ("\n".join(out) + "\n").encode()


def _error_lines(batch_id: str) -> Iterator[bytes]:
    for page, _found in _pages(batch_id, ("failed", "cancelled")):
        out = [json.dumps({"id": job.id, "custom_id": job.custom_id, "status": job.status,
                           "error": {"message": job.error or job.status}}, ensure_ascii=False) for job, _ in page]
        if out:
            yield ("\n".join(out) + "\n").encode()


def csv_row(job_id: str, custom_id: str | None, status: str, filename: str | None, queue_wait_ms: float | None,
            result: dict[str, Any], phases: list[str]) -> list[Any]:
    """One CSV row (CSV_COLUMNS, then `<phase>_ms` per phase) of a succeeded request, its text cells
    neutralised (`csv_cell`)."""
    usage = result.get("usage") or {}
    prompt, kept = usage.get("prompt_tokens") or 0, usage.get("kept_tokens") or 0
    timings = result.get("timings_ms") or {}
    draft = result.get("draft") or {}
    row = [custom_id, job_id, status, filename or "", result.get("text", ""), result.get("finish_reason"), prompt, kept,
           usage.get("completion_tokens") or 0, round(kept / prompt, 4) if prompt else "",
           (result.get("spec") or {}).get("mode", ""), draft.get("method", ""), draft.get("accept_rate", ""),
           "" if queue_wait_ms is None else round(queue_wait_ms, 3)] + [timings.get(p, "") for p in phases]
    return [csv_cell(v) for v in row]


def csv_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: a string starting with = + - @, a tab or a carriage return
    gets a leading `'` (OWASP CSV injection: `=HYPERLINK(...)` in a model's answer would run as a
    formula). Numbers are written as numbers."""
    if isinstance(value, str) and value.startswith(CSV_FORMULA_STARTS):
        return "'" + value
    return value


def csv_line(cells: list[Any]) -> str:
    """One CSV row ending in `\\n`, every cell holding a CR or LF quoted.

    Python's writer quotes only the characters of its own line terminator: with `\\n` a cell holding
    a bare CR (`x\\r=1+1`) went out unquoted, and a spreadsheet starts a new row (and a formula)
    there. The row is written with `\\r\\n` (so both are quoted inside cells) and ends in `\\n`."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(cells)
    return buf.getvalue()[:-2] + "\n"


def _csv_lines(batch_id: str) -> Iterator[bytes]:
    with db.session() as s:
        phases = stats.batch_phases(s, batch_id)
    yield csv_line(CSV_COLUMNS + [f"{p}_ms" for p in phases]).encode()
    for page, found in _pages(batch_id, ("succeeded",)):
        lines = []
        for job, filename in page:
            result = found.get(job.id)
            if result is not None:
                lines.append(csv_line(csv_row(job.id, job.custom_id, job.status, filename, job.queue_wait_ms,
                                              result, phases)))
        yield "".join(lines).encode()


__all__ = ["batches_router", "CSV_COLUMNS", "csv_row", "csv_cell", "csv_line", "MAX_ERRORS"]
