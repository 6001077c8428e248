"""OpenAI requests as specq jobs: validation errors as OpenAI words them, unsupported fields refused,
the rest mapped to a job (`JobSpec`).

Mapped: `temperature`, `top_p` (0 = greedy), `max_tokens` / `max_completion_tokens`, `seed`, `stop`;
`developer` messages are system messages; text content parts are joined. Accepted and ignored:
neutral values (`n: 1`, zero penalties, `logprobs: false`, `top_logprobs: 0`, empty `logit_bias`,
`tools: []`, `response_format: {"type": "text"}`, `modalities: ["text"]`) and informational fields
(`user`, `store`, `metadata`, `service_tier`, `stream_options`, `reasoning_effort`, `verbosity`,
`safety_identifier`, `prompt_cache_*`, `moderation`), and `parallel_tool_calls` where no call is read.
`response_format` json_object / json_schema (chat and completions) is the job's `json_schema`
(grammar-constrained output), checked here against what the grammar can honour. `tools`, `tool_choice`,
`parallel_tool_calls` and `tool` / assistant `tool_calls` messages: openai_tools.py (chat completions
only, not batch lines).
Anything else that would change the output is a 400 naming the field.
Requests run in mode `auto` (engine/policy/auto.py: a prompt-cache hit, baseline below the break-even length,
specprefill for long prompts where its quality was measured) unless `specq.mode` says otherwise (a chat
holding tool results or calls: `baseline`, openai_tools.py).
`specq` (the SDK's `extra_body={"specq": {...}}`) holds RunParams fields and an explicit split:
`document` (+ `question`, default the last user message); with it the messages may be system
messages and one user message. `question` without `document` (chats and completions) names the
question inside the last user message (or the prompt): an exact excerpt of it, which scoring never
drops (engine/chat_prompt.py); a 400 when it is not there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from ..contracts import InputError
from ..engine.json_schema import JSON_OBJECT, check as check_schema
from ..engine.options import RunParams, json_strings
from .errors import ApiError
from . import openai_schemas as O
from .openai_tools import Tools, read_calls, read_tools

#: the OpenAI error type of a bad request
INVALID = "invalid_request_error"
#: RunParams an OpenAI request gets unless its `specq` options say otherwise
OPENAI_DEFAULTS = {"mode": "auto"}


def bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, INVALID, param=param, code=code)


@dataclass
class JobSpec:
    """A job to store for an OpenAI request."""

    kind: str  # chat | completion
    model: str
    #: the raw prompt (completion), the document (chat with specq.document), else ""
    text: str = ""
    messages: list[dict[str, str]] | None = None
    #: RunParams keys (the question included)
    params: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    #: the request's tools (openai_tools.py): how its answer is read back; not stored with the job
    tools: Tools = field(default_factory=Tools)


def parse(model: type[BaseModel], raw: bytes, what: str = "request body") -> Any:
    """The request validated by `model`; a 400 naming the field otherwise (as OpenAI answers)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        errors = e.errors(include_url=False, include_input=False)
        first = errors[0] if errors else {}
        loc = ".".join(str(x) for x in first.get("loc", ()))
        kind = first.get("type", "")
        if kind == "json_invalid":
            raise bad(f"{what} is not valid JSON: {first.get('msg', '')}", None) from None
        if kind == "model_type" and not loc:
            raise bad(f"{what} must be a JSON object", None) from None
        if kind == "extra_forbidden":
            raise bad(f"Unrecognized request argument supplied: {loc}", loc) from None
        if kind == "missing":
            raise bad(f"Missing required parameter: '{loc}'.", loc) from None
        raise bad(f"Invalid value for '{loc}': {str(first.get('msg', 'invalid')).removeprefix('Value error, ')}",
                  loc or None) from None


#: the next structural character or quote (outside strings)
_STRUCTURE = re.compile(rb'[{}\[\],:"]')


def _string_end(raw: bytes, start: int) -> int:
    """The index of the quote that closes the JSON string opened at `start` (len(raw) if none); found
    with bytes.find, so a megabyte string costs one fast scan, not one step per character."""
    k = start + 1
    while True:
        k = raw.find(b'"', k)
        if k < 0:
            return len(raw)
        slashes = 0
        while raw[k - 1 - slashes] == 0x5C:
            slashes += 1
        if slashes % 2 == 0:
            return k
        k += 1


def _key(token: bytes) -> str:
    if b"\\" not in token:
        return token[1:-1].decode("utf-8", "replace")
    try:
        return str(json.loads(token))
    except ValueError:
        return ""


