"""repair stored JSON that earlier API versions accepted: batch metadata and params, job params

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

A data migration (the schema does not change). Before the API validated requests with bounded models
(specq/api/schemas.py), a batch's `metadata` could be any JSON — nested hundreds of levels deep (every
list page holding it then answered 500), holding NaN or Infinity (SQLite stored them; no JSON response
may hold them), with any number of pairs of any size — and a batch's default `params` were stored as
sent even when every line of the batch was refused. Every job also kept its question twice: in
job_inputs and in `params`.

Upgrade rewrites only the rows that need it:

* `batches.metadata` -> at most 16 pairs, keys cut to 64 characters, values strings cut to 512 (a
  non-string value becomes its JSON text, cut); metadata Python cannot decode at all (nested past its
  recursion limit) becomes {"specq_unreadable": <its first 500 characters>, "reason": ...} — the same
  rule as specq.storage.sanitize.clean_metadata, which applies it on every read as well;
* `batches.params` -> only the known RunParams keys with a string, finite number or boolean value;
* `jobs.params` -> without `question` (job_inputs.question holds it; the worker reads it from there).

Downgrade does nothing: the repaired values are valid for every version, and what was cut is gone.
The logic is copied here, not imported, so this migration keeps doing what it did when the code moves.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PAIRS, KEY_CHARS, VALUE_CHARS = 16, 64, 512
#: RunParams' fields when this migration was written
PARAM_NAMES = ("question", "mode", "positions", "keep", "chunk", "max_keep", "min_tokens", "lookahead", "pool", "scorer",
               "window", "max_tokens", "temperature", "top_k", "top_p", "seed", "draft", "n_draft", "draft_min",
               "p_min", "ngram", "system")
#: rows read per query
PAGE = 500


def _loads(raw: Any) -> Any:
    if raw is None or not isinstance(raw, (str, bytes)):
        return raw
    try:
        return json.loads(raw)
    except (RecursionError, ValueError) as e:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        return {"specq_unreadable": text[:500], "reason": type(e).__name__}


def _text(value: Any, limit: int) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True, default=str)
    except (RecursionError, ValueError, TypeError):
        text = "…"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean_metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        return {"value": _text(value, VALUE_CHARS)}
    out: dict[str, str] = {}
    for key, item in value.items():
        if len(out) >= PAIRS:
            break
        key = str(key)[:KEY_CHARS]
        if key not in out:
            out[key] = item[:VALUE_CHARS] if isinstance(item, str) else _text(item, VALUE_CHARS)
    return out


def clean_params(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        return {}
    out = {}
    for key, item in value.items():
        finite = not isinstance(item, float) or math.isfinite(item)
        if key in PARAM_NAMES and isinstance(item, (str, int, float, bool)) and finite:
            out[key] = item
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return json.dumps(a, sort_keys=True, allow_nan=True) == json.dumps(b, sort_keys=True, allow_nan=True)
    except (RecursionError, ValueError, TypeError):
        return False


def upgrade() -> None:
    conn = op.get_bind()
    pg = conn.dialect.name == "postgresql"
    cast = "CAST({} AS TEXT)"
    after = ""
    update = sa.text("UPDATE batches SET metadata = " + ("CAST(:m AS jsonb)" if pg else ":m")
                     + ", params = " + ("CAST(:p AS jsonb)" if pg else ":p") + " WHERE id = :id")
    while True:  # batches, a page at a time in id order: the raw text, decoded here (deep JSON included)
        rows = conn.execute(sa.text(f"SELECT id, {cast.format('metadata')}, {cast.format('params')} FROM batches "
                                    "WHERE id > :after ORDER BY id LIMIT :n"), {"after": after, "n": PAGE}).all()
        for batch_id, raw_metadata, raw_params in rows:
            metadata, params = _loads(raw_metadata), _loads(raw_params)
            fixed_metadata, fixed_params = clean_metadata(metadata), clean_params(params)
            unreadable = any(isinstance(v, dict) and "specq_unreadable" in v for v in (metadata, params))
            if unreadable or not _same(metadata, fixed_metadata) or not _same(params, fixed_params):
                conn.execute(update, {"id": batch_id, "p": json.dumps(fixed_params),
                                      "m": None if fixed_metadata is None else json.dumps(fixed_metadata)})
        if len(rows) < PAGE:
            break
        after = rows[-1][0]
    # the question is stored once, in job_inputs
    if pg:
        conn.execute(sa.text("UPDATE jobs SET params = params - 'question' WHERE jsonb_typeof(params) = 'object' "
                             "AND params ? 'question'"))
    else:
        conn.execute(sa.text("UPDATE jobs SET params = json_remove(params, '$.question') WHERE json_valid(params) "
                             "AND json_type(params, '$.question') IS NOT NULL"))


def downgrade() -> None:
    pass
