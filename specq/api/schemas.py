"""The API's request and response models (pydantic): every body the REST API reads or writes.

Requests are strict: unknown fields are refused (`extra="forbid"`), numbers are not coerced from
strings or booleans, floats must be finite, every string and list has a bound, and no string may hold
what the job store cannot (a NUL, which PostgreSQL refuses; a lone surrogate, which no UTF-8 encoder
takes). So a request that passes validation can be stored and its response serialised; one that does
not is a 4xx before anything is stored.

Responses are the models FastAPI serialises (`response_model`), so /openapi.json describes what the
API really returns, and a stored row that does not fit them is repaired on read (`specq.api.views`)
instead of failing the request.

Engine parameters (`RunParamsIn`) are built from `specq.engine.options.RunParams`: the same field
names, defaults, choices and ranges (`PARAM_BOUNDS`), so the bounds live in one place.

Limits named here:

* question and system message: 64 KiB of UTF-8 each (`MAX_PROMPT_TEXT_BYTES`);
* file names and custom ids: 255 characters;
* batch metadata as OpenAI limits it: at most 16 pairs, keys up to 64 characters, values strings
  up to 512 characters;
* the document: `SPECQ_MAX_INPUT_BYTES` (8 MiB by default; checked in bytes by the route: 413).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from ..contracts import BATCH_STATUSES, JOB_KINDS, JOB_STATUSES
from ..engine.options import MAX_PROMPT_TEXT_BYTES, PARAM_BOUNDS, RunParams

#: the longest file name or custom_id (job_inputs.filename, jobs.custom_id)
MAX_NAME_CHARS = 255
#: OpenAI's metadata limits: pairs, key characters, value characters
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
#: ids are `job_`/`batch_` + hex; anything longer than this is not one of ours
MAX_ID_CHARS = 64
#: the largest `offset` of a list
MAX_OFFSET = 1_000_000_000
#: the largest `limit` a list accepts (pages are then cut to SPECQ_MAX_LIST_LIMIT)
MAX_LIMIT = 10_000


# --- building blocks --------------------------------------------------------------------------------


def storable(value: str) -> str:
    """`value` if the job store can hold it: no NUL (PostgreSQL text and JSONB refuse it), no lone
    surrogate (JSON can spell both: "\\u0000", "\\ud800")."""
    if "\x00" in value:
        raise ValueError("contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains lone surrogates; send UTF-8 text") from None
    return value


def Text(max_length: int, min_length: int = 0, description: str | None = None) -> Any:
    """A string type of at most `max_length` characters that the store can hold."""
    return Annotated[str, Field(min_length=min_length, max_length=max_length, description=description),
                     AfterValidator(storable)]


Name = Text(MAX_NAME_CHARS)
Question = Text(MAX_PROMPT_TEXT_BYTES, description="the question asked about the document (at most 64 KiB of UTF-8)")
MetadataKey = Text(MAX_METADATA_KEY_CHARS)
MetadataValue = Text(MAX_METADATA_VALUE_CHARS)
#: user metadata of a batch: up to 16 string pairs (`name` names the batch)
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(max_length=MAX_METADATA_PAIRS)]
Timestamp = Annotated[str | None, Field(description="ISO 8601 UTC, e.g. 2026-01-01T12:00:00.123456Z")]
UnixTime = Annotated[int | None, Field(description="Unix seconds (OpenAI's timestamps)")]
Count = Annotated[int, Field(ge=0)]


class Request(BaseModel):
    """A request body: strict, closed, finite."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, hide_input_in_errors=True)


