"""The kinds' recall table (specq/bench/kinds_recall_table.py, issue 49 item 4) on hand-made recall journals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specq.bench import kinds_recall_table as krt


def rec(kind: str, family: str, kept: dict, rank: dict, evidence: list[int], random: dict, **extra) -> dict:
    return {"half": "recall", "task": f"{family}-q{len(evidence)}", "kind": kind, "length": 4000, "family": family,
            "evidence_chunks": evidence, "kept": kept, "rank": rank, "random": random, **extra}


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"half": "recall", "ta', encoding="utf-8")
    return path


def test_lines_per_kind_and_rule_count_all_kept_random_and_the_keep_needed(tmp_path):
    k = lambda a, b: {"0.3": a, "0.5": b}  # noqa: E731
    path = write(tmp_path / "kinds-cpu-2026-12-07-tuning-recall-4000.jsonl", [
        rec("review", "f1", {"windowed": k(True, True), "windowed-scope": k(False, True)},
            {"windowed": 0.2, "windowed-scope": 0.4}, [5], {"0.3": 0.3, "0.5": 0.5}),
        rec("review", "f2", {"windowed": k(False, True), "windowed-scope": k(False, False)},
            {"windowed": 0.4, "windowed-scope": 0.6}, [9], {"0.3": 0.3, "0.5": 0.5}),
        rec("aggregation", "f1", {"windowed": k(False, False)}, {"windowed": 0.9}, [1, 2, 3], {"0.3": 0.01, "0.5": 0.1}),
        {"half": "answer", "kind": "review"},  # another half: not read
    ])
    rows = krt.journal_rows(path)
    assert [(r["kind"], r["rule"]) for r in rows] == [("aggregation", "border"), ("review", "border"), ("review", "scope")]
    agg, border, scope = rows
    assert (border["n"], border["documents"], border["kept"], border["keep_needed"]) == (2, 2, {"0.3": 0.5, "0.5": 1.0}, pytest.approx(0.3))
    assert scope["kept"] == {"0.3": 0.0, "0.5": 0.5} and scope["keep_needed"] == pytest.approx(0.5)
    assert agg["evidence_chunks"] == 3 and agg["random"] == {"0.3": pytest.approx(0.01), "0.5": pytest.approx(0.1)}
    md = krt.table_markdown(krt.rows(tmp_path), tmp_path)
    assert "| review | 4,000 | border | 2 | 2 | 1 | 0.50 (0.30) | 1.00 (0.50) | 0.30 |" in md
    assert "| aggregation | 4,000 | border | 1 | 1 | 3 | 0.00 (0.01) | 0.00 (0.10) | 0.90 |" in md


def test_no_recall_journal_says_so_and_answer_journals_are_not_read(tmp_path):
    (tmp_path / "kinds-cpu-2026-12-07-answer-4000.jsonl").write_text(json.dumps({"half": "answer", "kind": "review"}) + "\n")
    assert "No kinds recall journal" in krt.table_markdown(krt.rows(tmp_path), tmp_path)
