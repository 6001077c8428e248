"""The API's errors: one JSON shape for every 4xx and 5xx, and the messages of validation errors.

Every error is `{"error": {"message": "...", "type": "..."}}` (`schemas.ErrorBody`). Routes raise
`ApiError(status, message, type)`; pydantic's validation errors become one 422 whose message names
each bad field (`params.pool: must be <= 1023`); malformed JSON is a 400.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from .schemas import ErrorBody

#: the error type of each status when a route gives none
TYPES = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
         408: "request_timeout", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
         422: "invalid_params", 429: "too_many_requests", 500: "internal", 503: "unavailable"}
#: seconds a client is asked to wait (Retry-After) after a 429 (its tenant's queue is full) or a 503
RETRY_AFTER_S = {429: 30, 503: 10}
#: longest error message; longer ones are cut (a message may quote the request)
MAX_MESSAGE_CHARS = 2000


class ApiError(HTTPException):
    """An error a route answers with: status, one-line message, type."""

    def __init__(self, status_code: int, message: str, type_: str | None = None,
                 headers: dict[str, str] | None = None, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(status_code=status_code, detail=message, headers=headers)
        self.type = type_ or TYPES.get(status_code, "error")
        #: OpenAI's error fields: the parameter at fault, a machine-readable code
        self.param, self.code = param, code


def error_response(status: int, message: str, type_: str | None = None,
                   headers: dict[str, str] | None = None, *, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1] + "…"
    headers = dict(headers or {})
    if status in RETRY_AFTER_S:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S[status]))
    if status == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    error: dict[str, Any] = {"message": message, "type": type_ or TYPES.get(status, "error")}
    if param is not None or code is not None:
        error.update(param=param, code=code)
    return JSONResponse(status_code=status, content={"error": error}, headers=headers)


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(x) for x in loc if x not in ("query", "path", "body", "header"))


def describe(errors: list[dict[str, Any]], prefix: str = "") -> str:
    """One line naming each bad field of a pydantic validation error (at most 8 of them)."""
    parts = []
    for err in errors[:8]:
        where = _loc(tuple(err.get("loc", ())))
        where = f"{prefix}.{where}" if prefix and where else (prefix or where)
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            msg = "unknown field"
        elif kind == "missing":
            msg = "required"
        else:
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    if len(errors) > 8:
        parts.append(f"and {len(errors) - 8} more")
    message = "; ".join(parts) or "invalid request"
    if any(e.get("type") == "extra_forbidden" and "params" in (prefix, *map(str, e.get("loc", ())[:1]))
           for e in errors):
        from ..engine.options import RUN_PARAM_NAMES

        message += f" (known params: {', '.join(sorted(RUN_PARAM_NAMES))})"
    return message


def from_validation(e: ValidationError, what: str = "request body", prefix: str = "") -> ApiError:
    """The ApiError of a failed `Model.model_validate_json`: 400 when the body is not JSON or not an
    object, else 422 naming each bad field."""
    errors = e.errors(include_url=False, include_input=False)
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return json_error(str(first.get("msg", "")), what)
    if first.get("type") == "model_type" and not first.get("loc") and not prefix:
        return ApiError(400, f"{what} must be a JSON object", "invalid_request")
    return ApiError(422, describe(errors, prefix), "invalid_params")


def json_error(msg: str, what: str, status: int = 400) -> ApiError:
    """The error of JSON that does not parse. A lone surrogate escape ("\\ud800" without its pair) is
    refused by the parser too: say so (422, the text cannot be stored) rather than "not valid JSON"."""
    msg = msg.removeprefix("Invalid JSON: ")
    if "surrogate" in msg or "hex escape" in msg:
        return ApiError(422, f"{what} contains a lone surrogate escape (\\ud800-\\udfff without its pair; {msg}): "
                             "send UTF-8 text", "invalid_input")
    return ApiError(status, f"{what} is not valid JSON: {msg}", "invalid_request" if status == 400 else "invalid_params")


def http_error_response(exc: HTTPException) -> JSONResponse:
    type_ = getattr(exc, "type", None) or TYPES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    return error_response(exc.status_code, message, type_, headers=dict(exc.headers or {}),
                          param=getattr(exc, "param", None), code=getattr(exc, "code", None))


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` entries of these error statuses (all ErrorBody)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorBody, "description": TYPES.get(status, "error").replace("_", " ")}
        if status in RETRY_AFTER_S:
            entry["headers"] = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}
        out[status] = entry
    return out


__all__ = ["ApiError", "error_response", "describe", "from_validation", "json_error", "http_error_response", "responses", "TYPES",
           "RETRY_AFTER_S"]