class Response(BaseModel):
    """A response body. Keys a route returns beyond the model's fields are dropped, not an error: a
    column added to a storage `to_dict()` shows in the API once it is added here."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


# --- engine parameters --------------------------------------------------------------------------------


def _param_field(name: str, type_: Any, default: Any) -> tuple[Any, Any]:
    bound = PARAM_BOUNDS.get(name)
    kw: dict[str, Any] = {}
    if bound is not None:
        kw["gt" if bound.lo_open else "ge"] = bound.lo
        kw["lt" if bound.hi_open else "le"] = bound.hi
    if type_ == list[str]:
        from ..engine.options import MAX_STOP_BYTES, MAX_STOP_STRINGS

        item = Annotated[str, Field(min_length=1, max_length=MAX_STOP_BYTES), AfterValidator(storable)]
        return Annotated[list[item], Field(default_factory=list, max_length=MAX_STOP_STRINGS)], None
    if type_ is str:
        return Annotated[str, Field(default, max_length=MAX_PROMPT_TEXT_BYTES), AfterValidator(storable)], default
    if type_ is float:
        return Annotated[float, Field(default, allow_inf_nan=False, **kw)], default
    if type_ == Optional[float]:  # unset (null or left out): the engine chooses (RunParams.keep); a given value is bounded
        return Annotated[Optional[Annotated[float, Field(allow_inf_nan=False, **kw)]], Field(default)], default
    return Annotated[type_, Field(default, **kw)], default


def _run_params_model() -> type[Request]:
    hints = typing.get_type_hints(RunParams)
    fields = {}
    for f in dataclasses.fields(RunParams):
        type_, default = _param_field(f.name, hints[f.name], f.default)
        # a list's default comes from its Field's default_factory
        fields[f.name] = type_ if f.default is dataclasses.MISSING else (type_, default)
    model = create_model("RunParamsIn", __base__=Request, __doc__="Engine parameters of one job (RunParams; "
                         "every key optional, defaults shown). docs/engine.md says what each does.", **fields)
    return model


#: `params` of a job or batch request
RunParamsIn = _run_params_model()


def params_dict(params: BaseModel | None) -> dict[str, Any]:
    """The keys a request set (the rest take RunParams' defaults)."""
    return {} if params is None else params.model_dump(exclude_unset=True)


# --- errors ----------------------------------------------------------------------------------------------


class ErrorDetail(Response):
    message: str
    type: str
    #: the OpenAI routes' errors also name the parameter at fault and a code (e.g. model_not_found)
    param: str | None = None
    code: str | None = None


class ErrorBody(Response):
    """Every 4xx and 5xx: a message a person can act on and a machine-readable type."""

    error: ErrorDetail


# --- jobs ------------------------------------------------------------------------------------------------


DocumentId = Text(MAX_ID_CHARS, min_length=1, description="a stored document's id (doc_…, POST /v1/documents) "
                                                          "of the caller's tenant")


class JobCreate(Request):
    """POST /v1/jobs as JSON: `text` or `document_id`, exactly one."""

    text: str | None = Field(None, description="the document, UTF-8 text of at most SPECQ_MAX_INPUT_BYTES bytes (413 "
                                               "above it); not empty, not binary")
    document_id: DocumentId | None = None  # type: ignore[valid-type]
    question: Question | None = None
    params: RunParamsIn | None = None  # type: ignore[valid-type]
    filename: Name | None = Field(None, description="a name kept with the job")


#: POST /v1/jobs as multipart/form-data (read by the route; this model is its OpenAPI description)
JOB_FORM_SCHEMA = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "the document (UTF-8 text)"},
        "question": {"type": "string", "maxLength": MAX_PROMPT_TEXT_BYTES},
        "params": {"type": "string", "maxLength": 1 << 20, "description": "a JSON object of RunParams"},
    },
    "additionalProperties": False,
}


class JobCreated(Response):
    id: str
    object: Literal["job"] = "job"
    status: Literal[JOB_STATUSES]  # type: ignore[valid-type]


class Progress(Response):
    phase: str | None
    done: int
    total: int


class Ran(Response):
    """What ran for a succeeded job: its result's `spec.mode` and `spec.reason` (docs/result.md), and
    whether the target's prompt cache supplied part of the prompt."""

    mode: str | None = Field(None, description="baseline or specprefill: the mode that actually ran (`auto` resolved)")
    reason: str | None = Field(None, description="why: `asked for`, a fallback, or `auto: …`")
    cache_hit: bool = Field(False, description="the target restored part of the prompt from its prompt cache")


class JobInputOut(Response):
    filename: str | None
    size_bytes: int
    question: str
    document_id: str | None = Field(None, description="the stored document it asks about (POST /v1/documents)")


