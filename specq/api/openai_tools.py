"""OpenAI tool calls on /v1/chat/completions: `tools` and `tool_choice` checked, passed to the job, the
forced call constrained by a grammar, and the answer read back as `tool_calls`.

Rendering is the engine's (engine/prompt/tools.py): the job carries the tool definitions
(`params.tools`, only while a tool may be called) and the chat's `tool` messages and assistant
`tool_calls` as they are (`messages[i].tool_calls` with their arguments parsed); the worker renders them
with the model's own Jinja chat template where it renders tools (Qwen2.5's does: its Hermes
`<tools>` / `<tool_call>` / `<tool_response>` format), else in a documented Hermes system-message format.
This module only checks them, with OpenAI's words.

Decoding: `tool_choice` `required` or a named function → the whole answer is the call's JSON object
`{"name": …, "arguments": …}` (no `<tool_call>` wrapper), constrained by a JSON Schema (the job's
`json_schema`): `name` one of the tools (or the named one), `arguments` that function's `parameters`,
each checked by the same allowlist as `response_format` (engine/json_schema.py); one call.
`auto` → unconstrained, and the answer may hold several calls (parallel tool calls; Qwen2.5's Hermes
format writes one `<tool_call>` block per call): `Tools.answer_calls` reads them (its docstring says
when an answer is calls and when content). `parallel_tool_calls: false` → only the first call is
returned (OpenAI's "at most one"; the model is not constrained to write one).
`none` → the tools are not passed to the model and no call is read.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from ..contracts import InputError
from ..engine.json_schema import JSON_OBJECT, check as check_schema
from .errors import ApiError

#: OpenAI's rule for function names
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: a call block of an unconstrained answer (Hermes format), and an opening tag (an unclosed block counts)
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
OPEN = "<tool_call>"

def _bad(message: str, param: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param=param, code=code)


@dataclass
class Tools:
    """A request's tools as specq answers them (`choice` none: no tools in the prompt, no call read)."""

    functions: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {description, parameters}
    choice: str = "none"  # none | auto | required | named
    named: str | None = None
    #: the request's `parallel_tool_calls` (absent: true): false → at most one call is returned
    parallel: bool = True

    @property
    def active(self) -> bool:
        return self.choice != "none" and bool(self.functions)

    @property
    def forced(self) -> bool:
        return self.active and self.choice in ("required", "named")

    def definitions(self) -> list[dict[str, Any]] | None:
        """The tool definitions the job carries (`params.tools`; None when no tool may be called)."""
        if not self.active:
            return None
        return [{"type": "function", "function": {"name": n, **f}} for n, f in self.functions.items()]

    def call_schema(self) -> dict[str, Any] | None:
        """The JSON Schema of a forced answer (None unless `forced`)."""
        if not self.forced:
            return None
        names = [self.named] if self.choice == "named" else list(self.functions)
        alts = [{"type": "object", "properties": {"name": {"const": n},
                                                  "arguments": self.functions[n]["parameters"]},
                 "required": ["name", "arguments"], "additionalProperties": False} for n in names]
        return alts[0] if len(alts) == 1 else {"anyOf": alts}

    def answer_calls(self, text: str) -> list[dict[str, Any]]:
        """The OpenAI tool calls an answer holds, in order; [] when the answer is content.

        * A bare JSON object `{"name": …, "arguments": {…}}` naming a tool — the whole answer, or its one
          fenced code block — is one call (a forced call's grammar writes exactly this).
        * Otherwise every `<tool_call>{…}</tool_call>` block, in order (prose around them is dropped).
          The answer is calls only when every block parses and names a tool (for a named `tool_choice`,
          that one) with object `arguments`, and no `<tool_call>` is left unclosed (an answer cut by
          `max_tokens`); one bad block makes the whole answer content, as a partial list of calls would
          silently lose the others.
        A forced call, or `parallel_tool_calls: false`, returns the first call only."""
        if not self.active:
            return []
        found = _object(_unfenced(text.strip()))
        if found is not None:
            blocks = [found]
        else:
            bodies = CALL.findall(text)
            if not bodies or text.count(OPEN) != len(bodies):
                return []
            blocks = [_object(b.strip()) for b in bodies]
        calls = [self._call(b) for b in blocks]
        if any(c is None for c in calls):
            return []
        return calls[:1] if self.forced or not self.parallel else calls  # type: ignore[return-value]

    def _call(self, found: dict[str, Any] | None) -> dict[str, Any] | None:
        """One block as an OpenAI tool call (its own id), else None."""
        if found is None or found.get("name") not in self.functions or set(found) - {"name", "arguments"}:
            return None
        if self.choice == "named" and found["name"] != self.named:
            return None
        args = found.get("arguments", {})
        if not isinstance(args, dict):
            return None
        return {"id": "call_" + secrets.token_hex(12), "type": "function",
                "function": {"name": found["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


#: an answer that is one fenced code block (Qwen2.5-Coder 1.5B under its own template answers a call so)
FENCE = re.compile(r"^```[A-Za-z0-9_-]*\n(.*)\n```$", re.S)


def _unfenced(text: str) -> str:
    m = FENCE.match(text)
    return m.group(1) if m else text


def _object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_tools(tools: list[Any] | None, choice: Any, parallel: bool | None = None) -> Tools:
    """`tools` and `tool_choice` checked (a 400 naming the part refused, a schema's keyword included), with
    `parallel_tool_calls` (None: true)."""
    out = Tools(parallel=parallel is not False)
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise _bad(f'{where} must be {{"type": "function", "function": {{name, description, parameters}}}}',
                       "tools")
        fn = tool["function"]
        extra = sorted(set(tool) - {"type", "function"}) or sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if extra:
            raise _bad(f"Unrecognized argument in {where}: {str(extra[0])[:40]}", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise _bad(f"{where}.function.name must be 1 to 64 letters, digits, _ or -", "tools")
        if name in out.functions:
            raise _bad(f"{where}.function.name {name!r} is given twice", "tools")
        if not isinstance(fn.get("description", ""), str):
            raise _bad(f"{where}.function.description must be a string", "tools")
        params = fn.get("parameters", dict(JSON_OBJECT))
        try:
            check_schema(params, f"{where}.function.parameters")
        except InputError as e:
            raise _bad(str(e), "tools", "unsupported_schema" if "not supported" in str(e) else None) from None
        if params.get("type") != "object":
            raise _bad(f'{where}.function.parameters must be a schema of "type": "object"', "tools")
        out.functions[name] = {**({"description": fn["description"]} if fn.get("description") else {}),
                               "parameters": params}
    if choice is None:
        out.choice = "auto" if out.functions else "none"
    elif choice in ("none", "auto", "required"):
        out.choice = choice
    elif (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
          and set(choice) == {"type", "function"}):
        out.choice, out.named = "named", choice["function"].get("name")
        if out.named not in out.functions:
            raise _bad(f"tool_choice names {str(out.named)[:64]!r}, which is not one of the tools", "tool_choice")
    else:
        raise _bad('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": …}}',
                   "tool_choice")
    if out.choice in ("required", "named") and not out.functions:
        raise _bad(f"tool_choice {out.choice!r} needs tools", "tool_choice")
    return out


def read_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` checked, as the job stores them: each call's `arguments` (a JSON
    string in OpenAI's format) parsed into its object."""
    if not isinstance(calls, list) or not calls:
        raise _bad(f"{where} must be a list of tool calls", where)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments", "{}"), str):
            raise _bad(f'{where}[{j}] must be {{"id", "type": "function", "function": {{name, arguments (a JSON '
                       "string)}}}}", where)
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            raise _bad(f"{where}[{j}].function.arguments is not JSON", where) from None
        if not isinstance(args, dict):
            raise _bad(f"{where}[{j}].function.arguments must be a JSON object", where)
        if not NAME.match(fn["name"]):  # a template writes the name as its own text
            raise _bad(f"{where}[{j}].function.name must be 1 to 64 letters, digits, _ or -", where)
        out.append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


__all__ = ["Tools", "read_tools", "read_calls"]
