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
                                      {"id", "custom_id", "status", "result": <run result object>};
                                      ?format=csv flattens usage and timings into columns
    GET  /v1/batches/{id}/errors      JSONL of failed and cancelled requests {"id", "custom_id",
                                      "status", "error": {"message"}}
    GET  /v1/batches/{id}/stats       count, per-phase p50/p95/mean, mean kept ratio (SQL)
    POST /v1/batches/{id}/cancel      cancelling -> cancelled; finished results stay

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

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from ..contracts import InputError
from ..engine.inputs import check_text, decode_document
from ..engine.options import RunParams
from ..settings import ServiceSettings
from ..storage import batches, db, jobs, results, stats
from ..storage.keys import Caller
from ..storage.quotas import QuotaExceeded, reserve_queued
from ..storage.models import BATCH_STATUSES
from .query import parse_statuses
from .validate import MAX_NAME_CHARS, check_storable

log = logging.getLogger("specq.api")

#: keys of one JSONL request line
LINE_KEYS = {"custom_id", "text", "question", "params", "filename"}
#: form fields of POST /v1/batches
FORM_KEYS = {"input", "file", "question", "params", "metadata", "completion_window", "endpoint"}
JSONL_TYPES = {"application/jsonl", "application/x-ndjson", "application/x-jsonlines", "application/json-lines"}
#: validation stops collecting errors after this many
MAX_ERRORS = 100
#: CSV columns before the per-phase timing columns (`<phase>_ms`)
CSV_COLUMNS = ["custom_id", "job_id", "status", "filename", "answer", "finish_reason", "prompt_tokens", "kept_tokens",
               "completion_tokens", "kept_ratio", "mode", "draft", "accept_rate", "queue_wait_ms"]


#: the request body of POST /v1/batches, for /openapi.json (the route reads the body itself)
BATCH_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "input": {"type": "string", "format": "binary",
                                  "description": "JSONL, one request per line: {custom_id, text, question, params}"},
                        "file": {"type": "array", "items": {"type": "string", "format": "binary"},
                                 "description": "documents (custom_id = file name); instead of input"},
                        "question": {"type": "string"},
                        "params": {"type": "string", "description": "a JSON object: defaults of every request"},
                        "metadata": {"type": "string", "description": "a JSON object; `name` names the batch"},
                    },
                }
            },
            "application/jsonl": {"schema": {"type": "string", "description": "the JSONL itself"}},
        },
    }
}


