"""Another speculator file for the same pair, judged against today's (issue 50 item 2): the tables of
docs/quality.md, "A Q4_0 speculator for the CPU", rendered from bench/results.

Two questions decide whether a faster speculator (the Q4_0 requantization of the 0.5B model, or the same
file run by the PyTorch forward, `speculator_impl` torch) may replace the default: does the target get
(nearly) the same kept sets, and does it answer as often right from them?

- Kept-set overlap: every ``quality-*-overlap-*.json`` that scripts/kept_overlap.py wrote (per-job Jaccard
  of the two speculators' kept chunks at keep 0.3 under the engine's selection, and each one's evidence
  recall, from `specq bench quality recall --scores-dir` of the same tasks).
- Answers: every answer journal whose specprefill runs name a speculator (their evidence key) and whose
  baseline answers were reused from an earlier journal (`--baseline-from`, recorded as `reused_from`):
  the same questions, so specprefill-right is compared pairwise with the earlier journal's (which ran
  the default speculator; journals from before the key was recorded name none).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..engine import models
from .quality_report import TORCH_LABEL, read_journal, speculator_of

HEADER_OVERLAP = ["result", "speculators (reference → candidate)", "chunk rule", "keep", "tasks", "Jaccard min",
                  "p10", "median", "mean", "jobs ≥ 0.9", "evidence recall reference → candidate"]
HEADER_ANSWER = ["journal", "speculator", "reused baselines of", "chunk rule", "questions (not closed-book)",
                 "baseline right", "specprefill right, reference", "specprefill right, this speculator",
                 "reference only / this only"]


def _name(sha256: str) -> str:
    return next((s.name for s in models.REGISTRY.values() if s.sha256 == sha256), sha256[:12])


def _link(path: Path, root: Path, base: Path) -> str:
    rel = os.path.relpath(path, base).replace(os.sep, "/")
    return f"[{path.relative_to(root).as_posix()}]({rel})"


def overlap_rows(root: Path, base: Path) -> list[list[str]]:
    rows = []
    for path in sorted(root.glob("quality-*-overlap-*.json")):
        d = json.loads(path.read_text(encoding="utf-8"))
        for r in d.get("by_rule", []):
            j, rec = r["jaccard"], r["evidence_recall"]
            rows.append([_link(path, root, base), f"{d['a']['speculator']} → {d['b']['speculator']}", r["rule"], f"{r['keep']}",
                         f"{r['tasks']}", f"**{j['min']:.3f}**", f"{j['p10']:.3f}", f"{j['median']:.3f}", f"{j['mean']:.3f}",
                         f"{j['share_ge_0.9']:.0%}", f"{rec['a']:.3f} → {rec['b']:.3f}"])
        rc = d.get("rule_change")
        if rc:  # for scale: one speculator's kept sets under two chunk rules
            j = rc["jaccard"]
            rows.append([_link(path, root, base), f"{d['a']['speculator']} alone (for scale)", " → ".join(rc["rules"]),
                         f"{rc['keep']}", f"{rc['tasks']}", f"{j['min']:.3f}", f"{j['p10']:.3f}", f"{j['median']:.3f}",
                         f"{j['mean']:.3f}", f"{j['share_ge_0.9']:.0%}", "–"])
    return rows


def answer_rows(root: Path, base: Path, repo: Path) -> list[list[str]]:
    rows = []
    for path in sorted(root.glob("*.jsonl")):
        recs = [r for r in read_journal(path) if isinstance(r, dict) and r.get("half") == "answer" and "specprefill" in r and r.get("key", {}).get("speculator_sha256")
                and r.get("baseline", {}).get("reused_from")]
        if not recs:
            continue
        refs = {r["baseline"]["reused_from"] for r in recs}
        specs = {_name(r["key"]["speculator_sha256"]) + (TORCH_LABEL if speculator_of(r) == "torch" else "") for r in recs}
        if len(refs) != 1 or len(specs) != 1 or specs == {models.DEFAULT_SPECULATOR}:
            continue
        ref_path = repo / next(iter(refs))
        ref = {r["task"]: r for r in read_journal(ref_path) if isinstance(r, dict) and r.get("half") == "answer" and "specprefill" in r}
        pairs = [(r, ref[r["task"]]) for r in recs if r["task"] in ref]
        if not pairs:
            continue
        base_right = sum(bool(r["baseline"]["correct"]) for r, _ in pairs)
        this = sum(bool(r["specprefill"]["correct"]) for r, _ in pairs)
        that = sum(bool(o["specprefill"]["correct"]) for _, o in pairs)
        ref_only = sum(bool(o["specprefill"]["correct"]) and not r["specprefill"]["correct"] for r, o in pairs)
        this_only = sum(bool(r["specprefill"]["correct"]) and not o["specprefill"]["correct"] for r, o in pairs)
        rows.append([_link(path, root, base), next(iter(specs)), _link(ref_path, root, base),
                     recs[0].get("settings", {}).get("chunk_rule", "mean"), f"{len(pairs)}", f"{base_right}", f"{that}",
                     f"**{this}**", f"{ref_only} / {this_only}"])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def table_markdown(root: Path, base: Path, repo: Path) -> str:
    """Both tables: the kept-set overlap, then the answers (`root`: bench/results; `base`: the doc's folder)."""
    return _table(HEADER_OVERLAP, overlap_rows(root, base)) + "\n\n" + _table(HEADER_ANSWER, answer_rows(root, base, repo))


__all__ = ["table_markdown", "overlap_rows", "answer_rows"]
