"""The quality-evidence table (`quality_evidence`, migrations 0007 and 0010: `certified`): rows written through POST /v1/evidence.

Rows arrive here already validated (engine/evidence.row_from_dict, in the API) and as plain dicts
(`EvidenceRow.as_dict()` shape): storage does not import the engine. `revision` grows by one with every
write; `version()` is its maximum (0 for an empty table), the number a worker compares at claim time
to reload its rows without a restart (worker/runtime.py).
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .models import EvidenceRecord

#: the EvidenceKey's fields, stored as columns of the same names
KEY_COLUMNS = ("target_sha256", "speculator_sha256", "backend", "prompt_shape", "task", "positions", "score_math",
               "scorer", "window", "chunk_rule", "keep", "max_keep", "chunk", "lookahead", "pool", "selection",
               "pipelined", "protect_tail", "target", "speculator")


def new_evidence_id() -> str:
    return "ev_" + secrets.token_hex(12)


def version(session: Session) -> int:
    """The table's revision: changes whenever a row is written."""
    return int(session.scalar(select(func.max(EvidenceRecord.revision))) or 0)


def _created(text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00")) if text else datetime.now(timezone.utc)
    except ValueError:
        t = datetime.now(timezone.utc)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def add_row(session: Session, row: dict[str, Any]) -> EvidenceRecord:
    """Store one validated row (as_dict shape) and commit; its revision is the table's next (two writers at
    once may share one: any change of the maximum is what readers watch)."""
    return add_rows(session, [row])[0]


def add_rows(session: Session, rows: list[dict[str, Any]]) -> list[EvidenceRecord]:
    """Store validated rows in one transaction, all or none (`specq calibrate --local`: one row per metric of
    a length), under one new revision."""
    try:
        recs = stage_rows(session, rows)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return recs


def stage_rows(session: Session, rows: list[dict[str, Any]]) -> list[EvidenceRecord]:
    """Add validated rows under one new revision to the caller's open transaction, without committing (the
    caller commits them with its own writes: storage/calibrations.write_groups marks a group written in the
    same transaction)."""
    revision = version(session) + 1
    recs = [_record(row, revision) for row in rows]
    session.add_all(recs)
    return recs


def _record(row: dict[str, Any], revision: int) -> EvidenceRecord:
    key = row["key"]
    return EvidenceRecord(
        id=new_evidence_id(), revision=revision,
        **{c: key.get(c, "") if c in ("target", "speculator") else key[c] for c in KEY_COLUMNS},
        metric=row["metric"], arm=row["arm"], length=row["length"], doc_tokens_min=row["doc_tokens"][0],
        doc_tokens_max=row["doc_tokens"][1], n=row["n"], documents=row["documents"], bound_method=row["bound_method"],
        bound=row["bound"], passes=row["passes"], in_sample=row["in_sample"], in_sample_why=row["in_sample_why"],
        source=row["source"], provenance=row["provenance"], created_at=_created(row.get("created_at", "")),
        disabled=row["disabled"], certified=row.get("certified", False))


def to_row(rec: EvidenceRecord) -> dict[str, Any]:
    """A stored row in the shape engine/evidence.row_from_dict reads (and `id`, `revision`)."""
    return {"id": rec.id, "revision": rec.revision, "key": {c: getattr(rec, c) for c in KEY_COLUMNS},
            "metric": rec.metric, "arm": rec.arm, "length": rec.length, "doc_tokens": [rec.doc_tokens_min, rec.doc_tokens_max],
            "n": rec.n, "documents": rec.documents, "bound_method": rec.bound_method, "bound": rec.bound,
            "in_sample": rec.in_sample, "in_sample_why": rec.in_sample_why, "source": rec.source,
            "provenance": rec.provenance, "created_at": rec.created_at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z"), "disabled": rec.disabled,
            "certified": rec.certified}


def list_rows(session: Session) -> list[dict[str, Any]]:
    """Every stored row, oldest first."""
    return [to_row(r) for r in session.scalars(select(EvidenceRecord).order_by(EvidenceRecord.revision))]


__all__ = ["add_row", "add_rows", "stage_rows", "list_rows", "to_row", "version", "KEY_COLUMNS"]
