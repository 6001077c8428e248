"""`specq evidence build`: the shipped evidence rows (specq/engine/policy/evidence_rows.json) from the answer and
group journals of `specq bench quality` in bench/results.

One row per `SOURCES` entry: the journal's answered questions (closed-book-right ones left out), their
per-document counts (document = the record's `doc_sha256` where the journal has it, else its family id,
`family:<id>`, else the task id), the document-clustered bound (engine/policy/evidence_bound.py), and the full
EvidenceKey. Journals written before item 3 of issue 47 record only keep, scorer, chunk_rule (and a
set window): every other key field is filled from the defaults at the run's recorded commit, and the
row's `provenance.filled` says which and from what. A journal record that holds `key` (bench quality
since then) gives the key itself. `in_sample` rows are the ones whose questions chose a default they
would vouch for; they are recorded and never pass.

A `kinds` entry (a journal of `specq bench quality answer --kinds ...`, several task kinds in one file) gives one
row per kind with answered questions (`kind_rows`), each keyed by its kind (`key.task`), in quality_report.CODE_KINDS
order; summary has no answer-right (its ids_named is its own metric) and gives none. The same journals render
docs/quality.md's kind x length table (bench/kinds_table.py), so a kind's row and its line there agree.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..engine.policy.evidence import SHIPPED_PATH, row_from_dict
from ..engine.policy.evidence_bound import METHOD, row_lower
from ..engine.policy.evidence_key import EvidenceKey, effective_scoring
from ..engine.models import SPECULATOR_0_5B, TARGET_1_5B
from .quality_report import CODE_KINDS, read_journal

REPO = Path(__file__).resolve().parents[2]

#: every shipped row's journal, with what the journal does not say (where docs/quality.md shows it, the
#: code it ran, whether the questions are in-sample, whether the windowed scorer read <= 8,192 tokens in
#: one pass at that commit: bbb3a36 made it so)
SOURCES: tuple[dict[str, Any], ...] = (
    dict(journal="bench/results/quality-cpu-families-answer-4000.jsonl", length=4000, commit="110167e",
         where="docs/history.md, Families: answer right at 4K", one_pass=False),
    dict(journal="bench/results/quality-cpu-families-answer-16000.jsonl", length=16000, commit="8936bed..6e48ea9",
         where="docs/history.md, Families: answer right at 16K", one_pass=False),
    dict(journal="bench/results/quality-cpu-border-answer-4000.jsonl", length=4000, commit="37aba5c",
         where="docs/history.md, Chunk borders: answer right at 4K", one_pass=False,
         in_sample="the 4K families' 40 questions are the set the border rule was chosen on"),
    dict(journal="bench/results/quality-cpu-border-answer-16000.jsonl", length=16000, commit="d09312f",
         where="docs/history.md, Chunk borders: answer right at 16K", one_pass=False),
    dict(journal="bench/results/quality-cpu-border-answer-8000.jsonl", length=8000, commit="669992d",
         where="docs/history.md, Answer right at 8K", one_pass=False),
    dict(journal="bench/results/quality-cpu-border-full-answer-8000.jsonl", length=8000, commit="852f635",
         where="docs/history.md, One pass up to 8,192 tokens", one_pass=False,
         in_sample="its 40 tasks are in the 200-question recall set on which the one-pass default was chosen"),
    dict(journal="bench/results/quality-cpu-border-answer-30000.jsonl", length=30000, commit="b381143..b12f298",
         where="docs/history.md, Answer right at 30K", one_pass=True),
    dict(journal="bench/results/quality-cpu-families-group-4000.jsonl", length=4000, commit="b61bbb6", arm="group",
         paired_with="bench/results/quality-cpu-families-answer-4000.jsonl",
         where="docs/history.md, Group-sparse on the same 40 questions", one_pass=False),
    dict(journal="bench/results/quality-cpu-border-group-30000.jsonl", length=30000, commit="7e989c7", arm="group",
         paired_with="bench/results/quality-cpu-border-answer-30000.jsonl",
         where="docs/history.md, Group-sparse at 30K", one_pass=True),
    dict(journal="bench/results/quality-cpu-scope-answer-4000.jsonl", length=4000, commit="62b3411",
         where="docs/history.md, Header lines: answer right at 4K", one_pass=False),
    # issue 50 item 2: the torch speculator (its own score_math), the same 40 questions, baselines reused
    dict(journal="bench/results/quality-cpu-border-torchspec-answer-4000.jsonl", length=4000, commit="894688d",
         where="docs/quality.md, A Q4_0 speculator for the CPU (the speculator-swap table)", one_pass=True,
         in_sample="the 4K families' 40 questions are the set the border rule was chosen on"),
    # issue 49: the task kinds at 4K, reported split (a run in progress: its rows are too few until it is done)
    dict(journal="bench/results/kinds-cpu-2026-12-07-answer-4000.jsonl", length=4000, kinds=True,
         commit="854ddc8 (main when the run started, 2026-12-07 02:47 UTC)",
         where="docs/quality.md, Task kinds beyond lookups (the kind x length table)", one_pass=True),
    # issue 49 item 4: the block chunk rule on the same questions (its first 119), baselines reused
    dict(journal="bench/results/kinds-cpu-2026-12-07-block-answer-4000.jsonl", length=4000, kinds=True,
         commit="55dff52", where="docs/quality.md, A block rule for review (the kind x length table's block lines)",
         one_pass=True),
)
#: kinds whose questions have no answer-right (quality_grade.py): no answer_right row
NO_ANSWER_RIGHT = ("summary",)

#: key fields no journal before issue 47 recorded, as every such run had them: the bench's and the engine's
#: defaults at those commits (QualitySettings chunk 32, lookahead 8, pool 13; RunParams max_keep 0, selection
#: global, pipelined false, positions original on the project's patched llama-cpp-python; native prompts; the
#: CPU with the numpy score math; the default pair, pulled by name from the registry)
DEFAULTS: dict[str, tuple[Any, str]] = {
    "target_sha256": (TARGET_1_5B.sha256, f"registry sha256 of {TARGET_1_5B.name} (the default target the run named)"),
    "speculator_sha256": (SPECULATOR_0_5B.sha256, f"registry sha256 of {SPECULATOR_0_5B.name} (the default speculator)"),
    "backend": ("cpu", "a CPU run (docs/quality.md)"),
    "prompt_shape": ("native", "bench quality runs native prompts (document, then question)"),
    "task": ("lookup", "every question of these journals is a lookup (needle, multikey, raises, const: one fact "
                       "answered by a number or an identifier; issue 49)"),
    "positions": ("original", "RunParams default; the CPU runs used the project's patched llama-cpp-python"),
    "score_math": ("numpy", "the CPU's score math (auto = numpy without a GPU)"),
    "max_keep": (0, "RunParams default"),
    "chunk": (32, "QualitySettings default"),
    "lookahead": (8, "QualitySettings default"),
    "pool": (13, "QualitySettings default"),
    "selection": ("global", "RunParams default"),
    "pipelined": (False, "RunParams default"),
    "protect_tail": (-1, "native prompt: the whole question is protected"),
}
#: the speculator context the real pair's runs scored in (its training context, 32K): a window's room
ROOM = 32768


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _doc_name(rec: dict) -> str:
    return rec.get("doc_sha256") or (f"family:{rec['family']}" if rec.get("family") else f"task:{rec['task']}")


def _key(rec: dict, doc_max: int, one_pass: bool) -> tuple[EvidenceKey, dict[str, str]]:
    """The record's key: its own `key` (journals since issue 47), else filled (what, and from where)."""
    if isinstance(rec.get("key"), dict):
        if rec["key"].get("task") is None:  # journals before issue 49 ran their lookups without declaring them
            return EvidenceKey.from_dict({**rec["key"], "task": DEFAULTS["task"][0]}), {"task": f"'lookup': {DEFAULTS['task'][1]}"}
        return EvidenceKey.from_dict(rec["key"]), {}
    st = rec.get("settings", {})
    filled = {k: f"{v!r}: {why}" for k, (v, why) in DEFAULTS.items()}
    window = st.get("window", 0)
    if not window and not one_pass:  # before bbb3a36 the windowed scorer cut at 4,096 tokens whatever the length
        window = 4096
        filled["window"] = "4096: the windowed scorer's window at that commit (one pass up to 8,192 came with bbb3a36)"
    scorer, eff_window = effective_scoring(st.get("scorer", "windowed"), window, doc_max, ROOM)
    filled["scorer/window"] = (f"effective {scorer}, {eff_window or 'one pass'} from scorer {st.get('scorer')!r}, "
                               f"window {st.get('window', 0)} on documents of <= {doc_max} tokens")
    vals = {k: v for k, (v, _) in DEFAULTS.items()}
    key = EvidenceKey(**vals, scorer=scorer, window=eff_window, chunk_rule=st.get("chunk_rule", "mean"),
                      keep=float(st["keep"]), target=TARGET_1_5B.name, speculator=SPECULATOR_0_5B.name)
    return key, filled