class JobSummary(Response):
    """A job as lists show it: no document, system message or result, and only the start of the
    question."""

    id: str
    object: Literal["job"] = "job"
    tenant: str
    kind: Literal[JOB_KINDS] = Field("job", description="job (document + question), chat or completion (the OpenAI "  # type: ignore[valid-type]
                                                        "routes), or calibration (a unit of POST /v1/calibrations)")
    model: str | None = Field(None, description="the model an OpenAI request named")
    priority: int = Field(0, description="claim order: 0 interactive, 1 batch requests, 9 calibration units")
    batch_id: str | None
    custom_id: str | None
    status: Literal[JOB_STATUSES]  # type: ignore[valid-type]
    progress: Progress
    attempts: int
    max_attempts: int
    error: str | None
    created_at: Timestamp
    started_at: Timestamp
    finished_at: Timestamp
    queue_wait_ms: float | None
    params: dict[str, Any] = Field(description="RunParams the job asked for (lists leave out `system`)")
    worker: str | None
    heartbeat_at: Timestamp
    cancel_requested: bool
    ran: Ran | None = Field(None, description="once it succeeded: the mode that ran and why (lists carry no "
                                              "result, so they show it here)")
    filename: str | None = Field(None, description="the document's file name (the job's, else its stored "
                                                   "document's)")
    question: str = Field("", description="the question's first 120 characters (… when cut; the whole question is "
                                          "the job's `input.question`); empty for chat and completion requests")
    batch_name: str | None = Field(None, description="its batch's name (`metadata.name`), if it has one")


class JobTrace(Response):
    """Where the job's time went, from the server's clocks: unix seconds, null where not known
    (storage.trace). The OpenAI routes' requests have every stamp; a native job (POST /v1/jobs) has
    no `accepted`, `queued`, `first_byte`, `first_text`; a job that did not succeed has only its row's
    `stored`, `claimed` and `done`. `queued` and `claimed` race (a worker may claim before the send
    returns)."""

    accepted: float | None = Field(None, description="the request's body was read (OpenAI routes)")
    stored: float | None = Field(None, description="the job's row was written (created_at)")
    queued: float | None = Field(None, description="the broker took its message (OpenAI routes)")
    claimed: float | None = Field(None, description="a worker claimed it (started_at of the last attempt)")
    engine_start: float | None = Field(None, description="the worker handed it to the engine")
    first_token: float | None = Field(None, description="its first answer text left the engine")
    first_byte: float | None = Field(None, description="the response's first chunk was sent (OpenAI routes)")
    first_text: float | None = Field(None, description="the first chunk with answer text was sent (streamed "
                                                       "OpenAI requests)")
    engine_done: float | None = Field(None, description="the engine returned its result")
    done: float | None = Field(None, description="the job's end was written (finished_at)")


class JobOut(JobSummary):
    """GET /v1/jobs/{id}: the job, its input and, once it succeeded, its result."""

    input: JobInputOut | None = None
    result: dict[str, Any] | None = Field(None, description="the run result object (docs/result.md)")
    trace: JobTrace | None = Field(None, description="where its time went (server clocks)")


class JobDocument(Response):
    """GET /v1/jobs/{id}/document: what the job was asked about."""

    id: str
    object: Literal["job.document"] = "job.document"
    filename: str | None
    size_bytes: int
    question: str
    text: str = Field(description="the document; `result.selection` offsets are character offsets into it")


class DocumentCreate(Request):
    """POST /v1/documents as JSON."""

    text: str = Field(description="the document, UTF-8 text of at most SPECQ_MAX_INPUT_BYTES bytes (413 above "
                                  "it); not empty, not binary")
    filename: Name | None = Field(None, description="a name kept with the document")


class DocumentOut(Response):
    """A stored document, without its text. `created` is false when the tenant already had this text
    (same sha256): its id is reused."""

    id: str
    object: Literal["document"] = "document"
    tenant: str
    sha256: str
    filename: str | None
    size_bytes: int
    created_at: Timestamp
    created: bool | None = None
    jobs: int | None = Field(None, description="jobs that ask about it (GET only)")


class DocumentText(DocumentOut):
    text: str


class DocumentList(Response):
    object: Literal["list"] = "list"
    data: list[DocumentOut]
    limit: int
    offset: int


class JobList(Response):
    object: Literal["list"] = "list"
    data: list[JobSummary]
    total: int
    limit: int
    offset: int


class Deleted(Response):
    """DELETE …/data: what was deleted."""

    id: str
    object: str
    deleted: Literal[True] = True
    jobs_deleted: int = 0


