"""From finished calibration units to evidence rows (issue 48): the one code path of `specq calibrate` (bench/
calibrate.py, run locally) and of calibrations run through the service (worker/calibration.py, POST
/v1/calibrations), so a row means the same whichever way it was measured.

A unit's record (`unit_record`) is engine/calibration.run_unit's dict plus where it counts: its line, its
document's content hash, its length (`length_for`: the smallest edge at or above the document's tokens) and
keep, graded where a reference exists, and its per-question metric values (evidence_metrics.question_values).
Units are grouped by (length, keep, the EvidenceKey the specprefill run resolved: `group_id`); a group's rows
(`rows_for`) are one per metric measured, written only once every planned unit of its length and keep is in
(the caller's rule). `validated_rows` runs them through evidence.row_from_dict, so a row that would not
validate is refused before any is written.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable, Iterable

from . import evidence_metrics as em
from .evidence import row_from_dict


#: the length edges a document is put under when none are given (tokens): `specq calibrate --documents` and
#: POST /v1/calibrations alike
DEFAULT_EDGES = (2048, 4096, 8192, 16384, 32768)


def length_for(tokens: int, edges: Iterable[int]) -> int | None:
    """The smallest edge >= `tokens`, or None when the document is longer than every edge."""
    fit = [e for e in sorted(set(int(x) for x in edges)) if e >= tokens]
    return fit[0] if fit else None


def unit_record(*, line: int, doc: str, length: int, keep: float, question: str, result: dict[str, Any],
                right: tuple[bool, bool] | None) -> dict[str, Any]:
    """A finished unit's record: `result` (run_unit's) with where it counts; `right`: (baseline right, specprefill
    right) where the question has a reference answer, else None."""
    rec = {"line": line, "doc": doc, "length": length, "keep": keep, "question": question, **result}
    if right is not None:
        rec["baseline_right"], rec["arm_right"] = bool(right[0]), bool(right[1])
    rec["values"] = {k: list(v) if isinstance(v, tuple) else v for k, v in em.question_values(rec).items()}
    rec["t"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return rec


def graded(answer: str | None, baseline: str, specprefill: str) -> tuple[bool, bool] | None:
    """(baseline right, specprefill right) against a given reference answer (evidence_metrics.answer_matches)."""
    if answer is None:
        return None
    return em.answer_matches(baseline, answer), em.answer_matches(specprefill, answer)


def group_id(length: int, keep: float, key: dict) -> str:
    return f"{length}:{keep:g}:" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _pairs(records: list[dict]) -> list[tuple[str, dict]]:
    return [(r["doc"], {k: tuple(v) if isinstance(v, list) else v for k, v in r["values"].items()}) for r in records]


def rows_for(records: list[dict], *, source: str, provenance: dict[str, Any], in_sample_why: str = "",
             certified: bool = False) -> list[dict[str, Any]]:
    """The evidence rows (row_from_dict's shape) of one group's unit records: one per metric measured
    (answer_right only where the questions had references). `in_sample_why`: the rows are a choosing half's
    (in-sample, and why); `certified`: a certifying half's (bench/calibrate.py, "Several keeps")."""
    r0 = records[0]
    docs_tokens = [int(r["doc_tokens"]) for r in records]
    pairs = _pairs(records)
    out = []
    for metric in em.METRICS:
        docs = em.documents_for(metric, pairs)
        if not docs:
            continue
        out.append({"key": r0["key"], "metric": metric, "arm": "specprefill", "length": int(r0["length"]),
                    "doc_tokens": [max(1, min(docs_tokens)), max(1, max(docs_tokens))], "documents": docs,
                    "bound_method": em.METHODS[metric], "in_sample": bool(in_sample_why), "in_sample_why": in_sample_why,
                    "certified": certified, "source": source, "provenance": provenance,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "disabled": ""})
    return out


def by_group(records: Iterable[dict]) -> dict[str, list[dict]]:
    """Records by `group_id` (length, keep, resolved key), in the order given."""
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(group_id(r["length"], r["keep"], r["key"]), []).append(r)
    return out


def validated_rows(records: list[dict], *, source: str, provenance: dict[str, Any]) -> list[dict[str, Any]]:
    """Every row of `records` (one (length, keep)'s units, grouped here by resolved key), validated and in the
    stored shape (EvidenceRow.as_dict); ValueError before any row is returned when one would not validate."""
    rows = [r for recs in by_group(records).values() for r in rows_for(recs, source=source, provenance=provenance)]
    return [row_from_dict(r).as_dict() for r in rows]


def service_rows(cal_id: str, **provenance: Any) -> Callable[[list[dict]], list[dict[str, Any]]]:
    """The rows of one (length, keep)'s records of calibration `cal_id` run through the service (storage/
    calibrations.write_groups' `rows_of`; the worker after a unit, the API on a read): `validated_rows` with the
    source `calibration:<id>` and a provenance naming the calibration, the backend and models that ran."""

    def rows_of(records: list[dict]) -> list[dict[str, Any]]:
        key = records[0]["key"]
        prov = {"command": "POST /v1/calibrations", "calibration": cal_id, "backend": key.get("backend"),
                "target": key.get("target"), "speculator": key.get("speculator"), **provenance,
                "note": "label-free metrics' bars are provisional (docs/quality.md, Calibrate)"}
        return validated_rows(records, source=f"calibration:{cal_id}", provenance=prov)

    return rows_of


#: a unit's role in a calibration: every document (one keep), the choosing half, the certifying half
ROLES = ("all", "choose", "certify")


def table_rows(groups: dict[str, list[dict]], roles: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One line per (length, keep, key) group (and role: `roles`, group id -> all | choose | certify): questions,
    documents, each metric's mean (answer_right's ratio), seconds per question."""
    out = []
    roles = roles or {}
    order = {r: i for i, r in enumerate(ROLES)}
    for gid, recs in sorted(groups.items(), key=lambda kv: (kv[1][0]["length"], order[roles.get(kv[0], "all")],
                                                            kv[1][0]["keep"])):
        pairs = _pairs(recs)
        line: dict[str, Any] = {"group": gid, "role": roles.get(gid, "all"), "length": recs[0]["length"],
                                "keep": recs[0]["keep"], "n": len(recs),
                                "documents": len({r["doc"] for r in recs}),
                                "doc_tokens": [min(r["doc_tokens"] for r in recs), max(r["doc_tokens"] for r in recs)],
                                "seconds_per_question": round(sum(r["seconds"] for r in recs) / len(recs), 2)}
        for metric in em.METRICS:
            docs = em.documents_for(metric, pairs)
            if not docs:
                line[metric] = None
            elif metric == "answer_right":
                b = sum(d["baseline_right"] for d in docs.values())
                line[metric] = round(sum(d["arm_right"] for d in docs.values()) / b, 4) if b else None
            else:
                line[metric] = round(em.mean(docs), 4)
        out.append(line)
    return out


__all__ = ["DEFAULT_EDGES", "length_for", "unit_record", "graded", "group_id", "rows_for", "by_group", "validated_rows", "service_rows", "ROLES", "table_rows"]