def body_shape(raw: bytes, max_parts: int, max_values: int) -> tuple[int, int]:
    """(content parts in `messages[*].content`, JSON values inside arrays and objects) of a request body,
    each counted up to one over its limit (then the scan stops).

    Parsing and validating a body costs time per JSON value, in calls that hold the GIL (a 17 MiB body
    of 684,000 empty parts: ~10 s), so a body with too many is refused after this count. Counting the
    bytes `{`, `[` and `,` (an upper bound of both counts) is the fast path; only a body over it is
    scanned token by token, in Python, so the thread running it lets the event loop run."""
    braces = raw.count(b"{")
    if braces <= max_parts and braces + raw.count(b"[") + raw.count(b",") <= max_values:
        return 0, 0
    parts = values = 0
    stack: list[tuple[bytes, str | None]] = []
    key: str | None = None
    last = b""
    i = 0
    while (m := _STRUCTURE.search(raw, i)) is not None:
        j = m.start()
        c = raw[j:j + 1]
        i = j + 1
        if c == b'"':
            i = _string_end(raw, j) + 1
            last = raw[j:i]
            continue
        if c == b":":
            key = _key(last)
        elif c == b",":
            key = None
            values += 1
        elif c in (b"{", b"["):
            values += 1
            stack.append((c, key))
            if c == b"{" and len(stack) == 5 and stack[1] == (b"[", "messages") and stack[3] == (b"[", "content"):
                parts += 1
            key = None
        else:
            if stack:
                stack.pop()
            key = None
        if parts > max_parts or values > max_values:
            break
    return parts, values


def parse_chat(raw: bytes) -> O.ChatCompletionRequest:
    """`parse` for a chat request with at most MAX_CONTENT_PARTS content parts (a 400 naming the limit)."""
    check_shape(raw)
    return parse(O.ChatCompletionRequest, raw)


def check_shape(raw: bytes) -> None:
    """400 for a body over MAX_CONTENT_PARTS content parts or MAX_JSON_VALUES values (`body_shape`)."""
    parts, values = body_shape(raw, O.MAX_CONTENT_PARTS, O.MAX_JSON_VALUES)
    if parts > O.MAX_CONTENT_PARTS:
        raise bad(f"the messages hold more than {O.MAX_CONTENT_PARTS} content parts (the limit per request); "
                  "join the texts into fewer parts", "messages", "too_many_content_parts")
    if values > O.MAX_JSON_VALUES:
        raise bad(f"the request body holds more than {O.MAX_JSON_VALUES} JSON values in arrays and objects (the "
                  "limit per request)", None, "too_many_values")


def _unsupported(param: str, what: str) -> ApiError:
    return bad(f"{param} is not supported by specq ({what})", param, "unsupported_parameter")


def _check_common(req: O.ChatCompletionRequest | O.CompletionRequest) -> None:
    if req.n not in (None, 1):
        raise _unsupported("n", "one choice per request; send n requests")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) not in (None, 0, 0.0):
            raise _unsupported(name, "no repetition penalties")
    if req.logit_bias:
        raise _unsupported("logit_bias", "no logit biases")


def _check_chat(req: O.ChatCompletionRequest, tools_ok: bool) -> None:
    _check_common(req)
    if req.logprobs:
        raise _unsupported("logprobs", "no log probabilities")
    if req.top_logprobs:
        raise _unsupported("top_logprobs", "no log probabilities")
    if not tools_ok:
        if req.tools:
            raise _unsupported("tools", "tool calls are answered on /v1/chat/completions, not in batches")
        if req.tool_choice not in (None, "none", "auto"):
            raise _unsupported("tool_choice", "tool calls are answered on /v1/chat/completions, not in batches")
    if req.functions:
        raise _unsupported("functions", "the deprecated functions; use tools")
    if req.function_call not in (None, "none", "auto"):
        raise _unsupported("function_call", "no function calls")
    if req.modalities not in (None, ["text"]):
        raise _unsupported("modalities", "text only")
    for name in ("audio", "prediction", "web_search_options"):
        if getattr(req, name) is not None:
            raise _unsupported(name, "not available")


