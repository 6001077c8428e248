"""Request and response models of the OpenAI-compatible routes (`/v1/models`, `/v1/chat/completions`,
`/v1/completions`, `/v1/files`, the OpenAI create of `/v1/batches`).

Requests take every field of OpenAI's API (so the SDKs' requests validate), typed and bounded like
`specq.api.schemas`; what specq cannot do is refused by `specq.api.openai_requests` with a 400 naming
the field, not here. An unknown field is a 400 too ("Unrecognized request argument"), as OpenAI
answers. specq's own options come in the `specq` object (`extra_body={"specq": {...}}` in the SDK).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ..engine.options import MAX_STOP_BYTES, MAX_STOP_STRINGS
from ..served_models import MAX_MODEL_CHARS as SERVED_MODEL_CHARS
from .schemas import MAX_METADATA_PAIRS, Metadata, Request, Response, RunParamsIn, Text

#: the most messages in one chat request
MAX_MESSAGES = 2048
#: the most content parts in one chat request, all messages together (each one costs validation time)
MAX_CONTENT_PARTS = 4096
#: the most JSON values inside arrays and objects of one request body (each costs parse time)
MAX_JSON_VALUES = 32768
#: the longest model name: what the store's jobs.model column holds (256 was a 500 on PostgreSQL)
MAX_MODEL_CHARS = SERVED_MODEL_CHARS
Model = Text(MAX_MODEL_CHARS, min_length=1, description="a model id from GET /v1/models")
Stop = Annotated[str, Field(min_length=1, max_length=MAX_STOP_BYTES)]
Small = Annotated[str, Field(max_length=256)]
#: a JSON value that is only checked for being neutral (its own size bounded by the request body limit)
Opaque = Any


class OpenRequest(Request):
    """An OpenAI request body: strict and closed like every request."""


class ContentPart(OpenRequest):
    type: Small
    text: str | None = None
    image_url: Opaque = None
    input_audio: Opaque = None
    file: Opaque = None
    refusal: str | None = None


class ChatMessage(OpenRequest):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | Annotated[list[ContentPart], Field(max_length=1024)] | None = None
    name: Small | None = None
    refusal: str | None = None
    tool_calls: Opaque = None
    tool_call_id: Small | None = None
    function_call: Opaque = None
    audio: Opaque = None


class StreamOptions(OpenRequest):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


def _specq_options_model():
    """`extra_body={"specq": {...}}`: every RunParams field (`mode`, `keep`, `draft`, `protect_tail`, …) but
    question and system, plus `document` and `question`, an explicit split of the prompt."""
    from pydantic import create_model

    fields = {name: (f.annotation, f) for name, f in RunParamsIn.model_fields.items()
              if name not in ("question", "system")}
    return create_model(
        "SpecqOptions", __base__=OpenRequest,
        __doc__="specq's options of an OpenAI request: an explicit split (`document`, and `question`, else the "
                "last user message) and engine parameters (RunParams)",
        document=(str | None, Field(None, description="the document (scored like a native job's); the question "
                                                      "is `question` or the last user message")),
        question=(Text(64 * 1024) | None, Field(None, description=(
            "with `document`: the question (default the last user message); without: an exact excerpt of the "
            "last user message (or a completion's prompt) that is its question, which scoring never drops "
            "(400 if it is not in it)"))), **fields)


SpecqOptions = _specq_options_model()


class _Generation(OpenRequest):
    model: Model  # type: ignore[valid-type]
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    seed: int | None = None
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOP_STRINGS)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    logit_bias: Annotated[dict[Small, float], Field(max_length=300)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: Small | None = None
    specq: SpecqOptions | None = None  # type: ignore[valid-type]


class ChatCompletionRequest(_Generation):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[Opaque], Field(max_length=128)] | None = None
    tool_choice: Opaque = None
    parallel_tool_calls: bool | None = None
    functions: Annotated[list[Opaque], Field(max_length=128)] | None = None
    function_call: Opaque = None
    response_format: Opaque = None
    store: bool | None = None
    metadata: Metadata | None = None
    service_tier: Small | None = None
    prediction: Opaque = None
    modalities: Annotated[list[Small], Field(max_length=4)] | None = None
    audio: Opaque = None
    reasoning_effort: Small | None = None
    verbosity: Small | None = None
    web_search_options: Opaque = None
    safety_identifier: Small | None = None
    prompt_cache_key: Small | None = None
    prompt_cache_retention: Small | None = None
    prompt_cache_options: Opaque = None
    moderation: Opaque = None


class CompletionRequest(_Generation):
    """POST /v1/completions (a raw prompt, no chat template)."""

    prompt: str | Annotated[list[Opaque], Field(max_length=128)]
    echo: bool | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=20)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    response_format: Opaque = None  # not OpenAI's (it has none here), llama-server's: as on chat


# --- responses (for /openapi.json; the routes build plain dicts with specq.openai_format) ------------------


class OpenResponse(Response):
    model_config = Response.model_config | {"extra": "allow"}


class CompletionUsage(OpenResponse):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(OpenResponse):
    """A chat.completion (or text_completion) object; `specq` holds the job id and phase timings."""

    id: str
    object: Literal["chat.completion", "text_completion"]
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: CompletionUsage
    specq: dict[str, Any]


class ModelObject(OpenResponse):
    """A model the workers serve: OpenAI's fields plus speculator, context and backend."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    speculator: str | None
    context: int | None = Field(description="the target's context in tokens (the worker's n_ctx)")
    backend: str | None
    workers: int = Field(description="live workers serving it (0: configured, none running yet)")


class ModelList(OpenResponse):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class FileObject(Response):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(Response):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(Response):
    id: str
    object: Literal["file"] = "file"
    deleted: Literal[True] = True


class BatchCreate(OpenRequest):
    """POST /v1/batches as application/json: OpenAI's create, from an uploaded file."""

    input_file_id: Text(64, min_length=1)  # type: ignore[valid-type]
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: Text(16, min_length=1) = "24h"  # type: ignore[valid-type]
    metadata: Metadata | None = None
    output_expires_after: Opaque = None


__all__ = ["ChatCompletionRequest", "CompletionRequest", "ChatMessage", "ContentPart", "SpecqOptions", "StreamOptions",
           "ChatCompletion", "CompletionUsage", "ModelObject", "ModelList", "FileObject", "FileList", "FileDeleted",
           "BatchCreate", "MAX_MESSAGES", "MAX_METADATA_PAIRS"]