class _Invalid(Exception):
    def __init__(self, line: int | None, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.item = {"line": line, "code": code, "message": message, "param": param}


def batches_router(settings: ServiceSettings, caller_of: Callable[..., Caller], api_error: type) -> APIRouter:
    """The /v1/batches routes; `caller_of` is the API's auth dependency (its Caller's `scope` filters
    every read by tenant), `api_error` its error class."""
    router = APIRouter()
    ApiError = api_error

    def _get(s, batch_id: str, scope: str | None):
        batch = batches.get_batch(s, batch_id, tenant=scope)
        if batch is None:
            raise ApiError(404, f"no batch {batch_id}", "not_found")
        if batch.status in ("in_progress", "finalizing", "cancelling"):
            batch = batches.advance_batch(s, batch_id, scope) or batch
        return batch

    @router.post("/v1/batches", summary="Create a batch from a JSONL file or several documents",
                 openapi_extra=BATCH_BODY_DOC)
    async def create_batch(request: Request, caller: Caller = Depends(caller_of)) -> JSONResponse:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        defaults: dict[str, Any] = {}
        metadata = None
        extra: dict[str, Any] = {}
        if ctype in JSONL_TYPES:
            body = await request.body()
            source = ("jsonl", body, None)
        elif ctype == "multipart/form-data":
            source, defaults, metadata, extra = await _read_batch_form(request, settings, ApiError)
        else:
            raise ApiError(415, "send multipart/form-data (an `input` JSONL file, or `file` parts + question + "
                                "params) or a JSONL body (content-type application/jsonl)", "unsupported_media_type")
        batch, code = await run_in_threadpool(_create, settings, caller.tenant, source, defaults, metadata, extra, ApiError)
        return JSONResponse(status_code=code, content=batch, headers={"Location": f"/v1/batches/{batch['id']}"})

    @router.get("/v1/batches", summary="List batches, newest first")
    def list_batches(
        status: str | None = Query(None, description="one status or several, comma-separated"),
        name: str | None = Query(None, description="only batches whose metadata name is this"),
        limit: int = Query(20, ge=1),
        offset: int = Query(0, ge=0),
        caller: Caller = Depends(caller_of),
    ) -> dict[str, Any]:
        statuses = parse_statuses(status, BATCH_STATUSES, ApiError)
        limit = min(limit, settings.max_list_limit)
        with db.session() as s:
            if name:
                rows = [b for b in batches.find_batches(s, name, tenant=caller.scope, limit=offset + limit)
                        if statuses is None or b.status in statuses][offset:]
            else:
                rows = batches.list_batches(s, tenant=caller.scope, status=statuses, limit=limit, offset=offset)
            data = []
            for b in rows:
                if b.status in ("in_progress", "finalizing", "cancelling"):
                    b = batches.advance_batch(s, b.id) or b
                data.append(b.to_dict())
            return {"object": "list", "data": data, "limit": limit, "offset": offset}

    @router.get("/v1/batches/{batch_id}", summary="A batch: status, request counts, timestamps")
    def get_batch(batch_id: str, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            return _get(s, batch_id, caller.scope).to_dict()

    @router.post("/v1/batches/{batch_id}/cancel", summary="Cancel a batch (finished results stay)")
    def cancel_batch(batch_id: str, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            batch = batches.cancel_batch(s, batch_id, caller.scope)
            if batch is None:
                raise ApiError(404, f"no batch {batch_id}", "not_found")
            if batch.status in ("completed", "failed", "expired"):
                raise ApiError(409, f"batch {batch_id} already {batch.status}: nothing to cancel", "conflict")
            return batch.to_dict()

    @router.get("/v1/batches/{batch_id}/results", summary="Results of the succeeded requests: JSONL or CSV")
    def batch_results(batch_id: str, format: str = Query("jsonl", pattern="^(jsonl|csv)$"),
                      caller: Caller = Depends(caller_of)):
        with db.session() as s:
            batch = _get(s, batch_id, caller.scope)
        if format == "csv":
            return StreamingResponse(_csv_lines(batch.id), media_type="text/csv; charset=utf-8",
                                     headers={"Content-Disposition": f'attachment; filename="{batch.id}.csv"'})
        return StreamingResponse(_result_lines(batch.id), media_type="application/jsonl")

    @router.get("/v1/batches/{batch_id}/errors", summary="Failed and cancelled requests: JSONL")
    def batch_errors(batch_id: str, caller: Caller = Depends(caller_of)):
        with db.session() as s:
            batch = _get(s, batch_id, caller.scope)
        return StreamingResponse(_error_lines(batch.id), media_type="application/jsonl")

    @router.get("/v1/batches/{batch_id}/stats", summary="Per-phase p50/p95, mean kept ratio (computed in SQL)")
    def batch_stats(batch_id: str, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            batch = _get(s, batch_id, caller.scope)
            summary = stats.batch_summary(s, batch.id)
        return {"object": "batch.stats", "batch_id": batch.id, "status": batch.status,
                "request_counts": batch.to_dict()["request_counts"], **summary}

    return router


# --- creating a batch ------------------------------------------------------------------------------------


async def _read_batch_form(request: Request, settings: ServiceSettings, ApiError):
    try:
        form = await request.form(max_files=settings.max_batch_requests + 1, max_fields=16, max_part_size=1 << 20)
    except Exception as e:
        if getattr(e, "status_code", None) == 413:
            raise
        raise ApiError(400, f"bad multipart body: {e}", "invalid_request") from None
    try:
        unknown = sorted(set(form.keys()) - FORM_KEYS)
        if unknown:
            raise ApiError(422, f"unknown form field(s): {', '.join(unknown)} (known: {', '.join(sorted(FORM_KEYS))})",
                           "invalid_params")
        inputs = [u for u in form.getlist("input") if isinstance(u, UploadFile)]
        files = [u for u in form.getlist("file") if isinstance(u, UploadFile)]
        if bool(inputs) == bool(files):
            raise ApiError(422, "send either one `input` part (a JSONL file, one request per line) or one or more "
                                "`file` parts (documents)", "invalid_params")
        if len(inputs) > 1:
            raise ApiError(422, "send one `input` JSONL file per batch", "invalid_params")
        defaults = _json_field(form.get("params"), "params", ApiError) or {}
        metadata = _json_field(form.get("metadata"), "metadata", ApiError)
        question = form.get("question")
        if question is not None and not isinstance(question, str):
            raise ApiError(422, "question must be a text field", "invalid_params")
        if question is not None:
            defaults["question"] = question
        extra = {k: form.get(k) for k in ("completion_window", "endpoint") if isinstance(form.get(k), str)}
        try:  # what the batch row keeps: checked here, before anything is stored
            for value, name, size in ((defaults, "params", None), (metadata, "metadata", None),
                                      (extra.get("completion_window"), "completion_window", 32),
                                      (extra.get("endpoint"), "endpoint", 128),
                                      *((u.filename, "a file name", MAX_NAME_CHARS) for u in inputs + files)):
                check_storable(value, name, size)
        except InputError as e:
            raise ApiError(422, str(e), "invalid_input") from None
        if inputs:
            source = ("jsonl", await inputs[0].read(), inputs[0].filename)
        else:
            if len(files) > settings.max_batch_requests:
                raise ApiError(422, f"{len(files)} files, over the limit of {settings.max_batch_requests} per batch "
                                    "(SPECQ_MAX_BATCH_REQUESTS)", "invalid_params")
            docs = [(u.filename or f"file{i}", await u.read(jobs.max_input_bytes() + 1)) for i, u in enumerate(files, 1)]
            source = ("files", docs, None)
        return source, defaults, metadata, extra
    finally:
        await form.close()


def _json_field(raw, name: str, ApiError) -> dict | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if not isinstance(raw, str):
        raise ApiError(422, f"{name} must be a text field holding a JSON object", "invalid_params")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ApiError(422, f"{name} is not valid JSON: {e}", "invalid_params") from None
    if not isinstance(value, dict):
        raise ApiError(422, f"{name} must be a JSON object", "invalid_params")
    return value


def _check_params(defaults: dict[str, Any], own: dict[str, Any], question: str | None) -> tuple[dict, str]:
    merged = {**defaults, **own}
    if question is not None:
        merged["question"] = question
    params = RunParams.from_dict(merged)
    d = params.to_dict()
    return d, str(d.get("question") or "")


def _parse_jsonl(data: bytes, defaults: dict[str, Any], limit: int, max_requests: int):
    """(requests, errors): one BatchRequest per non-blank line, or an error naming the line."""
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
                line = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise _Invalid(n, "invalid_encoding", f"line {n} is not UTF-8") from None
            except (ValueError, RecursionError) as e:
                raise _Invalid(n, "invalid_json", f"line {n} is not valid JSON: {e}") from None
            if not isinstance(line, dict):
                raise _Invalid(n, "invalid_request", f"line {n} must be a JSON object {{custom_id, text, question, params}}")
            unknown = sorted(set(line) - LINE_KEYS)
            if unknown:
                raise _Invalid(n, "invalid_request", f"line {n}: unknown field(s) {', '.join(unknown)} "
                                                     f"(known: {', '.join(sorted(LINE_KEYS))})")
            cid = line.get("custom_id")
            if not isinstance(cid, str) or not cid.strip() or len(cid) > MAX_NAME_CHARS:
                raise _Invalid(n, "missing_custom_id", f"line {n}: custom_id is required (a string of 1-255 characters)",
                               "custom_id")
            if cid in seen:
                raise _Invalid(n, "duplicate_custom_id", f"line {n}: custom_id {cid!r} already used on line {seen[cid]}",
                               "custom_id")
            seen[cid] = n
            text = line.get("text")
            if not isinstance(text, str):
                raise _Invalid(n, "missing_text", f"line {n}: text is required and must be a string", "text")
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > limit:
                raise _Invalid(n, "too_large", f"line {n}: text is {size} bytes, over the limit of {limit} bytes "
                                               "(SPECQ_MAX_INPUT_BYTES)", "text")
            question = line.get("question")
            if question is not None and not isinstance(question, str):
                raise _Invalid(n, "invalid_request", f"line {n}: question must be a string", "question")
            own = line.get("params") or {}
            if not isinstance(own, dict):
                raise _Invalid(n, "invalid_params", f"line {n}: params must be a JSON object", "params")
            filename = line.get("filename")
            if filename is not None and not isinstance(filename, str):
                raise _Invalid(n, "invalid_request", f"line {n}: filename must be a string", "filename")
            try:
                text.encode("utf-8")
                check_text(text, name="text")
            except UnicodeEncodeError:
                raise _Invalid(n, "invalid_input", f"line {n}: text contains lone surrogates", "text") from None
            except InputError as e:
                raise _Invalid(n, "invalid_input", f"line {n}: {e}", "text") from None
            for value, field_ in ((cid, "custom_id"), (question, "question"), (own, "params")):
                try:
                    check_storable(value, field_)
                except InputError as e:
                    raise _Invalid(n, "invalid_input", f"line {n}: {e}", field_) from None
            try:
                check_storable(filename, "filename", MAX_NAME_CHARS)
            except InputError as e:
                raise _Invalid(n, "invalid_input", f"line {n}: {e}", "filename") from None
            try:
                params, q = _check_params(defaults, own, question)
            except InputError as e:
                raise _Invalid(n, "invalid_params", f"line {n}: {e}", "params") from None
            requests.append(batches.BatchRequest(custom_id=cid, text=text, question=q, params=params,
                                                 filename=filename))
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
            requests.append(batches.BatchRequest(custom_id=name[:255], text=text, question=question, params=params,
                                                 filename=name))
        except _Invalid as e:
            errors.append(e.item)
    if not requests and not errors:
        errors.append({"line": None, "code": "empty_batch", "message": "the batch has no files", "param": None})
    return requests, errors


def _create(settings: ServiceSettings, tenant: str, source, defaults, metadata, extra, ApiError) -> tuple[dict, int]:
    from ..broker import enqueue_job

    kind, payload, input_name = source
    limit = jobs.max_input_bytes()
    # parse before storing anything: an upload over a limit is refused with a 4xx and leaves no row
    if kind == "jsonl":
        requests, errors = _parse_jsonl(payload, defaults, limit, settings.max_batch_requests)
    else:
        requests, errors = _parse_files(payload, defaults, limit)
    over = [e for e in errors if e["code"] == "too_many_requests"]
    if over:
        raise ApiError(422, over[0]["message"], "invalid_params")
    with db.session() as s:
        if not errors:
            try:  # refuse before creating the batch; checked again under the lock when the jobs go in
                reserve_queued(s, tenant, len(requests), settings.max_queued_jobs)
                s.rollback()
            except QuotaExceeded as e:
                raise ApiError(429, str(e), "too_many_requests") from None
        batch = batches.create_batch(
            s, tenant=tenant, endpoint=extra.get("endpoint") or "/v1/jobs",
            completion_window=extra.get("completion_window") or None,
            input_filename=input_name if kind == "jsonl" else f"{len(payload)} files",
            params={k: v for k, v in defaults.items()}, metadata=metadata)
        if errors:
            batches.set_batch_status(s, batch.id, "failed", errors={"object": "list", "data": errors})
            log.info("batch %s failed validation: %s", batch.id, errors[0]["message"])
            return batches.get_batch(s, batch.id).to_dict(), 200
        try:
            reserve_queued(s, tenant, len(requests), settings.max_queued_jobs)  # add_requests commits it
            ids = batches.add_requests(s, batch.id, requests, tenant=tenant, max_attempts=settings.max_attempts,
                                       limit_bytes=limit)
        except BaseException as e:  # nothing of the requests was stored: the batch must not stay `validating`
            quota = isinstance(e, QuotaExceeded)
            message = str(e) if quota else f"storing the requests failed: {type(e).__name__}"
            batches.set_batch_status(s, batch.id, "failed", errors={"object": "list", "data": [
                {"line": None, "code": "too_many_queued_jobs" if quota else "internal", "message": message,
                 "param": None}]})
            if quota:
                raise ApiError(429, message, "too_many_requests") from None
            raise
        batches.set_batch_status(s, batch.id, "in_progress")
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
        return batches.get_batch(s, batch.id).to_dict(), 200


# --- exports -------------------------------------------------------------------------------------------------


def _pages(batch_id: str, statuses) -> Iterator[tuple[list, dict[str, dict]]]:
    with db.session() as s:
        for page in batches.iter_batch_jobs(s, batch_id, status=statuses):
            found = results.get_results(s, [job.id for job, _ in page]) if "succeeded" in statuses else {}
            yield page, found


def _result_lines(batch_id: str) -> Iterator[bytes]:
    for page, found in _pages(batch_id, ("succeeded",)):
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
    """One CSV row (CSV_COLUMNS, then `<phase>_ms` per phase) of a succeeded request."""
    usage = result.get("usage") or {}
    prompt, kept = usage.get("prompt_tokens") or 0, usage.get("kept_tokens") or 0
    timings = result.get("timings_ms") or {}
    draft = result.get("draft") or {}
    return [custom_id, job_id, status, filename or "", result.get("text", ""), result.get("finish_reason"), prompt, kept,
            usage.get("completion_tokens") or 0, round(kept / prompt, 4) if prompt else "",
            (result.get("spec") or {}).get("mode", ""), draft.get("method", ""), draft.get("accept_rate", ""),
            "" if queue_wait_ms is None else round(queue_wait_ms, 3)] + [timings.get(p, "") for p in phases]


def _csv_lines(batch_id: str) -> Iterator[bytes]:
    with db.session() as s:
        phases = stats.batch_phases(s, batch_id)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS + [f"{p}_ms" for p in phases])
    yield buf.getvalue().encode()
    for page, found in _pages(batch_id, ("succeeded",)):
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        for job, filename in page:
            result = found.get(job.id)
            if result is not None:
                w.writerow(csv_row(job.id, job.custom_id, job.status, filename, job.queue_wait_ms, result, phases))
        yield buf.getvalue().encode()


__all__ = ["batches_router", "CSV_COLUMNS", "csv_row"]