def _response_format(fmt: Any) -> dict[str, Any] | None:
    """The JSON Schema a `response_format` constrains the output to (None: free text); a 400 naming the
    first part of the schema specq cannot honour (engine/json_schema.py) before anything is queued."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise _unsupported("response_format", 'type "text", "json_object" or "json_schema"')
    extra = sorted(set(fmt) - {"type", "json_schema"} if kind == "json_schema" else set(fmt) - {"type"})
    if extra:
        raise bad(f"Unrecognized argument in response_format: {str(extra[0])[:40]}", "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(JSON_OBJECT)
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise bad("response_format.json_schema must be an object {name, schema, strict}", "response_format")
    extra = sorted(set(spec) - {"name", "description", "schema", "strict"})
    if extra:
        raise bad(f"Unrecognized argument in response_format.json_schema: {str(extra[0])[:40]}", "response_format")
    if not isinstance(spec.get("name", ""), str) or not isinstance(spec.get("strict", False), (bool, type(None))):
        raise bad("response_format.json_schema: name must be a string and strict true or false", "response_format")
    schema = spec.get("schema", JSON_OBJECT)
    try:
        check_schema(schema, "response_format.json_schema.schema")
    except InputError as e:
        raise bad(str(e), "response_format", "unsupported_schema" if "not supported" in str(e) else None) from None
    return schema


def _text(msg: O.ChatMessage, i: int) -> str:
    content = msg.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise _unsupported(f"messages[{i}].content[{j}].type", f"text content only, not {part.type!r}")
        parts.append(part.text)
    return "".join(parts)


def _messages(req: O.ChatCompletionRequest, tools_ok: bool) -> tuple[list[dict[str, Any]], bool]:
    """(the messages as the job stores them, whether any is a tool result or call): a `tool` message keeps
    its role (and `tool_call_id`), an assistant's `tool_calls` their names and parsed arguments; the engine
    renders them (engine/prompt/tools.py)."""
    out: list[dict[str, Any]] = []
    any_tool = False
    for i, msg in enumerate(req.messages):
        if msg.role == "function" or msg.function_call is not None:
            raise _unsupported(f"messages[{i}].role", "the deprecated function messages; use tools")
        if (msg.role == "tool" or msg.tool_calls) and not tools_ok:
            raise _unsupported(f"messages[{i}].role", "tool calls are answered on /v1/chat/completions, not in batches")
        if msg.audio is not None:
            raise _unsupported(f"messages[{i}].audio", "text only")
        if msg.tool_calls is not None and msg.role != "assistant":
            raise bad(f"messages[{i}].tool_calls is for assistant messages", f"messages[{i}].tool_calls")
        content = _text(msg, i)
        if msg.role == "tool":
            if not msg.tool_call_id:
                raise bad(f"Missing required parameter: 'messages[{i}].tool_call_id'.", f"messages[{i}].tool_call_id")
            out.append({"role": "tool", "content": content, "tool_call_id": str(msg.tool_call_id)})
            any_tool = True
            continue
        entry: dict[str, Any] = {"role": "system" if msg.role == "developer" else msg.role, "content": content}
        if msg.tool_calls:
            entry["tool_calls"] = read_calls(msg.tool_calls, f"messages[{i}].tool_calls")
            any_tool = True
        out.append(entry)
    return out, any_tool


def _params(req, max_tokens: int | None) -> dict[str, Any]:
    """RunParams keys: specq's defaults for OpenAI requests (mode auto, as native jobs), then specq's
    options, then the OpenAI fields set."""
    params: dict[str, Any] = dict(OPENAI_DEFAULTS)
    if req.specq is not None:
        params.update({k: v for k, v in req.specq.model_dump(exclude_unset=True).items()
                       if k not in ("document", "question")})
    if req.temperature is not None:
        params["temperature"] = float(req.temperature)
    if req.top_p is not None:
        if req.top_p == 0:
            params["temperature"] = 0.0  # only the most likely token: greedy
        else:
            params["top_p"] = float(req.top_p)
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    if req.seed is not None:
        params["seed"] = req.seed
    if req.stop is not None:
        params["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    schema = _response_format(req.response_format)
    if schema is not None:
        params["json_schema"] = schema
    return params


def check_params(params: dict[str, Any]) -> RunParams:
    """The job's RunParams; a 400 naming the field the engine refuses."""
    try:
        return RunParams.from_dict(params)
    except InputError as e:
        message = str(e)
        name = next((n for n in sorted(params, key=len, reverse=True) if message.startswith(n)
                     or f"parameter {n} " in message), None)
        raise bad(message, {"max_tokens": "max_tokens"}.get(name or "", name)) from None


