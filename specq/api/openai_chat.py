"""POST /v1/chat/completions and POST /v1/completions (OpenAI's format, streaming or not).

Each request becomes a job like any other — stored, queued (interactive priority: ahead of batch
requests, storage.claims), run by a worker, visible in `specq jobs` — of kind `chat` (the worker
renders the messages with the target's chat template) or `completion` (a raw prompt). The route then
follows the job (`job_stream.follow`):

* `stream: true`: SSE in OpenAI's chunk format — a first chunk with the role and `specq.job_id`, one
  chunk per published delta, a last chunk with `finish_reason` and specq's timings, with
  `stream_options.include_usage` a usage chunk (no choices), then `data: [DONE]`. A job that fails
  sends `{"error": …}` as its last data (the SDKs raise it).
* otherwise: the whole `chat.completion` / `text_completion` object once the job is done; `specq`
  holds the job id and phase timings. A failed job answers 400 (`job_failed`) with its message.

A client that disconnects before the answer is complete cancels its job.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from .. import openai_format as F
from ..settings import ServiceSettings
from ..storage import db, jobs
from ..storage.keys import Caller
from ..storage.models import unix
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
        return await _answer(request, settings, caller, await run_in_threadpool(_chat_spec, raw, catalog))

    @router.post("/v1/completions", summary="A text completion of a raw prompt (OpenAI format)",
                 operation_id="createCompletion", response_model=O.ChatCompletion,
                 openapi_extra=_body_doc(O.CompletionRequest),
                 responses={200: {"content": STREAM_DOC}, **errors})
    async def completions(request: Request, caller: Caller = Depends(caller_of)):
        raw = await _json_body(request)
        return await _answer(request, settings, caller, await run_in_threadpool(_completion_spec, raw, catalog))

    return router


# validation of megabyte bodies runs in a worker thread, never on the event loop


def _chat_spec(raw: bytes, catalog: ModelCatalog) -> JobSpec:
    req = parse_chat(raw)
    catalog.check(req.model)
    return chat_spec(req)


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


async def _answer(request: Request, settings: ServiceSettings, caller: Caller, spec: JobSpec):
    created = await run_in_threadpool(store_and_enqueue, settings, spec.text, spec.params, None, caller.tenant,
                                      kind=spec.kind, model=spec.model, messages=spec.messages)
    job_id = created["id"]
    headers = {"X-Specq-Job-Id": job_id}
    stamp = await run_in_threadpool(_created_at, job_id)
    if spec.stream:
        return StreamingResponse(_chunks(settings, spec, job_id, stamp), media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **headers})
    done = await _wait(request, settings, job_id)
    if done["status"] != "succeeded":
        raise ApiError(400, f"job {job_id} {done['status']}: {done.get('error') or done['status']}", INVALID,
                       code="job_failed", headers=headers)
    result = await run_in_threadpool(_result, job_id)
    return JSONResponse(F.completion_object(job_id, spec.kind, spec.model, stamp, result), headers=headers)


def _created_at(job_id: str) -> int:
    with db.session() as s:
        job = jobs.get_job(s, job_id)
        return unix(job.created_at) if job is not None else 0


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


async def _chunks(settings: ServiceSettings, spec: JobSpec, job_id: str, created: int):
    kind, model, usage = spec.kind, spec.model, spec.include_usage
    finished = False
    try:
        yield _data(F.chunk(job_id, kind, model, created, text="", role=True, with_usage=usage,
                            specq={"job_id": job_id}))
        async for name, data in follow(settings, job_id):
            if name == "keepalive":
                yield b": keep-alive\n\n"
            elif name == "delta":
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
                    yield _data({"error": {"message": f"job {job_id} {data['status']}: {data.get('error') or ''}",
                                           "type": INVALID, "param": None, "code": "job_failed"}})
                    return
                result = await run_in_threadpool(_result, job_id)
                yield _data(F.chunk(job_id, kind, model, created, finish_reason=data.get("finish_reason") or "stop",
                                    with_usage=usage, specq=F.specq_fields(job_id, result)))
                if usage:
                    yield _data(F.chunk(job_id, kind, model, created, empty=True, with_usage=True,
                                        usage_=F.usage(result)))
                yield b"data: [DONE]\n\n"
                return
    finally:
        if not finished:  # the client left before the answer was complete
            asyncio.get_running_loop().run_in_executor(None, _cancel, job_id)


__all__ = ["openai_router"]