# --- batches ---------------------------------------------------------------------------------------------


class BatchLine(Request):
    """One line of a batch's JSONL: one request."""

    custom_id: Text(MAX_NAME_CHARS, min_length=1)  # type: ignore[valid-type]
    text: str | None = Field(None, description="the document (SPECQ_MAX_INPUT_BYTES; not empty, not binary); or "
                                               "document_id")
    document_id: DocumentId | None = None  # type: ignore[valid-type]
    question: Question | None = None
    params: RunParamsIn | None = None  # type: ignore[valid-type]
    filename: Name | None = None


BATCH_FORM_SCHEMA = {
    "type": "object",
    "properties": {
        "input": {"type": "string", "format": "binary",
                  "description": "JSONL, one request per line: {custom_id, text, question, params, filename}"},
        "file": {"type": "array", "items": {"type": "string", "format": "binary"},
                 "description": "documents (custom_id = file name); instead of input"},
        "question": {"type": "string", "maxLength": MAX_PROMPT_TEXT_BYTES},
        "params": {"type": "string", "maxLength": 1 << 20, "description": "a JSON object: defaults of every request"},
        "metadata": {"type": "string", "maxLength": 1 << 16,
                     "description": "a JSON object of up to 16 string pairs (keys <= 64, values <= 512 characters); "
                                    "`name` names the batch"},
        "completion_window": {"type": "string", "maxLength": 32},
        "endpoint": {"type": "string", "maxLength": 128},
    },
    "oneOf": [{"required": ["input"], "not": {"required": ["file"]}}, {"required": ["file"], "not": {"required": ["input"]}}],
    "additionalProperties": False,
}


class BatchFormFields(Request):
    """The text fields of POST /v1/batches (multipart), once parsed."""

    params: RunParamsIn | None = None  # type: ignore[valid-type]
    metadata: Metadata | None = None
    question: Question | None = None
    completion_window: Text(32) | None = None  # type: ignore[valid-type]
    endpoint: Text(128) | None = None  # type: ignore[valid-type]


class BatchError(Response):
    line: int | None
    code: str
    message: str
    param: str | None


class BatchErrors(Response):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(Response):
    total: Count
    completed: Count
    failed: Count


class BatchOut(Response):
    """A batch: OpenAI's Batch object (Unix-second timestamps) plus specq's fields (tenant,
    input_filename, params)."""

    id: str
    object: Literal["batch"] = "batch"
    tenant: str
    status: Literal[BATCH_STATUSES]  # type: ignore[valid-type]
    endpoint: str | None
    completion_window: str | None
    input_file_id: str | None
    output_file_id: str | None = Field(description="OpenAI-format result lines of the succeeded requests, once the "
                                                   "batch finished (GET /v1/files/{id}/content)")
    error_file_id: str | None = Field(description="lines of the failed and cancelled requests")
    input_filename: str | None
    params: dict[str, Any] = Field(description="the batch's default RunParams")
    metadata: Metadata | None
    errors: BatchErrors | None
    request_counts: RequestCounts
    created_at: UnixTime
    in_progress_at: UnixTime
    finalizing_at: UnixTime
    completed_at: UnixTime
    failed_at: UnixTime
    expired_at: UnixTime
    cancelling_at: UnixTime
    cancelled_at: UnixTime
    expires_at: UnixTime


class BatchList(Response):
    """OpenAI's list page (`after` = last_id for the next one) plus `limit` and `offset`."""

    object: Literal["list"] = "list"
    data: list[BatchOut]
    first_id: str | None
    last_id: str | None
    has_more: bool
    limit: int
    offset: int


class PhaseStats(Response):
    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    min: float | None
    max: float | None


class BatchStats(Response):
    """GET /v1/batches/{id}/stats: aggregates over the succeeded requests (computed in SQL)."""

    object: Literal["batch.stats"] = "batch.stats"
    batch_id: str
    status: Literal[BATCH_STATUSES]  # type: ignore[valid-type]
    request_counts: RequestCounts
    count: int = Field(description="succeeded requests (those with a result)")
    kept_ratio_mean: float | None
    prompt_tokens_mean: float | None
    kept_tokens_mean: float | None
    completion_tokens_mean: float | None
    first_started_at: Timestamp
    last_finished_at: Timestamp
    wall_s: float | None
    jobs_per_s: float | None
    phases: dict[str, PhaseStats] = Field(description="per phase, milliseconds")