def _storable(spec: JobSpec) -> JobSpec:
    """400 for text the job store cannot hold (a NUL; a lone surrogate escape)."""
    from .schemas import storable

    texts = [("prompt" if spec.kind == "completion" else "specq.document", spec.text)]
    texts += [(f"messages[{i}].content", m["content"]) for i, m in enumerate(spec.messages or [])]
    texts += [(f"messages[{i}].tool_calls", t) for i, m in enumerate(spec.messages or []) for t in json_strings(m.get("tool_calls"))]
    texts += [(k, t) for k, v in spec.params.items() if isinstance(v, (dict, list)) for t in json_strings(v)]
    texts += [(k, v) for k, v in spec.params.items() if isinstance(v, str)]
    texts += [("stop", v) for v in spec.params.get("stop") or []]
    for name, value in texts:
        try:
            storable(value)
        except ValueError as e:
            raise bad(f"{name} {e}", name) from None
    return spec


def _named_question(req, params: dict[str, Any], text: str, where: str) -> None:
    """`specq.question` without `specq.document`: the question's exact text in `text` (the last user
    message, a completion's prompt), which scoring then never drops; a 400 when it is not in it."""
    question = req.specq.question if req.specq is not None else None
    if question is None:
        return
    if not question.strip() or question.strip() not in text:
        raise bad(f"specq.question must be an exact excerpt of {where} (the question it holds, which scoring "
                  "then never drops); it is not in it", "specq.question")
    params["question"] = question.strip()


def chat_spec(req: O.ChatCompletionRequest, tools_ok: bool = False) -> JobSpec:
    """The job of a chat request; `tools_ok`: tools are answered (the chat route; batch lines refuse them)."""
    _check_chat(req, tools_ok)
    tools = read_tools(req.tools, req.tool_choice, req.parallel_tool_calls) if tools_ok else Tools()
    messages, any_tool = _messages(req, tools_ok)
    params = _params(req, req.max_completion_tokens or req.max_tokens)
    if tools.active:
        params["tools"] = tools.definitions()
    schema = tools.call_schema()
    if schema is not None:
        if "json_schema" in params:
            raise bad("response_format cannot be combined with a forced tool call (tool_choice required or named)",
                      "response_format")
        params["json_schema"] = schema
    if any_tool and "mode" not in (req.specq.model_dump(exclude_unset=True) if req.specq is not None else {}):
        params["mode"] = "baseline"  # tool results and calls: nothing dropped (docs/openai.md, Tools)
    spec = JobSpec(kind="chat", model=req.model, stream=bool(req.stream), tools=tools,
                   include_usage=bool(req.stream_options and req.stream_options.include_usage))
    document = req.specq.document if req.specq is not None else None
    if document is not None and (tools.active or any_tool):
        raise bad("specq.document cannot be combined with tools or tool messages", "specq.document")
    if document is not None:
        others = [m for m in messages if m["role"] != "system"]
        if len(others) > 1 or any(m["role"] != "user" for m in others):
            raise bad("with specq.document, messages may hold only system messages and one user message",
                      "messages")
        question = req.specq.question if req.specq.question is not None else (others[0]["content"] if others else "")
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        params.update(question=question, system=system)
        spec.text = document
    else:
        if not any(m["role"] == "user" for m in messages):
            raise bad("messages must hold at least one user message", "messages")
        spec.messages = messages
        last_user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        _named_question(req, params, last_user, "the last user message")
    check_params(params)
    spec.params = params
    return _storable(spec)


def completion_spec(req: O.CompletionRequest) -> JobSpec:
    _check_common(req)
    if req.echo:
        raise _unsupported("echo", "the answer only")
    if req.suffix:
        raise _unsupported("suffix", "no insertion")
    if req.best_of not in (None, 1):
        raise _unsupported("best_of", "one choice per request")
    if req.logprobs:
        raise _unsupported("logprobs", "no log probabilities")
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise _unsupported("prompt", "one prompt as a string per request (no token ids, no lists of prompts)")
        prompt = prompt[0]
    if not prompt.strip():
        raise bad("prompt must not be empty", "prompt")
    params = _params(req, req.max_tokens)
    if req.specq is not None and req.specq.document is not None:
        raise bad("specq.document is for chat requests; a completion's prompt is the prompt", "specq.document")
    _named_question(req, params, prompt, "the prompt")
    check_params(params)
    return _storable(JobSpec(kind="completion", model=req.model, text=prompt, params=params, stream=bool(req.stream),
                             include_usage=bool(req.stream_options and req.stream_options.include_usage)))


__all__ = ["JobSpec", "parse", "parse_chat", "check_shape", "body_shape", "chat_spec", "completion_spec", "check_params", "bad", "INVALID"]
