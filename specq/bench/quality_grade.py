"""Deterministic graders of the non-lookup kinds (quality_kinds.py): an answer text against the task's reference.

`grade(task, text)` -> Grade(right, score, detail):

* sets (two-place callers, aggregation's exception classes): right when every reference name is named (as
  a whole word) and no other candidate is (another function of the document, another exception class):
  a partly right or padded list is wrong; `score` is the share of reference names named;
* counts (aggregation's parameter count): the first number of the answer (digits or a word up to twenty);
* review: graded on the line only — right when the answer quotes the bug's line (as changed, or as it was
  before the change), whitespace aside, and quotes at most one other line of the function (quoting the
  whole function points at no line);
* summary: `right` is None (never answer-right); `score` is the share of the reference's identifiers the
  answer names (`ids_named`). `fidelity` is the hook for the calibrate issue's label-free metric: None
  until that metric exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .quality_tasks import Task

_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty".split())}
_EXCEPTION_LIKE = re.compile(r"\b[A-Z]\w*(?:Error|Exception|Warning|Exit|Interrupt|Iteration)\b")


@dataclass
class Grade:
    right: Optional[bool]  #: None: this kind has no answer-right (summary)
    score: float
    detail: dict[str, Any] = field(default_factory=dict)
    fidelity: Optional[float] = None  #: summary: the label-free fidelity (another issue's metric); None until it exists


def _named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


def _norm(line: str) -> str:
    return " ".join(line.split())


def grade_set(reference: list[str], others: list[str], text: str) -> Grade:
    hit = [n for n in reference if _named(n, text)]
    extra = sorted({n for n in others if n not in reference and _named(n, text)})
    score = len(hit) / len(reference) if reference else 0.0
    return Grade(len(hit) == len(reference) and not extra, score, {"named": hit, "extra": extra})


def first_number(text: str) -> int | None:
    m = re.search(r"\b(\d+)\b|\b(" + "|".join(_NUMBER_WORDS) + r")\b", text.lower())
    if not m:
        return None
    return int(m.group(1)) if m.group(1) else _NUMBER_WORDS[m.group(2)]


def grade_review(task: Task, text: str) -> Grade:
    flat = _norm(text).replace("`", "")
    target = {_norm(task.meta["reference"]), _norm(task.meta["original"])}
    quoted = any(t in flat for t in target)
    others = [x for x in task.meta.get("function_lines", []) if _norm(x) not in target and _norm(x) in flat]
    return Grade(quoted and len(others) <= 1, 1.0 if quoted else 0.0, {"quoted": quoted, "other_lines": len(others)})


def ids_named(reference: list[str], text: str) -> float:
    return sum(_named(n, text) for n in reference) / len(reference) if reference else 0.0


def grade(task: Task, text: str) -> Grade:
    m = task.meta
    if task.kind == "two-place":
        return grade_set(m["reference"], m.get("others", []), text)
    if task.kind == "aggregation":
        if m["question_type"] == "count":
            got = first_number(text)
            return Grade(got == m["reference"], float(got == m["reference"]), {"number": got})
        return grade_set(m["reference"], _EXCEPTION_LIKE.findall(text), text)
    if task.kind == "review":
        return grade_review(task, text)
    if task.kind == "summary":
        s = ids_named(m["reference"], text)
        return Grade(None, s, {"ids_named": s})
    raise ValueError(f"no grader for kind {task.kind!r}")


__all__ = ["Grade", "grade", "grade_set", "grade_review", "first_number", "ids_named"]
