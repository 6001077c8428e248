"""The kind x length table of docs/quality.md (`report:quality-kinds`, issue 49 item 2), from the kinds' answer journals.

One line per journal and (kind, length, shape, keep), with the journal's chunk rule (one a journal: it is in the
settings key): quality_report.kind_rows' counts (answered questions with the
closed-book-right ones left out and counted apart, documents, baseline and specprefill right, the ratio and its
document-clustered lower bound, the share of questions whose evidence chunks were all kept), and what the issue
asks besides: a `status` against the evidence rows' own pass bar (evidence.PASS_BARS, so the table and
`specq evidence build`'s rows cannot disagree), the hours the line's questions took and the 1-minute load average
while they ran. Computed from whatever the journal holds, so a run still in progress gives lines that are
"too few" until it has enough.

Hours: a record is stamped (`t`) when its question is done, so a question's wall time is the time since the
previous record's stamp. The journal's first record has no previous stamp, and a record after a gap longer than
twice its TTFTs plus `RESUME_SLACK_S` (or a stamp earlier than the one before) follows a stop and a resume of the
run: those count their recorded TTFTs only (a lower bound; the line says how many).
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from ..engine.policy.evidence import PASS_BARS
from .quality_report import CODE_KINDS, answer_rule, kind_rows, read_journal

#: the journals the table reads (bench/results): `kinds-cpu-<date>-answer-<length>.jsonl` and
#: `kinds-cpu-<date>-chat-answer-<length>.jsonl`
PATTERN = "kinds-cpu-*-answer-*.jsonl"
#: seconds a gap may exceed twice a question's TTFTs and still be that question's own time (a closed-book answer,
#: two answers' generation, tokenizing and scoring on a loaded 2-core CPU); beyond it the run was stopped
RESUME_SLACK_S = 1800
STATUSES = ("passes", "fails", "inconclusive", "too few", "no pass bar")


def _stamp(t: str) -> float:
    return datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def _ttft_s(rec: dict) -> float:
    """The TTFTs this run spent on the record (an arm reused from another journal's run cost it nothing)."""
    return sum(rec[arm].get("ttft_ms", 0.0) / 1000 for arm in ("baseline", "specprefill")
               if isinstance(rec.get(arm), dict) and "reused_from" not in rec[arm])


def question_seconds(records: Sequence[dict]) -> list[tuple[float, bool]]:
    """Per record of one journal, in its order: (seconds, measured) - measured: the time since the previous
    stamp; else (first record, after a stop, no stamp) its TTFTs only (module doc)."""
    out: list[tuple[float, bool]] = []
    prev: float | None = None
    for rec in records:
        now = _stamp(rec["t"]) if rec.get("t") else None
        ttft = _ttft_s(rec)
        gap = None if now is None or prev is None else now - prev
        if gap is not None and 0 <= gap <= 2 * ttft + RESUME_SLACK_S:
            out.append((gap, True))
        else:
            out.append((ttft, False))
        prev = now if now is not None else prev
    return out


def _group(rec: dict) -> tuple:
    """kind_rows' line of a record."""
    st = rec.get("settings", {})
    return (rec["kind"], rec["length"], st.get("shape", "native"), st.get("keep"))


def status(row: dict) -> str:
    """A line's verdict, in the evidence rows' order (evidence.EvidenceRow.fails_bar): too few documents or
    questions, then fewer than 10 baseline-right answers (inconclusive), then the bound. A summary line has no
    pass bar (ids_named is its own metric) and never passes."""
    bar = PASS_BARS["answer_right"]
    few = row["n"] < bar.min_questions or row["documents"] < bar.min_documents
    if row["metric"] != "answer_right":
        return "too few" if few else "no pass bar"
    if few:
        return "too few"
    if row["baseline_right"] < bar.min_baseline_right:
        return "inconclusive"
    return "passes" if (row["lower"] or 0.0) >= bar.min_bound else "fails"


def journal_rows(path: Path) -> list[dict[str, Any]]:
    """The lines of one kinds answer journal: kind_rows' rows with `status`, `hours`, `estimated` (questions
    counted by their TTFTs only), `load1` [min, max] and `journal`."""
    records = [r for r in read_journal(path) if r.get("half") == "answer" and r.get("kind") in CODE_KINDS]
    seconds = question_seconds(records)
    per: dict[tuple, list[tuple[dict, float, bool]]] = {}
    for rec, (s, measured) in zip(records, seconds):
        per.setdefault(_group(rec), []).append((rec, s, measured))
    out = []
    for row in kind_rows(records):
        got = per[(row["kind"], row["length"], row["shape"], row["keep"])]
        loads = [r["load1"] for r, _, _ in got if "load1" in r]
        out.append({**row, "chunk_rule": answer_rule(records[0]), "status": status(row), "hours": sum(s for _, s, _ in got) / 3600,
                    "estimated": sum(not m for _, _, m in got), "load1": [min(loads), max(loads)] if loads else None,
                    "journal": path})
    return out


def rows(root: Path) -> list[dict[str, Any]]:
    """Every line of every kinds answer journal under `root`, by length, shape, kind, keep and journal."""
    out = [row for p in sorted(root.glob(PATTERN)) for row in journal_rows(p)]
    return sorted(out, key=lambda r: (r["length"], r["shape"], CODE_KINDS.index(r["kind"]), r["keep"] or 0, str(r["journal"])))


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def table_markdown(lines: list[dict[str, Any]], base: Path) -> str:
    """The rendered block: what the columns mean (the pass bar's numbers from evidence.PASS_BARS), then the table."""
    bar = PASS_BARS["answer_right"]
    head = (f"Status: **passes** — >= {bar.min_questions} answered questions from >= {bar.min_documents} documents, "
            f">= {bar.min_baseline_right} of them baseline-right, and a 90% lower bound >= {bar.min_bound} (the evidence "
            f"rows' pass bar); **fails** — the bound is below it; **inconclusive** — fewer than {bar.min_baseline_right} "
            f"baseline-right answers; **too few** — fewer than {bar.min_questions} questions or {bar.min_documents} "
            "documents (a run in progress); a summary line shows the mean `ids_named` of each arm instead of right "
            "answers, and has **no pass bar**. Questions: answered, closed-book-right ones left out (their own column). "
            "Evidence kept: the share of answered questions whose evidence chunks specprefill kept all of (recall; "
            "not located in chat shape: –). "
            "Hours: the sum of each question's wall time, the time between successive `t` stamps of its journal; the "
            "first question of a run (and one after a stop) counts its recorded TTFTs only (\"n by TTFT\"). Load: the "
            "1-minute load average stamped with each question (2 cores).")
    if not lines:
        return head + "\n\nNo kinds answer journal (`bench/results/" + PATTERN + "`) yet."
    body = []
    for r in lines:
        summ = r["metric"] != "answer_right"
        rel = os.path.relpath(r["journal"], base).replace(os.sep, "/")
        hours = f"{r['hours']:.2f}" + (f" ({r['estimated']} by TTFT)" if r["estimated"] else "")
        load = "–" if r["load1"] is None else f"{r['load1'][0]:.1f}–{r['load1'][1]:.1f}"
        body.append([r["kind"], f"{r['length']:,}", r["shape"], _f(r["keep"], "{:g}"), r.get("chunk_rule", "–"), str(r["n"]), str(r["closed_book_right"]),
                     str(r["documents"]),
                     f"ids_named {_f(r['baseline'])}" if summ else str(r["baseline_right"]),
                     f"ids_named {_f(r['specprefill'])}" if summ else str(r["specprefill_right"]),
                     _f(r["ratio"]), "–" if summ else _f(r.get("lower")), f"**{r['status']}**", _f(r["evidence_kept"]),
                     hours, load, f"[{Path(r['journal']).name}]({rel})"])
    header = ["kind", "doc tokens", "shape", "keep", "chunk rule", "questions", "closed-book right", "documents", "baseline right",
              "specprefill right", "ratio", "90% lower (clustered)", "status", "evidence kept", "hours", "load1", "journal"]
    align = "lrlllrrrrrrrlrrrl"
    table = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    table += ["| " + " | ".join(row) + " |" for row in body]
    return head + "\n\n" + "\n".join(table)


__all__ = ["PATTERN", "RESUME_SLACK_S", "STATUSES", "question_seconds", "status", "journal_rows", "rows", "table_markdown"]
