"""OpenAI's batch create: POST /v1/batches as application/json {input_file_id, endpoint,
completion_window, metadata}, with the requests in an uploaded file (purpose `batch`), one per line:

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": …, "messages": …}}

Each line's body is checked as its route checks a request (openai_requests: the same 400s, here as
the line's error) and becomes a chat or completion job of the batch. A file with a bad line makes a
`failed` batch whose `errors` name each bad line, as OpenAI's validation does; nothing is queued then.
The batch expires `completion_window` after its creation (OpenAI's value is 24h).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from ..storage import batches, db, files, limits
from . import openai_schemas as O
from .batch_store import MAX_ERRORS, parse_window, store_batch
from .errors import ApiError
from .openai_requests import INVALID, chat_spec, check_params, completion_spec, parse
from .schemas import storable

#: the body model and the job builder of each endpoint
ENDPOINTS = {"/v1/chat/completions": (O.ChatCompletionRequest, chat_spec),
             "/v1/completions": (O.CompletionRequest, completion_spec)}


def create_from_file(settings, tenant: str, raw: bytes, catalog) -> dict[str, Any]:
    req = parse(O.BatchCreate, raw)
    window = parse_window(req.completion_window)
    with db.session() as s:
        row = files.get_file(s, req.input_file_id, tenant=tenant)
        if row is None:
            raise ApiError(404, f"No such File object: {req.input_file_id}", INVALID, param="input_file_id")
        if row.purpose != "batch":
            raise ApiError(400, f"file {row.id} has purpose {row.purpose!r}; a batch's input file has purpose batch",
                           INVALID, param="input_file_id")
        data = files.read_all(s, row.id)
    requests, errors = parse_lines(data, req.endpoint, catalog, limits.max_input_bytes(), settings.max_batch_requests)
    return store_batch(settings, tenant, requests, errors, endpoint=req.endpoint, completion_window=req.completion_window,
                       window_s=window, input_filename=row.filename, params={}, metadata=req.metadata,
                       input_file_id=row.id)


def parse_lines(data: bytes, endpoint: str, catalog, limit: int, max_requests: int):
    """(requests, errors) of an OpenAI batch input file."""
    body_model, to_spec = ENDPOINTS[endpoint]
    requests: list[batches.BatchRequest] = []
    errors: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(data.splitlines(), 1):
        if len(errors) >= MAX_ERRORS:
            break
        if not raw.strip():
            continue
        try:
            requests.append(_line(n, raw, endpoint, body_model, to_spec, catalog, limit, seen))
        except _LineError as e:
            errors.append({"line": n, "code": e.code, "message": f"line {n}: {e}", "param": e.param})
        if len(requests) > max_requests:
            errors.append({"line": n, "code": "too_many_requests", "param": None,
                           "message": f"more than {max_requests} requests (SPECQ_MAX_BATCH_REQUESTS)"})
            break
    if not requests and not errors:
        errors.append({"line": None, "code": "empty_file", "message": "the file has no requests", "param": None})
    return requests, errors


class _LineError(Exception):
    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param = code, param


def _line(n: int, raw: bytes, endpoint: str, body_model, to_spec, catalog, limit: int, seen: dict[str, int]):
    try:
        line = json.loads(raw)
    except (ValueError, RecursionError):
        raise _LineError("not valid JSON", "invalid_json") from None
    if not isinstance(line, dict):
        raise _LineError("must be a JSON object {custom_id, method, url, body}")
    unknown = sorted(set(line) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise _LineError(f"unknown field {unknown[0][:40]!r} (a line is {{custom_id, method, url, body}})",
                         param=unknown[0][:40])
    cid = line.get("custom_id")
    if not isinstance(cid, str) or not 1 <= len(cid) <= 255 or "\x00" in cid:
        raise _LineError("custom_id is required (a string of 1-255 characters)", "missing_custom_id", "custom_id")
    try:
        storable(cid)  # JSON can spell a lone surrogate ("\ud800"): the store cannot hold it (was a 500)
    except ValueError as e:
        raise _LineError(f"custom_id {e}", "invalid_custom_id", "custom_id") from None
    if cid in seen:
        raise _LineError(f"custom_id {cid[:100]!r} already used on line {seen[cid]}", "duplicate_custom_id", "custom_id")
    if line.get("method") != "POST":
        raise _LineError("method must be POST", param="method")
    if line.get("url") != endpoint:
        raise _LineError(f"url must be the batch's endpoint {endpoint}", "mismatched_url", "url")
    body = line.get("body")
    if not isinstance(body, dict):
        raise _LineError("body must be a JSON object (the request)", param="body")
    try:
        req = parse(body_model, json.dumps(body).encode(), "body")
        if req.stream:
            raise ApiError(400, "stream is not allowed in a batch", INVALID, param="stream")
        catalog.check(req.model)
        spec = to_spec(req)
        params = check_params(spec.params).to_dict()
    except ApiError as e:
        raise _LineError(str(e.detail), getattr(e, "code", None) or "invalid_request",
                         f"body.{e.param}" if getattr(e, "param", None) else "body") from None
    except ValidationError as e:  # pragma: no cover - parse turns these into ApiError
        raise _LineError(str(e).splitlines()[0], param="body") from None
    size = len(spec.text.encode("utf-8")) + sum(len(m["content"].encode("utf-8")) for m in spec.messages or [])
    if size > limit:
        raise _LineError(f"the request holds {size} bytes of text, over the limit of {limit} (SPECQ_MAX_INPUT_BYTES)",
                         "too_large", "body")
    if "\x00" in spec.text or any("\x00" in m["content"] for m in spec.messages or []):
        raise _LineError("the request contains a NUL character", "invalid_input", "body")
    seen[cid] = n
    question = params.pop("question", "")
    return batches.BatchRequest(custom_id=cid, text=spec.text, question=question, params=params, kind=spec.kind,
                                model=spec.model, messages=spec.messages)


__all__ = ["create_from_file", "parse_lines", "ENDPOINTS"]