# --- health and workers --------------------------------------------------------------------------------


class Health(Response):
    """GET /healthz: this process answers (liveness; it checks nothing else)."""

    status: Literal["ok"] = "ok"
    version: str
    instance: str | None = Field(None, description="names this API process (SPECQ_INSTANCE_ID, else random): "
                                                   "`specq up` checks that the API answering its port is its own")


class Ready(Response):
    """GET /readyz: can this API accept jobs now?"""

    status: Literal["ready", "unavailable"]
    version: str
    database: str = Field(description="ok, or why not")
    broker: str
    migrations: str = Field(description="ok (the schema is at the newest revision), or what is wrong")
    broker_kind: Literal["embedded", "redis"]
    queue: str
    workers_ready: int = Field(description="workers of this API's queue with a fresh heartbeat that say they are ready")
    workers_not_ready: list[str] = Field(default_factory=list, description=(
        "the other workers of this queue, each as `name: why` (e.g. a model file missing, with its path)"))


class WorkerOut(Response):
    name: str
    host: str | None
    pid: int | None
    queue: str | None
    device: str | None = Field(description="the GPU index the worker was given (empty: as the machine has it)")
    backend: str | None
    model: str | None = Field(description="the target model")
    ready: bool
    not_ready: str | None = Field(None, description="why it is not ready yet (e.g. a model file missing, with its "
                                                    "path); null when ready or when it does not say")
    slots: int = Field(description="jobs it can run at once")
    busy: int = Field(description="jobs it is running")
    current_jobs: list[str] = Field(description="their ids (admins only; empty for tenant keys)")
    jobs_done: int
    heartbeat_age_s: float
    started_at: float | None


class WorkerList(Response):
    object: Literal["list"] = "list"
    data: list[WorkerOut]



# --- job events (GET /v1/jobs/{id}/events, text/event-stream; docs/service.md) ---------------------------


class EventStatus(Response):
    """`event: status`: first, then at every status change."""

    id: str
    status: Literal[JOB_STATUSES]  # type: ignore[valid-type]
    attempts: int
    error: str | None
    queue_wait_ms: float | None


class EventPhase(Response):
    """`event: phase`: the running job entered a phase."""

    phase: str


class EventProgress(Response):
    """`event: progress`: done/total within the phase (windows, tokens)."""

    phase: str | None
    done: int
    total: int


class EventDelta(Response):
    """`event: delta`: answer text appended at character `offset` (whole characters; never a prefix of a
    stop string that may still match)."""

    text: str
    offset: int
    attempt: int


class EventReset(Response):
    """`event: reset`: a new attempt restarts the answer at offset 0."""

    attempt: int


class EventDone(Response):
    """`event: done`: the job finished; the stream ends after it."""

    status: Literal[JOB_STATUSES]  # type: ignore[valid-type]
    error: str | None
    finish_reason: str | None
    usage: dict[str, int] | None
    timings_ms: dict[str, float] | None


#: event name -> its data model
EVENT_MODELS = {"status": EventStatus, "phase": EventPhase, "progress": EventProgress, "delta": EventDelta,
                "reset": EventReset, "done": EventDone}

__all__ = [
    "storable", "Text", "Name", "Question", "Metadata", "Request", "Response", "RunParamsIn", "params_dict",
    "ErrorBody", "ErrorDetail", "JobCreate", "JobCreated", "JobSummary", "JobOut", "JobList", "JobInputOut", "JobDocument",
    "Progress", "Ran", "Deleted", "BatchLine", "BatchFormFields", "BatchOut", "BatchList", "BatchStats", "BatchError",
    "BatchErrors", "RequestCounts", "Health", "Ready", "WorkerOut", "WorkerList", "JOB_FORM_SCHEMA",
    "BATCH_FORM_SCHEMA", "MAX_NAME_CHARS", "MAX_ID_CHARS", "MAX_OFFSET", "MAX_LIMIT", "MAX_METADATA_PAIRS",
    "MAX_METADATA_KEY_CHARS", "MAX_METADATA_VALUE_CHARS", "EventStatus", "EventPhase", "EventProgress", "EventDelta",
    "EventReset", "EventDone", "EVENT_MODELS",
]
