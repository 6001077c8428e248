"""A chat with tools as text: the model's own Jinja chat template where it renders tools, else the
Hermes system-message format.

A chat job's messages are `(role, content)` tuples, or `(role, content, calls)` for an assistant
message that called tools (`calls`: `{"name", "arguments"}` dicts, arguments a JSON object); role
`tool` is a tool's result. The tool definitions come from the job's `params.tools` (OpenAI's
`{"type": "function", "function": {name, description, parameters}}`, checked by the API).

**The model's template** (`tokenizer.chat_template` of the GGUF, read as llama.cpp stores it) is
rendered with jinja2's `ImmutableSandboxedEnvironment` the way Hugging Face's `apply_chat_template`
renders it (`trim_blocks`, `lstrip_blocks`, `tojson` as `json.dumps(…, ensure_ascii=False)`,
`raise_exception`, `add_generation_prompt`; `bos_token`/`eos_token` are empty: the tokenizer adds
BOS itself). It is used when it *renders tools*: a probe with one tool shows the tool's JSON in the
output (Qwen2.5's template does; `renders_tools`). Templates without a tool branch, or that fail in the
sandbox, get the Hermes format instead (`hermes_messages`): the definitions appended to the first
system message, a `tool` message as a user turn holding `<tool_response>…</tool_response>`, an
assistant's calls as `<tool_call>…</tool_call>` lines, rendered then by llama.cpp's built-in renderer.

**What is user text**: every message content, every tool definition's JSON and every call's arguments
are rendered as *marks* (`Segment.kind` "content", "tool", "arguments") and tokenized as plain text
(never as special tokens: a tool description cannot forge `<|im_start|>`); the template's own text is
tokenized with special tokens. A template that writes a tool's fields itself rather than through
`tojson` writes them as its own text (Qwen2.5's writes definitions only through `tojson`; function
names, which templates do write directly, are held to OpenAI's `[A-Za-z0-9_-]{1,64}`).
engine/prompt/chat.py builds the prompt from the segments; tool definitions are never dropped by
scoring (chat.py's module doc).
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Sequence

from ...contracts import InputError

_MARK = "\u2063SPECQ\u2063{kind}{key}\u2063"
#: OpenAI's rule for function names: a template writes a call's name as its own text
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MARKS = re.compile("\u2063SPECQ\u2063(MSG|TOOL|ARGS)([0-9.]+)\u2063")

HERMES_SYSTEM = ("# Tools\n\nYou may call a function to answer the user. The functions, one JSON signature a line, "
                 "are inside <tools></tools>:\n<tools>\n{signatures}\n</tools>\n\nTo call a function, answer with "
                 "its name and its arguments as a JSON object inside <tool_call></tool_call>:\n<tool_call>\n"
                 '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


@dataclass(frozen=True)
class Segment:
    """A run of the rendered chat: the template's own text (`kind` "template", special tokens parsed) or
    user text ("content" of message `index`, a "tool" definition, a call's "arguments": plain text)."""

    kind: str
    text: str
    index: int = -1


def role(message: Sequence[Any]) -> str:
    return str(message[0])


def calls_of(message: Sequence[Any]) -> list[dict[str, Any]]:
    return list(message[2]) if len(message) > 2 and message[2] else []


def has_tools(messages: Sequence[Sequence[Any]], tools: Sequence[dict] | None) -> bool:
    """Whether a chat needs the tool-aware rendering (tool definitions, a tool result or a call)."""
    return bool(tools) or any(role(m) == "tool" or calls_of(m) for m in messages)


# ----------------------------------------------------------------------------------------- Hermes


def call_line(call: dict[str, Any]) -> str:
    return ("<tool_call>\n" + json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
            + "\n</tool_call>")


def hermes_messages(messages: Sequence[Sequence[Any]], tools: Sequence[dict] | None) -> list[tuple[str, str]]:
    """The chat as plain (role, content) messages in the Hermes format (module doc)."""
    out: list[tuple[str, str]] = []
    for m in messages:
        r, content = role(m), str(m[1])
        if r == "tool":
            out.append(("user", f"<tool_response>\n{content}\n</tool_response>"))
            continue
        calls = calls_of(m)
        if calls:
            lines = "\n".join(call_line(c) for c in calls)
            content = f"{content}\n{lines}" if content else lines
        out.append((r, content))
    if tools:
        signatures = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        extra = HERMES_SYSTEM.format(signatures=signatures)
        if out and out[0][0] == "system":
            out[0] = ("system", f"{out[0][1]}\n\n{extra}" if out[0][1] else extra)
        else:
            out.insert(0, ("system", extra))
    return out


# ----------------------------------------------------------------------------------------- Jinja


class _Marked(dict):
    """A dict that `tojson` renders as its mark (the JSON itself is put back as plain-text tokens)."""

    mark = ""


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    if isinstance(value, _Marked):
        return value.mark
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise InputError(f"the model's chat template refused the chat: {message}")


@functools.lru_cache(maxsize=8)
def _compiled(source: str):
    """The template compiled in a sandbox (Hugging Face's settings), or None if jinja2 cannot take it."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = time.strftime
    try:
        return env.from_string(source)
    except TemplateError:
        return None


def _render(template, messages: list[dict], tools: list | None) -> str:
    return template.render(messages=messages, tools=tools, add_generation_prompt=True, bos_token="", eos_token="")


@functools.lru_cache(maxsize=8)
def renders_tools(source: str) -> bool:
    """Whether the template writes tool definitions (a probe: one tool, one user message)."""
    template = _compiled(source)
    if template is None:
        return False
    probe = _Marked({"type": "function", "function": {"name": "probe", "parameters": {"type": "object"}}})
    probe.mark = _MARK.format(kind="TOOL", key=0)
    try:
        text = _render(template, [{"role": "user", "content": "hi"}], [probe])
    except Exception:  # noqa: BLE001 - any failure in the sandbox: the template is not used for tools
        return False
    return probe.mark in text


def jinja_segments(source: str, messages: Sequence[Sequence[Any]], tools: Sequence[dict] | None) -> list[Segment]:
    """The chat rendered by the template `source` (which `renders_tools`), as segments (module doc)."""
    template = _compiled(source)
    values: dict[str, tuple[str, str, int]] = {}  # mark -> (kind, text, message index)

    def mark(kind: str, key: str, text: str, index: int = -1) -> str:
        m = _MARK.format(kind=kind, key=key)
        values[m] = ({"MSG": "content", "TOOL": "tool", "ARGS": "arguments"}[kind], text, index)
        return m

    rendered_messages = []
    for i, m in enumerate(messages):
        content = str(m[1])
        d: dict[str, Any] = {"role": role(m), "content": mark("MSG", str(i), content, i) if content else ""}
        calls = calls_of(m)
        if calls:
            d["tool_calls"] = []
            for k, c in enumerate(calls):
                if not isinstance(c.get("name"), str) or not _NAME.match(c["name"]):
                    raise InputError(f"messages[{i}]: a tool call's name must be 1 to 64 letters, digits, _ or -")
                args = _Marked(c["arguments"])
                args.mark = mark("ARGS", f"{i}.{k}", json.dumps(c["arguments"], ensure_ascii=False), i)
                d["tool_calls"].append({"type": "function", "function": {"name": c["name"], "arguments": args}})
        rendered_messages.append(d)
    marked_tools = None
    if tools:
        marked_tools = []
        for j, t in enumerate(tools):
            mt = _Marked(t)
            mt.mark = mark("TOOL", str(j), json.dumps(t, ensure_ascii=False))
            marked_tools.append(mt)
    try:
        text = _render(template, rendered_messages, marked_tools)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - the template's own failure, named
        raise InputError(f"the model's chat template failed on this chat: {type(e).__name__}: {str(e)[:200]}") from None
    out: list[Segment] = []
    pos = 0
    for m in _MARKS.finditer(text):
        out.append(Segment("template", text[pos:m.start()]))
        kind, value, index = values[m.group(0)]
        out.append(Segment(kind, value, index))
        pos = m.end()
    out.append(Segment("template", text[pos:]))
    return out


def plain_text(segments: Sequence[Segment]) -> str:
    """The rendered chat as one text (what jinja2 renders with Hugging Face's `tojson`)."""
    return "".join(s.text for s in segments)


__all__ = ["HERMES_SYSTEM", "Segment", "call_line", "calls_of", "has_tools", "hermes_messages", "jinja_segments",
           "plain_text", "renders_tools", "role"]
