"""OpenAI's response objects built from specq's stored results: chat.completion, text_completion, their
stream chunks, and the lines of a batch's output and error files.

Pure functions on dicts (no I/O), shared by the API (responses and streams), the storage layer (a
batch's output file is written when it finishes) and `specq run-batch`. Every object carries specq's
own fields under `specq`: the job id, the phase timings, kept tokens, mode and draft statistics.
"""

from __future__ import annotations

from typing import Any

#: the `object` of a completion and of its chunks, per job kind
OBJECTS = {"chat": ("chat.completion", "chat.completion.chunk"), "completion": ("text_completion", "text_completion")}
#: the endpoint whose request each kind answers
ENDPOINTS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "job": "/v1/jobs"}


def completion_id(job_id: str, kind: str) -> str:
    """`chatcmpl-…` / `cmpl-…` from the job id (so a response names its job)."""
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + job_id.removeprefix("job_")


def usage(result: dict[str, Any]) -> dict[str, int]:
    u = result.get("usage") or {}
    prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def specq_fields(job_id: str, result: dict[str, Any] | None = None) -> dict[str, Any]:
    """specq's extension of a response: the job and, once it ran, its timings and what scoring kept."""
    out: dict[str, Any] = {"job_id": job_id}
    if result is not None:
        u, spec, draft = result.get("usage") or {}, result.get("spec") or {}, result.get("draft") or {}
        out.update(timings_ms=result.get("timings_ms") or {}, kept_tokens=int(u.get("kept_tokens") or 0),
                   mode=spec.get("mode"), draft=draft.get("method"), accept_rate=draft.get("accept_rate"),
                   warnings=list(result.get("warnings") or []))
    return out


def completion_object(job_id: str, kind: str, model: str, created: int, result: dict[str, Any],
                      tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The whole response of a finished chat or completion job; `tool_calls`: the calls its answer is,
    in order (content null, finish_reason tool_calls; empty or None: the answer is content)."""
    finish = result.get("finish_reason") or "stop"
    text = result.get("text") or ""
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if tool_calls:
            message.update(content=None, tool_calls=list(tool_calls))
            finish = "tool_calls"
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": completion_id(job_id, kind), "object": OBJECTS[kind][0], "created": created, "model": model,
            "system_fingerprint": None, "choices": [choice], "usage": usage(result),
            "specq": specq_fields(job_id, result)}


def chunk(job_id: str, kind: str, model: str, created: int, *, text: str | None = None, role: bool = False,
          finish_reason: str | None = None, usage_: dict[str, int] | None = None, with_usage: bool = False,
          specq: dict[str, Any] | None = None, empty: bool = False,
          tool_call: dict[str, Any] | None = None, tool_index: int = 0) -> dict[str, Any]:
    """One stream chunk: a delta (`text`, the first with `role`; or a whole `tool_call`, the
    `tool_index`-th of the answer: OpenAI's streamed entry carries its `index`, by which clients
    accumulate parallel calls), the last (`finish_reason`), or the usage chunk (`empty`: no choices).
    `with_usage`: the request asked for usage, so every chunk has the key (null until the last)."""
    if kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if tool_call is not None:
            delta["tool_calls"] = [{"index": tool_index, **tool_call}]
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    out: dict[str, Any] = {"id": completion_id(job_id, kind), "object": OBJECTS[kind][1], "created": created,
                           "model": model, "system_fingerprint": None, "choices": [] if empty else [choice]}
    if with_usage:
        out["usage"] = usage_
    if specq is not None:
        out["specq"] = specq
    return out


def batch_line_id(job_id: str) -> str:
    return "batch_req_" + job_id.removeprefix("job_")


def output_line(job_id: str, custom_id: str | None, kind: str, model: str | None, created: int,
                result: dict[str, Any]) -> dict[str, Any]:
    """A line of a batch's output file: the request's response (a native job's body is its run result)."""
    body = result if kind == "job" else completion_object(job_id, kind, model or "", created, result)
    return {"id": batch_line_id(job_id), "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": job_id, "body": body}, "error": None}


def error_line(job_id: str, custom_id: str | None, status: str, message: str | None) -> dict[str, Any]:
    """A line of a batch's error file: a failed or cancelled request (a prompt over the context:
    code `context_length_exceeded`, as the chat route answers it)."""
    from .contracts import is_context_length_error

    if status == "cancelled":
        code = "cancelled"
    else:
        code = "context_length_exceeded" if is_context_length_error(message) else "job_failed"
    return {"id": batch_line_id(job_id), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message or status}}


__all__ = ["OBJECTS", "ENDPOINTS", "completion_id", "usage", "specq_fields", "completion_object", "chunk",
           "batch_line_id", "output_line", "error_line"]
