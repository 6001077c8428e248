"""A calibration's input lines (issue 48): checked here, apart from engine/calibration.py's passes, so that the API
(POST /v1/calibrations), which never loads llama.cpp or numpy, and the CLI check lines with the same code."""

from __future__ import annotations

import hashlib
from typing import Any


def document_sha256(text: str) -> str:
    """A calibration document's identity: the sha256 of its UTF-8 text (lines repeat documents)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: the fields a calibration line may have (`path` only where the caller reads files: the CLI)
LINE_FIELDS = ("text", "path", "document_id", "question", "answer")


class LineError(ValueError):
    """A calibration line that cannot be used; the message names the line."""


def parse_line(obj: Any, where: str, *, paths: bool) -> dict[str, str | None]:
    """One calibration line (`{"text" | "path" | "document_id", "question", "answer"?}`) checked: {source: its
    value, "question", "answer"}, one source key. `where` names the line in errors; `paths=False` (the service)
    refuses `path`: a server never reads a path a request names. The CLI (bench/calibrate.read_questions) and
    POST /v1/calibrations check lines here, so both refuse the same lines with the same words."""
    if not isinstance(obj, dict):
        raise LineError(f"{where}: not a JSON object")
    allowed = LINE_FIELDS if paths else tuple(f for f in LINE_FIELDS if f != "path")
    sources = ("text", "path", "document_id") if paths else ("text", "document_id")
    if not paths and "path" in obj:
        raise LineError(f"{where}: path is not accepted here (the service never reads a server path): send the "
                        "document's text, or the document_id of a stored document (POST /v1/documents)")
    extra = set(obj) - set(allowed)
    if extra:
        raise LineError(f"{where}: unknown field {sorted(extra)[0]!r} (fields: {' | '.join(sources)}, question, answer)")
    given = [k for k in sources if k in obj]
    if len(given) != 1:
        raise LineError(f"{where}: needs exactly one of {', '.join(sources)}")
    src = given[0]
    if not isinstance(obj[src], str) or not obj[src].strip():
        raise LineError(f"{where}: {src} must be a non-empty string")
    q = obj.get("question")
    if not isinstance(q, str) or not q.strip():
        raise LineError(f"{where}: question must be a non-empty string")
    ans = obj.get("answer")
    if ans is not None and (not isinstance(ans, str) or not ans.strip()):
        raise LineError(f"{where}: answer must be a non-empty string when given")
    return {src: obj[src], "question": q, "answer": ans}


__all__ = ["document_sha256", "parse_line", "LineError", "LINE_FIELDS"]