def kinds_in(src: dict[str, Any], root: Path = REPO) -> list[str]:
    """The kinds of a `kinds` source's journal with answered questions at its length (CODE_KINDS order), those
    with no answer-right left out."""
    have = {r.get("kind") for r in read_journal(root / src["journal"]) if r.get("half") == "answer"
            and r.get("length") == src["length"] and not r["closed_book"].get("correct") and "specprefill" in r}
    return [k for k in CODE_KINDS if k in have and k not in NO_ANSWER_RIGHT]


def build_rows(src: dict[str, Any], root: Path = REPO) -> list[dict[str, Any]]:
    """A source's rows: one, or (a `kinds` source) one per kind of `kinds_in`."""
    if src.get("kinds"):
        return [build_row({**src, "kind": k}, root) for k in kinds_in(src, root)]
    return [build_row(src, root)]


def build_row(src: dict[str, Any], root: Path = REPO) -> dict[str, Any]:
    """One shipped row (as evidence.row_from_dict reads it) from its journal (`kind`: only that kind's records)."""
    records = read_journal(root / src["journal"])
    if src.get("kind"):
        records = [r for r in records if r.get("kind") == src["kind"]]
    arm = src.get("arm", "specprefill")
    if arm == "group":
        answers = {r["task"]: r for r in read_journal(root / src["paired_with"]) if r.get("half") == "answer"}
        pairs = []
        for r in records:
            if r.get("half") != "group" or "group" not in r or r["closed_book"]["correct"]:
                continue
            a = answers[r["task"]]
            pairs.append((a, a["baseline"]["correct"], r["group"]["correct"]))
    else:
        pairs = [(r, r["baseline"]["correct"], r["specprefill"]["correct"]) for r in records
                 if r.get("half") == "answer" and r.get("length") == src["length"] and not r["closed_book"]["correct"]]
    if not pairs:
        raise ValueError(f"{src['journal']}: no answered questions at length {src['length']}")
    docs: dict[str, dict[str, int]] = {}
    for rec, base, right in pairs:
        d = docs.setdefault(_doc_name(rec), {"n": 0, "baseline_right": 0, "arm_right": 0, "both_right": 0})
        d["n"] += 1
        d["baseline_right"] += int(bool(base))
        d["arm_right"] += int(bool(right))
        d["both_right"] += int(bool(base) and bool(right))
    tokens = [rec["doc_tokens"] for rec, _, _ in pairs]
    keyed = [r for r in records if r.get("half") == ("group" if arm == "group" else "answer") and "key" in r
             and r.get("length") == src["length"]]
    key, filled = _key(keyed[0] if keyed else records[0] if arm == "group" else pairs[0][0], max(tokens), src["one_pass"])
    if len({json.dumps(r["key"], sort_keys=True) for r in keyed}) > 1:
        raise ValueError(f"{src['journal']}: its records ran with more than one key")
    notes = {}
    if any(name.startswith(("family:", "task:")) for name in docs):
        notes["documents"] = "named by family (or task) id: this journal recorded no document content hash"
    prov = {"commit": src["commit"], "where": src["where"], "journal_sha256": _sha256(root / src["journal"]),
            "filled": filled, **({"notes": notes} if notes else {})}
    if arm == "group":
        prov["paired_with"] = src["paired_with"]
    row = {"key": key.as_dict(), "metric": "answer_right", "arm": arm, "length": src["length"],
           "doc_tokens": [min(tokens), max(tokens)], "documents": docs, "bound_method": METHOD,
           "bound": round(row_lower(docs), 4), "in_sample": bool(src.get("in_sample")),
           "in_sample_why": src.get("in_sample", ""), "source": src["journal"], "provenance": prov,
           "created_at": max(r.get("t", "") for r in records), "disabled": ""}
    row_from_dict(row)  # what the engine will read back must validate
    return row


def build(root: Path = REPO) -> dict[str, Any]:
    """The shipped file's content: every SOURCES row, in order."""
    return {"about": "specq's shipped quality evidence (issue 47); generated by `specq evidence build` from the "
                     "journals in bench/results - do not edit by hand (docs/quality.md, Evidence rows)",
            "rows": [row for s in SOURCES for row in build_rows(s, root)]}


def write(path: Path = SHIPPED_PATH, root: Path = REPO) -> dict[str, Any]:
    data = build(root)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return data


__all__ = ["SOURCES", "DEFAULTS", "NO_ANSWER_RIGHT", "build", "build_row", "build_rows", "kinds_in", "write"]
