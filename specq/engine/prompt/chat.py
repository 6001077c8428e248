"""Prompts of chat and completion jobs (the OpenAI routes), and which of their tokens scoring may drop.

A chat is rendered with the target's chat template by llama.cpp's built-in renderer
(`llama_chat_apply_template`, what llama-server uses without `--jinja`); a chat with tools, tool
results or calls by the model's own Jinja template where it renders tools, else in the Hermes format
(prompt/tools.py). Each message's content (and each tool definition and call's arguments) is
tokenized as plain text (never as special tokens: a user cannot forge `<|im_start|>`), the template's
own text with special tokens, as `build_prompt` does for native jobs.

What SpecPrefill may drop ("the document" of `Prompt`): from the first non-system message's content to
the end of the last user message, less that message's protected tail — its last paragraph (after the
last blank line), at most DEFAULT_PROTECT_TAIL tokens, or its last `protect_tail` tokens when given —
and less its question wherever it stands (prompt/question.py: first, last or between document blocks;
or the exact text `question`, the API's `specq.question`), which is pinned (`Prompt.pinned`).
A `tool` message (a tool's result) counts as a user turn. Always kept: the template head (BOS, system
messages, the first turn's opener; tool definitions a template writes in its system turn), the template
text between messages, tool definitions and call arguments wherever the template puts them, and the
question (`Prompt.pinned`), the protected tail and everything after it. So
a user message holding a document and a question, in either order, is scored like a native job.
Where no question is found (`Prompt.question_found` False), only the tail is protected, and mode
auto runs baseline (auto.py).

A raw completion prompt (`/v1/completions`) is tokenized as llama-server does (special tokens parsed,
BOS added when the model wants one); its protected tail is likewise its last paragraph, and its
question is found the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ...contracts import InputError
from ..llama.binding import Model
from ..options import DEFAULT_PROTECT_TAIL
from .build import Prompt
from .question import find_question
from .tools import Segment, has_tools, hermes_messages, jinja_segments, renders_tools, role

#: stands for message i's content while the template renders (invisible separators never in templates)
_MARK = "\u2063SPECQ\u2063MSG{}\u2063"


def _pieces(model: Model, messages: Sequence[tuple[str, str]]) -> list[str]:
    """The template's text around the contents: len(messages) + 1 pieces (content i between piece i and
    i + 1). Without a usable template: the contents separated by blank lines."""
    marks = [_MARK.format(i) for i in range(len(messages))]
    rendered = model.apply_chat_template([(role, mark) for (role, _), mark in zip(messages, marks)],
                                         add_assistant=True)
    if rendered is not None and all(rendered.count(m) == 1 for m in marks):
        pieces, rest = [], rendered
        for mark in marks:
            before, rest = rest.split(mark)
            pieces.append(before)
        return pieces + [rest]
    return [""] + ["\n\n"] * (len(messages) - 1) + ["\n"] if messages else [""]


def protected_count(model: Model, content: str, tokens: Sequence[int], protect_tail: int) -> int:
    """How many of `content`'s last tokens are protected: `protect_tail`, or with -1 its last paragraph
    (the tokens from the one holding the paragraph's first character on), at most DEFAULT_PROTECT_TAIL."""
    n = len(tokens)
    if protect_tail >= 0:
        return min(protect_tail, n)
    body = content.rstrip()
    cut = body.rfind("\n\n")
    start_byte = len(body[: cut + 2].encode("utf-8")) if cut >= 0 else 0
    # counted from the end, where the last paragraph is: a walk from the start reads every token's bytes
    # (0.5 s of GIL-held Python for a 128K-token document, per job, beside the serving loop)
    from_end = len(content.encode("utf-8")) - start_byte
    seen, first = 0, n
    if from_end > 0:
        for i in range(n - 1, -1, -1):
            seen += len(model.token_bytes(tokens[i]))
            if seen >= from_end or n - i > DEFAULT_PROTECT_TAIL:
                first = i
                break
        else:
            first = 0
    return min(n - first, DEFAULT_PROTECT_TAIL) if first < n else min(n, 1)


def _sizes(model: Model, tokens: Sequence[int], backwards: bool, block: int = 1024):
    """(index, byte length) of `tokens`, from the start or from the end, in cached blocks (Model.pieces)."""
    n = len(tokens)
    starts = range(max(n - block, 0), -block, -block) if backwards else range(0, n, block)
    for s in starts:
        lo = max(s, 0)
        hi = min(s + block, n) if s >= 0 else s + block
        pieces = model.pieces(tokens[lo:hi])
        order = range(len(pieces) - 1, -1, -1) if backwards else range(len(pieces))
        for j in order:
            yield lo + j, len(pieces[j])


def _overlapping(model: Model, tokens: Sequence[int], total: int, a: int, b: int) -> range:
    """The tokens overlapping bytes [a, b) of a text of `total` bytes, read from its nearer end: the
    common question, last, costs its own tokens, not the document's (a 128K-token message's pieces
    took 0.2-0.4 s of GIL-held Python). Counted from that end, so a tokenizer's added leading space
    (SentencePiece) moves nothing."""
    if a >= total - b:
        hi = lo = len(tokens)
        end = total
        for i, size in _sizes(model, tokens, backwards=True):
            start = end - size
            if start >= b:
                hi = i
            lo, end = i, start
            if start <= a:
                break
        return range(lo, hi)
    lo, pos = None, 0
    for i, size in _sizes(model, tokens, backwards=False):
        if lo is None and pos + size > a:
            lo = i
        pos += size
        if pos >= b:
            return range(lo if lo is not None else i, i + 1)
    return range(lo if lo is not None else len(tokens), len(tokens))


def question_tokens(model: Model, content: str, tokens: Sequence[int], question: str = "",
                    where: str = "the chat message") -> tuple[list[int], str]:
    """(indices into `tokens` of the question found in `content`, a note for the result): the tokens
    overlapping question.py's spans; ([], why) where none is found. `question`: its exact text
    (InputError when it is not in `content`)."""
    found = find_question(content, question)
    if found is None:
        if question.strip():
            raise InputError(f"question (specq.question) is not in {where}: give an exact excerpt of it")
        return [], f"no question found in {where}"
    total = len(content.encode("utf-8"))
    idx: set[int] = set()
    for a, b in found.spans:
        idx.update(_overlapping(model, tokens, total, len(content[:a].encode("utf-8")),
                                len(content[:b].encode("utf-8"))))
    how = "specq.question" if found.where == "specq.question" else f"found {found.where}"
    return sorted(idx), f"question in {where} ({how}, {len(idx)} tokens) protected"


def _segments(model: Model, messages: Sequence[Sequence], tools: Sequence[dict] | None, source: str) -> list[Segment]:
    """The rendered chat as segments (tools.py): by the Jinja template `source` (a chat with tools, a
    template that renders them), else by llama.cpp's built-in renderer."""
    if source:
        return jinja_segments(source, messages, tools)
    plain = [(role(m), str(m[1])) for m in messages]
    pieces = _pieces(model, plain)
    out = [Segment("template", pieces[0])]
    for i, (_, content) in enumerate(plain):
        out += [Segment("content", content, i), Segment("template", pieces[i + 1])]
    return out


def build_chat_prompt(model: Model, messages: Sequence[Sequence], protect_tail: int = -1,
                      question: str = "", tools: Sequence[dict] | None = None) -> Prompt:
    """The prompt of a chat: `messages` are (role, content) with role system, user, assistant or tool, or
    (role, content, calls) for an assistant's tool calls (tools.py); `tools`: the job's tool definitions;
    `question`: the exact text of the question in the last user message (else it is looked for)."""
    if not messages:
        raise InputError("messages must not be empty")
    source = ""
    if has_tools(messages, tools):
        template = model.chat_template.decode("utf-8", errors="replace") if model.chat_template else ""
        if template and renders_tools(template):
            source = template
        else:  # the Hermes format in plain messages (their indices are used below)
            messages, tools = hermes_messages(messages, tools), None
    segments = _segments(model, messages, tools, source)
    first = next((i for i, m in enumerate(messages) if role(m) != "system"), len(messages))
    # a tool's result is the user's turn (the template renders it as one)
    last_user = max((i for i, m in enumerate(messages) if role(m) in ("user", "tool")), default=-1)
    contents = {i: model.tokenize(str(m[1]), add_special=False, parse_special=False) for i, m in enumerate(messages)}
    asked, note = ([], "no user message") if last_user < 0 else question_tokens(
        model, str(messages[last_user][1]), contents[last_user], question)
    last_seen = max((k for k, seg in enumerate(segments) if seg.kind == "content" and seg.index == last_user), default=-1)
    tokens: list[int] = []
    doc_start = doc_end = -1
    pinned: list[int] = []
    for k, seg in enumerate(segments):
        if seg.kind == "content":
            if doc_start < 0 and first <= seg.index <= last_user:
                doc_start = len(tokens)
            at = len(tokens)
            tokens += contents[seg.index]
            if k == last_seen and doc_start >= 0:
                doc_end = len(tokens) - protected_count(model, str(messages[last_user][1]), contents[last_user],
                                                        protect_tail)
                pinned.extend(at + j for j in asked)
            continue
        if seg.kind == "template":
            part = (model.tokenize(seg.text, add_special=(k == 0), parse_special=True)
                    if (seg.text or (k == 0 and model.add_bos)) else [])
        else:  # a tool definition or a call's arguments: user text, kept like the template's own
            part = model.tokenize(seg.text, add_special=False, parse_special=False)
        if doc_start >= 0 and doc_end < 0:
            pinned.extend(range(len(tokens), len(tokens) + len(part)))  # template text inside the document
        tokens += part
    if doc_start < 0 or doc_end <= doc_start:
        doc_start = doc_end = len(tokens) if doc_start < 0 else doc_start
        pinned = []
    return _with_tail(Prompt(tokens=tokens, doc_start=doc_start, doc_end=doc_end,
                             pinned=tuple(sorted({i for i in pinned if doc_start <= i < doc_end})),
                             question_found=bool(asked) or protect_tail > 0, question_note=note))


def build_raw_prompt(model: Model, text: str, protect_tail: int = -1, question: str = "") -> Prompt:
    """The prompt of a completion: `text` as is (special tokens parsed, BOS when the model adds one);
    `question`: the exact text of its question (else it is looked for)."""
    tokens = model.tokenize(text, add_special=True, parse_special=True)
    head = 1 if model.add_bos and tokens and len(tokens) > 1 else 0
    body = tokens[head:]
    protect = protected_count(model, text, body, protect_tail)
    asked, note = question_tokens(model, text, body, question, where="the completion prompt")
    doc_end = len(tokens) - protect
    return _with_tail(Prompt(tokens=tokens, doc_start=head, doc_end=doc_end,
                             pinned=tuple(sorted(head + j for j in asked if head + j < doc_end)),
                             question_found=bool(asked) or protect_tail > 0, question_note=note))


def _with_tail(prompt: Prompt) -> Prompt:
    """The last prompt token is always prefilled: it must lie outside the document."""
    if prompt.n and prompt.doc_end >= prompt.n:
        end = prompt.n - 1
        return dataclasses.replace(prompt, doc_start=min(prompt.doc_start, end), doc_end=end,
                                   pinned=tuple(i for i in prompt.pinned if i < end))
    return prompt


__all__ = ["build_chat_prompt", "build_raw_prompt", "protected_count", "question_tokens"]
