"""Reading stored JSON defensively: rows that earlier code accepted must never break a read.

Before the API validated every request with bounded models (specq.api.schemas), a batch's
`metadata` could be any JSON: nested hundreds of levels deep (which made every list page holding it
fail to serialise), holding NaN or Infinity (which no JSON response may contain), or with any number
of pairs. Migration 0003 repairs such rows; these functions make the reads safe anyway, for a row
written by an older API process while the migration ran, or anything else unforeseen:

* `json_safe`: a copy with non-finite floats as null and anything nested deeper than `MAX_DEPTH`
  as its JSON text (cut); strings are kept;
* `safe_loads` (the engines' JSON decoder): a value nested past Python's recursion limit reads as
  a small marker object instead of failing the query;
* `clean_metadata`: metadata in the shape the API now accepts — at most 16 pairs, keys of at most 64
  characters, values strings of at most 512 (a non-string value becomes its JSON text, cut).
  Migration 0003 applies the same rule to the stored rows.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: deepest nesting kept by json_safe (responses are serialised by pydantic, whose limit is 255)
MAX_DEPTH = 32
#: OpenAI's metadata limits (also in specq.api.schemas)
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


def _as_text(value: Any, limit: int) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True, default=str)
    except (RecursionError, ValueError, TypeError):
        text = "…"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def json_safe(value: Any, depth: int = 0) -> Any:
    """`value` (decoded JSON) made serialisable: non-finite floats -> None, deeper than MAX_DEPTH ->
    its JSON text cut at 512 characters."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if depth >= MAX_DEPTH:
        return _as_text(value, METADATA_VALUE_CHARS)
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    return str(value)


def clean_metadata(value: Any) -> dict[str, str] | None:
    """Stored batch metadata in the accepted shape (see the module docstring); None stays None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return {"value": _as_text(value, METADATA_VALUE_CHARS)}
    out: dict[str, str] = {}
    for key, item in value.items():
        if len(out) >= METADATA_PAIRS:
            break
        key = str(key)[:METADATA_KEY_CHARS]
        if key in out:
            continue
        out[key] = item[:METADATA_VALUE_CHARS] if isinstance(item, str) else _as_text(item, METADATA_VALUE_CHARS)
    return out


def clean_errors(value: Any) -> dict[str, Any] | None:
    """A batch's stored `errors` as {"object": "list", "data": [{line, code, message, param}]}, or None."""
    if not isinstance(value, dict) or not isinstance(value.get("data"), list):
        return None if value is None else {"object": "list", "data": [
            {"line": None, "code": "unreadable", "message": _as_text(value, 2000), "param": None}]}
    data = []
    for item in value["data"]:
        item = item if isinstance(item, dict) else {"message": item}
        line = item.get("line")
        data.append({"line": line if isinstance(line, int) and not isinstance(line, bool) else None,
                     "code": str(item.get("code") or "error")[:64],
                     "message": item["message"] if isinstance(item.get("message"), str) else _as_text(item.get("message"), 2000),
                     "param": item.get("param") if isinstance(item.get("param"), str) else None})
    return {"object": "list", "data": data}


def safe_loads(text: str | bytes) -> Any:
    """The job store's JSON decoder (`db.get_engine`): a stored value Python's json cannot decode
    (nested past its recursion limit) becomes {"specq_unreadable": <its first 500 characters>} instead of
    failing the whole query."""
    try:
        return json.loads(text)
    except (RecursionError, ValueError) as e:
        raw = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        return {"specq_unreadable": raw[:500], "reason": type(e).__name__}


def safe_dict(value: Any) -> dict[str, Any]:
    """A stored JSON object column (params, result parts) as a serialisable dict ({} if not a dict)."""
    return json_safe(value) if isinstance(value, dict) else {}


__all__ = ["json_safe", "clean_metadata", "clean_errors", "safe_dict", "safe_loads", "MAX_DEPTH"]
