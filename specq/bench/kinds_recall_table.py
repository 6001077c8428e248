"""Where the task kinds' evidence goes: the recall table of docs/quality.md (`report:quality-kinds-recall`, issue 49
item 4), from the kinds' recall journals.

`specq bench quality recall --kinds two-place,aggregation,review …` scores each question with the speculator only
(no answers) and records, per scorer and chunk rule from that one pass, whether *all* of the question's evidence
chunks are among the kept ones at each keep level (`kept`), the keep the worst-ranked evidence chunk needs
(`rank`: its rank among the document's chunks, as a fraction), and the chance that a random selection of the same
size keeps them all (`random`). One line per journal, kind, length and rule: questions, documents, the median
number of evidence chunks, the share of questions whose evidence was all kept at each keep beside random's, and
the median keep needed. A kind whose evidence is not kept cannot be answered from the sparse prefill, whatever
the target does with it: this is the "is the evidence outside the kept chunks?" half of issue 49 item 4.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from .quality_report import CODE_KINDS, read_journal

#: the journals the table reads (bench/results): `kinds-cpu-<date>[-<split>]-recall-<length>.jsonl`
PATTERN = "kinds-cpu-*-recall-*.jsonl"
#: the chunk rules shown, as the journal names them for the windowed scorer (border is the engine's default)
RULES = {"windowed": "border", "windowed-mean": "mean", "windowed-scope": "scope", "windowed-block": "block"}


def journal_rows(path: Path) -> list[dict[str, Any]]:
    """The lines of one kinds recall journal, by kind, length and rule."""
    records = [r for r in read_journal(path) if r.get("half") == "recall" and r.get("kind") in CODE_KINDS
               and isinstance(r.get("kept"), dict)]
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["kind"], int(r["length"])), []).append(r)
    out = []
    for (kind, length), recs in sorted(groups.items(), key=lambda g: (g[0][1], CODE_KINDS.index(g[0][0]))):
        keeps = sorted({k for r in recs for k in (r.get("random") or {})}, key=float)
        for name, rule in RULES.items():
            have = [r for r in recs if name in r["kept"]]
            if not have:
                continue
            out.append({
                "journal": path, "kind": kind, "length": length, "rule": rule, "n": len(have),
                "documents": len({r.get("family") or r["task"] for r in have}),
                "evidence_chunks": statistics.median(len(r.get("evidence_chunks") or []) for r in have),
                "kept": {k: sum(bool(r["kept"][name].get(k)) for r in have) / len(have) for k in keeps},
                "random": {k: statistics.mean(float(r["random"][k]) for r in have) for k in keeps},
                "keep_needed": _median([float(r["rank"][name]) for r in have if name in (r.get("rank") or {})]),
            })
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rows(root: Path) -> list[dict[str, Any]]:
    return [row for p in sorted(root.glob(PATTERN)) for row in journal_rows(p)]


def table_markdown(lines: list[dict[str, Any]], base: Path) -> str:
    head = ("All kept: the share of the questions whose evidence chunks were *all* among the kept chunks at that keep "
            "(random: the mean chance that a random selection of the same size keeps them all). Keep needed: the "
            "median over questions of the rank of the question's worst-ranked evidence chunk among the document's "
            "chunks, as a fraction (the smallest keep that would have kept all of its evidence). One scoring pass of "
            "the speculator gives every rule and keep; no answers are generated.")
    if not lines:
        return head + "\n\nNo kinds recall journal (`bench/results/" + PATTERN + "`) yet."
    keeps = sorted({k for r in lines for k in r["kept"]}, key=float)
    header = ["kind", "doc tokens", "chunk rule", "questions", "documents", "evidence chunks (median)",
              *[f"all kept at {k} (random)" for k in keeps], "keep needed (median)", "journal"]
    body = []
    for r in lines:
        rel = os.path.relpath(r["journal"], base).replace(os.sep, "/")
        cells = [f"{r['kept'][k]:.2f} ({r['random'][k]:.2f})" if k in r["kept"] else "–" for k in keeps]
        body.append([r["kind"], f"{r['length']:,}", r["rule"], str(r["n"]), str(r["documents"]), f"{r['evidence_chunks']:g}",
                     *cells, "–" if r["keep_needed"] is None else f"{r['keep_needed']:.2f}", f"[{Path(r['journal']).name}]({rel})"])
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if h in ("kind", "chunk rule", "journal") else "---:" for h in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in body]
    return head + "\n\n" + "\n".join(out)


__all__ = ["PATTERN", "RULES", "journal_rows", "rows", "table_markdown"]
