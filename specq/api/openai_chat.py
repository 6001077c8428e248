"""POST /v1/chat/completions and POST /v1/completions (OpenAI's format, streaming or not).

Each request becomes a job like any other — stored, queued (interactive priority: ahead of batch
requests, storage.claims), run by a worker, visible in `specq jobs` — of kind `chat` (the worker
renders the messages with the target's chat template) or `completion` (a raw prompt). The route then
follows the job (`job_stream.follow`):

* `stream: true`: SSE in OpenAI's chunk format — a first chunk with the role and `specq.job_id`, one
  chunk per published delta, a last chunk with `finish_reason` and specq's timings, with
  `stream_options.include_usage` a usage chunk (no choices), then `data: [DONE]`. The response's
  headers are held until the worker has tokenized the prompt (this process has no tokenizer): a
  prompt over the context, or any other failure before the job's first model phase, answers the
  same 400 as without `stream` (below), not an error inside a 200 stream. The hold lasts at most
  SPECQ_STREAM_HOLD seconds (a job long in the queue); a job that fails after its stream has
  started sends `{"error": …}` as its last data (the SDKs raise it).
* otherwise: the whole `chat.completion` / `text_completion` object once the job is done; `specq`
  holds the job id and phase timings. A failed job answers 400 with its message: code
  `context_length_exceeded` (param `messages` / `prompt`) when the prompt and max_tokens do not fit
  the target's context (what LiteLLM and LangChain look for), else `job_failed`.

A client that disconnects before the answer is complete cancels its job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from .. import openai_format as F
from ..contracts import is_context_length_error
from ..settings import ServiceSettings
from ..storage import db, jobs, trace
from ..storage.keys import Caller
from . import openai_schemas as O
from .errors import ApiError, responses
from .events import SSE_HEADERS
from .job_stream import follow
from .jobs import store_and_enqueue
from .openai_models import ModelCatalog
from .openai_requests import INVALID, JobSpec, chat_spec, check_shape, completion_spec, parse, parse_chat

log = logging.getLogger("specq.api")

STREAM_DOC = {"text/event-stream": {"schema": {"type": "string", "description": "with stream: true, chunks as "
                                               "`data: {json}` lines, then `data: [DONE]`"}}}


def _body_doc(model: type) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def openai_router(settings: ServiceSettings, caller_of: Callable[..., Caller], catalog: ModelCatalog) -> APIRouter:
    router = APIRouter(tags=["openai"])
    errors = responses(400, 401, 404, 413, 415, 429, 503)

    @router.post("/v1/chat/completions", summary="A chat completion (OpenAI format; stream: true for SSE)",
                 operation_id="createChatCompletion", response_model=O.ChatCompletion,
                 openapi_extra=_body_doc(O.ChatCompletionRequest),
                 responses={200: {"content": STREAM_DOC}, **errors})
    async def chat(request: Request, caller: Caller = Depends(caller_of)):
        raw = await _json_body(request)
        accepted = time.time()
        return await _answer(request, settings, caller, await run_in_threadpool(_chat_spec, raw, catalog), accepted)

    @router.post("/v1/completions", summary="A text completion of a raw prompt (OpenAI format)",
                 operation_id="createCompletion", response_model=O.ChatCompletion,
                 openapi_extra=_body_doc(O.CompletionRequest),
                 responses={200: {"content": STREAM_DOC}, **errors})
    async def completions(request: Request, caller: Caller = Depends(caller_of)):
        raw = await _json_body(request)
        accepted = time.time()
        return await _answer(request, settings, caller, await run_in_threadpool(_completion_spec, raw, catalog),
                             accepted)

    return router


# validation of megabyte bodies runs in a worker thread, never on the event loop


def _chat_spec(raw: bytes, catalog: ModelCatalog) -> JobSpec:
    req = parse_chat(raw)
    catalog.check(req.model)
    return chat_spec(req, tools_ok=True)


def _completion_spec(raw: bytes, catalog: ModelCatalog) -> JobSpec:
    check_shape(raw)
    req = parse(O.CompletionRequest, raw)
    catalog.check(req.model)
    return completion_spec(req)


async def _json_body(request: Request) -> bytes:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise ApiError(415, "send the request as application/json", INVALID)
    return await request.body()


async def _answer(request: Request, settings: ServiceSettings, caller: Caller, spec: JobSpec, accepted: float):
    """Store and queue the job, then follow it. Its trace stamps (storage.trace) are written once the
    response was sent (a background task), so they cost the answer no store round trip."""
    stamps: dict[str, Any] = {"accepted": accepted}
    created = await run_in_threadpool(store_and_enqueue, settings, spec.text, spec.params, None, caller.tenant,
                                      stamps, kind=spec.kind, model=spec.model, messages=spec.messages)
    job_id = created["id"]
    headers = {"X-Specq-Job-Id": job_id}
    stamp = stamps.pop("created")
    background = BackgroundTask(run_in_threadpool, _save_stamps, job_id, stamps)
    if spec.stream:
        events = _Events(follow(settings, job_id))
        try:
            held = await _hold(request, settings, job_id, events)
        except BaseException:
            await events.close()
            raise
        done = next((data for name, data in held if name == "done"), None)
        if done is not None and done["status"] != "succeeded":
            await events.close()
            raise _failed(spec, job_id, done, headers)
        return StreamingResponse(_chunks(spec, job_id, stamp, events, held, stamps), media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **headers}, background=background)
    done = await _wait(request, settings, job_id)
    if done["status"] != "succeeded":
        raise _failed(spec, job_id, done, headers)
    result = await run_in_threadpool(_result, job_id)
    calls = spec.tools.answer_calls(result.get("text") or "")
    stamps["first_byte"] = time.time()
    return JSONResponse(F.completion_object(job_id, spec.kind, spec.model, stamp, result, tool_calls=calls),
                        headers=headers, background=background)


def _failed(spec: JobSpec, job_id: str, done: dict[str, Any], headers: dict[str, str]) -> ApiError:
    """The 400 of a job that did not succeed: `context_length_exceeded` when its prompt did not fit."""
    error = done.get("error") or done["status"]
    if done["status"] == "failed" and is_context_length_error(error):
        # the code in the message too: clients on openai 2+/3 see only the message in str(error), and
        # LangChain and LiteLLM look for these words there
        return ApiError(400, f"job {job_id} failed: {error} (context_length_exceeded)", INVALID,
                        code="context_length_exceeded",
                        param="messages" if spec.kind == "chat" else "prompt", headers=headers)
    return ApiError(400, f"job {job_id} {done['status']}: {error}", INVALID, code="job_failed", headers=headers)


class _Events:
    """A job's `follow()` events, read one at a time with a timeout (the hold below checks its client
    between reads); the stream then goes on reading the same iterator."""

    def __init__(self, events) -> None:
        self.events, self.pending = events, None

    async def _step(self) -> tuple[str, Any] | None:
        try:
            return await self.events.__anext__()
        except StopAsyncIteration:
            return None

    async def next(self, timeout: float | None) -> tuple[str, Any] | None:
        """The next event; None after `timeout` seconds without one; StopAsyncIteration at the end."""
        if self.pending is None:
            self.pending = asyncio.ensure_future(self._step())
        finished, _ = await asyncio.wait({self.pending}, timeout=timeout)
        if not finished:
            return None
        task, self.pending = self.pending, None
        event = task.result()
        if event is None:
            raise StopAsyncIteration
        return event

    async def close(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            with contextlib.suppress(BaseException):
                await self.pending
            self.pending = None
        with contextlib.suppress(Exception):
            await self.events.aclose()


#: phases during which the worker has not yet checked the prompt against the context
_BEFORE_TOKENIZED = (None, "", "tokenize")


async def _hold(request: Request, settings: ServiceSettings, job_id: str, events: _Events) -> list[tuple[str, Any]]:
    """The job's events until its prompt is tokenized (a later phase, text, or the job's end) or
    SPECQ_STREAM_HOLD seconds have passed; cancels the job if the client disconnects meanwhile."""
    held: list[tuple[str, Any]] = []
    deadline = asyncio.get_running_loop().time() + settings.stream_hold
    try:
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return held
            try:
                event = await events.next(min(1.0, left))
            except StopAsyncIteration:
                return held
            if event is None:
                if await request.is_disconnected():
                    raise asyncio.CancelledError
                continue
            held.append(event)
            name, data = event
            if name in ("delta", "reset", "done") or (name in ("phase", "progress")
                                                       and data.get("phase") not in _BEFORE_TOKENIZED):
                return held
    except BaseException:
        await run_in_threadpool(_cancel, job_id)
        raise


def _save_stamps(job_id: str, stamps: dict[str, float]) -> None:
    try:
        with db.session() as s:
            trace.add_stamps(s, job_id, stamps)
    except Exception as e:  # best effort: the trace is a measurement, the answer was sent
        log.warning("job %s: could not store its trace stamps: %s", job_id, e)


def _result(job_id: str) -> dict[str, Any]:
    from ..storage import results

    with db.session() as s:
        return results.get_result(s, job_id) or {}


def _cancel(job_id: str) -> None:
    try:
        with db.session() as s:
            jobs.request_cancel(s, job_id)
    except Exception as e:  # best effort: the job then runs to its end
        log.warning("job %s: could not cancel it after its client left: %s", job_id, e)


async def _wait(request: Request, settings: ServiceSettings, job_id: str) -> dict[str, Any]:
    """The job's `done` event; cancels the job if the client disconnects first."""

    async def done() -> dict[str, Any]:
        async for name, data in follow(settings, job_id):
            if name == "done":
                return data
        return {"status": "failed", "error": "the job disappeared"}

    task = asyncio.ensure_future(done())
    try:
        while True:
            finished, _ = await asyncio.wait({task}, timeout=1.0)
            if finished:
                return task.result()
            if await request.is_disconnected():
                raise asyncio.CancelledError
    except BaseException:
        task.cancel()
        await run_in_threadpool(_cancel, job_id)
        raise


