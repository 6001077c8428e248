"""Prompt building with the target's chat template, and the regions SpecPrefill must know about.

The prompt is [template head][document][question + template tail]. The head and the tail are
protected (always prefilled); only document tokens compete for the keep budget. The question comes
after the document so that the speculator's lookahead queries "ask" it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..llama.binding import Model

_MARK = "\u2063SPECQ\u2063DOCUMENT\u2063"  # invisible separators: never in a real template


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    #: [0, doc_start): template head (BOS, system message, user-turn opener)
    doc_start: int
    #: [doc_start, doc_end): the document; [doc_end, N): question + template tail
    doc_end: int
    #: indices inside the document that are always kept too (a chat's template text between messages)
    pinned: tuple[int, ...] = ()
    #: chat and completion prompts: whether their question is protected (prompt/question.py found it,
    #: `specq.question` named it, or `protect_tail` > 0 did); native prompts always protect theirs
    question_found: bool = True
    #: what was protected as the question, or why nothing was (chat and completion prompts)
    question_note: str = ""

    @property
    def n(self) -> int:
        return len(self.tokens)

    @cached_property
    def array(self) -> np.ndarray:
        """The tokens as int32, made once per prompt: prefix matching compares them with every slot's and
        every cached entry's (converting a 32K-token list takes about a millisecond each time)."""
        arr = np.asarray(self.tokens, dtype=np.int32)
        arr.flags.writeable = False
        return arr

    @property
    def head(self) -> list[int]:
        return self.tokens[: self.doc_start]

    @property
    def document(self) -> list[int]:
        return self.tokens[self.doc_start : self.doc_end]

    @property
    def tail(self) -> list[int]:
        return self.tokens[self.doc_end :]

    def protected_indices(self) -> list[int]:
        return list(range(self.doc_start)) + list(self.pinned) + list(range(self.doc_end, self.n))


def build_prompt(model: Model, document: str, question: str = "", system: str = "") -> Prompt:
    """Tokenize the chat-formatted prompt, tracking where the document starts and ends."""
    user = _MARK + ("\n\n" + question if question else "")
    messages = ([("system", system)] if system else []) + [("user", user)]
    rendered = model.apply_chat_template(messages, add_assistant=True)
    if rendered is None or rendered.count(_MARK) != 1:
        # no usable template: plain text, question last
        head_text, tail_text = "", ("\n\n" + question + "\n" if question else "")
    else:
        head_text, tail_text = rendered.split(_MARK)
    asked = "\n\n" + question if question else ""
    if asked and tail_text.startswith(asked):
        tail_text = tail_text[len(asked) :]
    head = model.tokenize(head_text, add_special=True, parse_special=True) if (head_text or model.add_bos) else []
    doc = model.tokenize(document, add_special=False, parse_special=False)
    # user text (document, question) never becomes special tokens; the template's own text does
    tail = model.tokenize(asked, add_special=False, parse_special=False) if asked else []
    tail += model.tokenize(tail_text, add_special=False, parse_special=True) if tail_text else []
    if not tail and doc:
        # the last prompt token must be outside the document (it is always prefilled)
        tail, doc = doc[-1:], doc[:-1]
    return Prompt(tokens=head + doc + tail, doc_start=len(head), doc_end=len(head) + len(doc))
