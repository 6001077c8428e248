"""Where the question stands in a chat's last user message (or a completion's prompt).

A native job names its question; a chat or completion prompt is one text, and SpecPrefill must not
drop the question in it (chat_prompt.py protects what is found here). The heuristic, on text only:

1. The text is cut into blocks at blank lines.
2. A block is a *question* when it is short (at most MAX_QUESTION_CHARS characters and
   MAX_QUESTION_LINES lines), reads as prose (not code or a table: few of `{};=<>|` and no indented
   lines), and either ends with `?` (closing quotes/brackets aside), or starts with a label
   (`Question:`, `Q:`, `Task:`, `Instruction:`), or is an instruction of at most
   MAX_INSTRUCTION_CHARS characters starting with an imperative word (`explain`, `summarize`, `list`,
   `find`, … QUESTION_WORDS; not `what`/`how`/`is`: a document's own paragraphs start with those too,
   so an interrogative sentence must end with `?`). A question glued to the document by a single newline
   counts too: the first line of the first block, the last line of the last block.
3. Where the question blocks stand: at the start, at the end, or between document blocks. All are
   protected, unless they are many (more than MAX_QUESTION_BLOCKS, or more than MAX_TOTAL_CHARS in
   all: the document itself is made of short questions, an FAQ or a quiz); then only those at the
   message's two ends count, and with none there, no question is found.

Limits: a question that is long (a pasted paragraph of instructions), that is neither a `?` sentence
nor starts with one of the words (e.g. "I need the list of flags.", "What is the default width"), that sits inside a document block
without a blank line around it (other than the first or last line), or in another language than
English (only `?`, `？` and the English words are known) is not found; a document's own short
question-like paragraphs (a heading "Why?") are protected too, which only keeps a few more tokens.
`specq.question` (an exact excerpt of the message, `explicit` here) replaces the heuristic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: a question block's most characters and lines
MAX_QUESTION_CHARS = 1200
MAX_QUESTION_LINES = 8
#: more question blocks than this (or more characters in all) and only the message's ends count
MAX_QUESTION_BLOCKS = 4
MAX_TOTAL_CHARS = 2400
#: imperative words an instruction starts with (lower case); an interrogative sentence must end with "?"
#: (a document's own paragraphs often start with "When", "How", "Is")
QUESTION_WORDS = frozenset("""
explain summarize summarise describe list identify tell give write name translate extract answer quote
classify rewrite determine calculate compute please suggest outline analyze analyse evaluate compare find
locate cite predict infer""".split())
#: an instruction (no "?") is at most this long
MAX_INSTRUCTION_CHARS = 400
_LABEL = re.compile(r"^\s*(?:question|q|task|instructions?|query|prompt)\s*[:.)-]", re.IGNORECASE)
_BLANK = re.compile(r"\n[ \t\r\f]*\n\s*")
_CODE = set("{};=<>|")
_END = "\"')]*_`»”’ \t\r\n"


@dataclass(frozen=True)
class Found:
    """The question's place: character [start, end) spans of the text, sorted, and where it stands."""

    spans: tuple[tuple[int, int], ...]
    #: first | last | middle | first and last | ... | specq.question
    where: str


def is_question(block: str) -> bool:
    """Step 2 of the module docstring, for one block."""
    text = block.strip()
    if not text or len(text) > MAX_QUESTION_CHARS or text.count("\n") >= MAX_QUESTION_LINES:
        return False
    if sum(1 for c in text if c in _CODE) > max(2, len(text) // 25):
        return False
    if any(line[:1] in (" ", "\t") for line in block.strip("\n").splitlines()[1:]):
        return False
    letters = sum(1 for c in text if c.isalpha())
    if letters < 3 or letters < 0.5 * len(text.replace(" ", "")):
        return False
    if text.rstrip(_END).endswith(("?", "？")) or _LABEL.match(text):
        return True
    first = re.match(r"[A-Za-z']+", text)
    return bool(first) and first.group(0).lower() in QUESTION_WORDS and len(text) <= MAX_INSTRUCTION_CHARS


def _blocks(text: str) -> list[tuple[int, int]]:
    """[start, end) of each non-blank block (step 1)."""
    out, pos = [], 0
    for m in _BLANK.finditer(text):
        out.append((pos, m.start()))
        pos = m.end()
    out.append((pos, len(text)))
    return [(a + len(text[a:b]) - len(text[a:b].lstrip()), a + len(text[a:b].rstrip()))
            for a, b in out if text[a:b].strip()]


def _edge_lines(text: str, blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A question glued to the document by one newline: the first line of a long first block, the last
    line of a long last block, where they read as questions."""
    out = []
    if not blocks:
        return out
    a, b = blocks[0]
    nl = text.find("\n", a, b)
    if nl > 0 and not is_question(text[a:b]) and is_question(text[a:nl]):
        out.append((a, a + len(text[a:nl].rstrip())))
    a, b = blocks[-1]
    nl = text.rfind("\n", a, b)
    if nl > 0 and not is_question(text[a:b]) and is_question(text[nl + 1:b]):
        start = nl + 1 + len(text[nl + 1:b]) - len(text[nl + 1:b].lstrip())
        out.append((start, b))
    return out


def find_question(text: str, explicit: str = "") -> Found | None:
    """The question in `text` (the module docstring), or None. `explicit`: the question's exact text
    (its last occurrence is the question; None when it is not in `text`)."""
    if explicit.strip():
        q = explicit.strip()
        at = text.rfind(q)
        return Found(((at, at + len(q)),), "specq.question") if at >= 0 else None
    blocks = _blocks(text)
    if not blocks:
        return None
    asks = [i for i, (a, b) in enumerate(blocks) if is_question(text[a:b])]
    spans = [blocks[i] for i in asks]
    if len(asks) > MAX_QUESTION_BLOCKS or sum(b - a for a, b in spans) > MAX_TOTAL_CHARS:
        # an FAQ-like document: only runs of question blocks at the two ends
        ends = set()
        for order in (range(len(blocks)), range(len(blocks) - 1, -1, -1)):
            for i in order:
                if i not in asks:
                    break
                ends.add(i)
        if len(ends) == len(blocks) or sum(blocks[i][1] - blocks[i][0] for i in ends) > MAX_TOTAL_CHARS:
            ends = set()
        asks, spans = sorted(ends), [blocks[i] for i in sorted(ends)]
    spans += [s for s in _edge_lines(text, blocks) if s not in spans]
    if not spans:
        return None
    spans.sort()
    if len(spans) == len(blocks) and all(s == b for s, b in zip(spans, blocks)):
        return Found(tuple(spans), "all")  # a message of questions only (no document)
    end = blocks[-1][1]
    places = []
    for a, b in spans:
        place = "first" if a == blocks[0][0] else "last" if b == end else "middle"
        if place not in places:
            places.append(place)
    return Found(tuple(spans), " and ".join(places))


__all__ = ["Found", "find_question", "is_question", "QUESTION_WORDS", "MAX_QUESTION_CHARS"]