def _data(obj: Any) -> bytes:
    return ("data: " + json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n\n").encode("utf-8")


async def _chunks(spec: JobSpec, job_id: str, created: int, events: _Events, held: list[tuple[str, Any]],
                  stamps: dict[str, float]):
    kind, model, usage = spec.kind, spec.model, spec.include_usage
    finished = False
    held_text: list[str] | None = [] if spec.tools.active else None  # tools: the answer is read whole, at the end

    async def all_events():
        for event in held:
            yield event
        while True:
            try:
                yield await events.next(None)
            except StopAsyncIteration:
                return

    try:
        stamps["first_byte"] = time.time()
        yield _data(F.chunk(job_id, kind, model, created, text="", role=True, with_usage=usage,
                            specq={"job_id": job_id}))
        async for name, data in all_events():
            if name == "keepalive":
                yield b": keep-alive\n\n"
            elif name == "delta" and held_text is not None:
                held_text.append(data["text"])
            elif name == "delta":
                stamps.setdefault("first_text", time.time())
                yield _data(F.chunk(job_id, kind, model, created, text=data["text"], with_usage=usage))
            elif name == "reset":
                finished = True
                yield _data({"error": {"message": f"job {job_id} was retried after its worker stopped and its answer "
                                                  "restarted; send the request again", "type": "server_error",
                                       "param": None, "code": "job_retried"}})
                return
            elif name == "done":
                finished = True
                if data["status"] != "succeeded":
                    err = _failed(spec, job_id, data, {})
                    yield _data({"error": {"message": err.detail, "type": INVALID, "param": err.param,
                                           "code": err.code}})
                    return
                result = await run_in_threadpool(_result, job_id)
                finish = data.get("finish_reason") or "stop"
                if held_text is not None:
                    text = result.get("text") or "".join(held_text)
                    calls = spec.tools.answer_calls(text)
                    stamps.setdefault("first_text", time.time())
                    if calls:
                        finish = "tool_calls"
                        for i, call in enumerate(calls):  # one chunk per call, as OpenAI streams them
                            yield _data(F.chunk(job_id, kind, model, created, tool_call=call, tool_index=i,
                                                with_usage=usage))
                    elif text:
                        yield _data(F.chunk(job_id, kind, model, created, text=text, with_usage=usage))
                yield _data(F.chunk(job_id, kind, model, created, finish_reason=finish,
                                    with_usage=usage, specq=F.specq_fields(job_id, result)))
                if usage:
                    yield _data(F.chunk(job_id, kind, model, created, empty=True, with_usage=True,
                                        usage_=F.usage(result)))
                yield b"data: [DONE]\n\n"
                return
    finally:
        await events.close()
        if not finished:  # the client left before the answer was complete
            asyncio.get_running_loop().run_in_executor(None, _cancel, job_id)


__all__ = ["openai_router"]
