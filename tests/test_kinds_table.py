"""docs/quality.md's kind x length table (bench/kinds_table.py, `report:quality-kinds`) and the kinds journals'
evidence rows (bench/evidence_build.py), on small hand-made journals: each line's status follows the evidence
rows' pass bar (too few, inconclusive under 10 baseline-right, fails, passes), a summary line never passes,
hours come from successive stamps, and `specq evidence build` gives one row per kind that agrees with its line."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from specq.bench import evidence_build, kinds_table
from specq.engine.policy.evidence import row_from_dict, shipped_rows

T0 = datetime(2026, 12, 7, 3, 0, tzinfo=timezone.utc)
KEY = shipped_rows()[0].key.as_dict()


def _rec(i: int, kind: str, doc: int, base, spec, *, cb=False, minutes: float = 5.0, length=4000, shape=None, **extra) -> dict:
    """The i-th record of a journal, stamped `minutes` after the previous one (stamps are cumulative: see _journal)."""
    rec = {"half": "answer", "task": f"kinds-reported-L{length}-s0-{doc:03d}-q{i:02d}", "kind": kind, "length": length,
           "family": f"kinds-reported-L{length}-s0-{doc:03d}", "settings": {"keep": 0.3, "chunk_rule": "border", **({"shape": shape} if shape else {})},
           "closed_book": {"correct": cb}, "load1": 2.0 + (i % 3), "minutes": minutes}
    if not cb:
        rec.update(doc_sha256=f"{doc:064x}", doc_tokens=3900, key={**KEY, "task": kind},
                   baseline={"correct": base, "ttft_ms": 60_000.0, **extra}, specprefill={"correct": spec, "ttft_ms": 30_000.0,
                                                                                       "evidence_kept": True, **extra})
    return rec


def _journal(path, recs: list[dict]):
    t = T0
    with path.open("w") as f:
        for r in recs:
            t += timedelta(minutes=r.pop("minutes"))
            f.write(json.dumps({**r, "t": t.strftime("%Y-%m-%dT%H:%M:%SZ")}) + "\n")
    return path


def _lines(path) -> dict:
    return {ln["kind"]: ln for ln in kinds_table.journal_rows(path)}


def test_statuses_follow_the_pass_bar(tmp_path):
    recs, i = [], 0
    for doc in range(8):  # aggregation: 40 questions on 8 documents, all right in both arms: passes
        for _ in range(5):
            recs.append(_rec(i, "aggregation", doc, True, True))
            i += 1
    for doc in range(8):  # review: 40 questions on 8 documents, 8 baseline-right: inconclusive, whatever its bound
        for j in range(5):
            recs.append(_rec(i, "review", doc, j == 0, j == 0))
            i += 1
    for doc in range(8):  # two-place: 40 on 8, baseline right on all, specprefill on half: fails
        for j in range(5):
            recs.append(_rec(i, "two-place", doc, True, j % 2 == 0))
            i += 1
    recs.append(_rec(i, "two-place", 9, None, None, cb=True))  # closed-book right: its own column, not a question
    lines = _lines(_journal(tmp_path / "kinds-cpu-2026-12-07-answer-4000.jsonl", recs))
    assert lines["aggregation"]["status"] == "passes" and lines["aggregation"]["lower"] == 1.0
    assert lines["review"]["status"] == "inconclusive" and lines["review"]["baseline_right"] == 8 and lines["review"]["ratio"] == 1.0
    assert lines["two-place"]["status"] == "fails" and lines["two-place"]["lower"] < 0.95
    assert (lines["two-place"]["n"], lines["two-place"]["closed_book_right"], lines["two-place"]["documents"]) == (40, 1, 8)
    # a run in progress: its first 39 questions are too few, as are 40 from 7 documents
    partial = _lines(_journal(tmp_path / "p.jsonl", [_rec(k, "aggregation", k % 8, True, True) for k in range(39)]))
    assert partial["aggregation"]["status"] == "too few"
    seven = _lines(_journal(tmp_path / "s.jsonl", [_rec(k, "aggregation", k % 7, True, True) for k in range(42)]))
    assert seven["aggregation"]["n"] == 42 and seven["aggregation"]["status"] == "too few"


def test_a_summary_line_shows_ids_named_and_never_passes(tmp_path):
    recs = [_rec(k, "summary", k % 8, None, None, ids_named=0.5 if k % 2 else 1.0) for k in range(48)]
    line = _lines(_journal(tmp_path / "j.jsonl", recs))["summary"]
    assert line["metric"] == "ids_named" and line["baseline"] == 0.75 and line["status"] == "no pass bar"
    assert kinds_table.status({**line, "n": 3}) == "too few"
    text = kinds_table.table_markdown([line], tmp_path)
    assert "| summary | 4,000 | native | 0.3 | border | 48 | 0 | 8 | ids_named 0.750 | ids_named 0.750 | 1.000 | – | **no pass bar** |" in text


def test_hours_are_the_gaps_between_stamps_and_a_resumed_run_counts_ttfts(tmp_path):
    # stamps 5, 15, 22 minutes after T0; then a 10-hour stop; then 6 minutes more. TTFTs 1.5 min a question.
    recs = [_rec(0, "review", 0, True, True, minutes=5), _rec(1, "review", 0, True, True, minutes=10),
            _rec(2, "review", 0, True, False, minutes=7), _rec(3, "review", 1, True, True, minutes=600),
            _rec(4, "review", 1, False, False, minutes=6)]
    path = _journal(tmp_path / "j.jsonl", recs)
    secs = kinds_table.question_seconds([json.loads(x) for x in path.read_text().splitlines()])
    assert secs == [(90.0, False), (600.0, True), (420.0, True), (90.0, False), (360.0, True)]
    line = _lines(path)["review"]
    assert line["estimated"] == 2 and abs(line["hours"] - (90 + 600 + 420 + 90 + 360) / 3600) < 1e-9
    assert line["load1"] == [2.0, 4.0]
    assert "| 0.43 (2 by TTFT) | 2.0–4.0 | [j.jsonl](j.jsonl) |" in kinds_table.table_markdown([line], tmp_path)


def test_rows_reads_every_kinds_journal_by_name_and_the_table_says_when_there_is_none(tmp_path):
    assert "No kinds answer journal" in kinds_table.table_markdown(kinds_table.rows(tmp_path), tmp_path)
    _journal(tmp_path / "kinds-cpu-2026-12-07-answer-8000.jsonl", [_rec(0, "review", 0, True, True, length=8000)])
    _journal(tmp_path / "kinds-cpu-2026-12-08-chat-answer-4000.jsonl", [_rec(0, "two-place", 0, True, True, shape="chat")])
    _journal(tmp_path / "quality-cpu-border-answer-4000.jsonl", [_rec(0, "aggregation", 0, True, True)])  # not a kinds journal
    got = [(r["kind"], r["length"], r["shape"]) for r in kinds_table.rows(tmp_path)]
    assert got == [("two-place", 4000, "chat"), ("review", 8000, "native")]


def test_evidence_build_gives_one_row_per_kind_and_none_for_summary(tmp_path):
    recs, i = [], 0
    for doc in range(8):
        for kind in ("review", "aggregation", "summary"):
            for _ in range(5):
                recs.append(_rec(i, kind, doc, kind != "summary" and (i % 7 != 0), kind != "summary" and (i % 5 != 0),
                                 **({"ids_named": 0.5} if kind == "summary" else {})))
                i += 1
    recs.append(_rec(i, "two-place", 0, None, None, cb=True))  # only closed-book right: no row
    (tmp_path / "bench").mkdir()
    _journal(tmp_path / "bench" / "k.jsonl", recs)
    src = dict(journal="bench/k.jsonl", length=4000, kinds=True, commit="test", where="test", one_pass=True)
    assert evidence_build.kinds_in(src, root=tmp_path) == ["aggregation", "review"]
    rows = evidence_build.build_rows(src, root=tmp_path)
    lines = _lines(tmp_path / "bench" / "k.jsonl")
    assert [r["key"]["task"] for r in rows] == ["aggregation", "review"]
    for r in rows:
        row, line = row_from_dict(r), lines[r["key"]["task"]]
        assert row.key.task == r["key"]["task"] and row.provenance["filled"] == {}
        assert (row.n, len(row.documents), row.baseline_right, row.arm_right) == (40, 8, line["baseline_right"], line["specprefill_right"])
        assert abs(row.bound - line["lower"]) < 1e-4 and row.passes == (line["status"] == "passes")
    # an inconclusive kind's row never passes, whatever its bound
    few = [_rec(k, "review", k % 8, k < 8, k < 8) for k in range(40)]
    _journal(tmp_path / "bench" / "few.jsonl", few)
    (row,) = evidence_build.build_rows({**src, "journal": "bench/few.jsonl"}, root=tmp_path)
    r = row_from_dict(row)
    assert r.bound == 1.0 and not r.passes and r.fails_bar().startswith("inconclusive: 8 baseline-right")
    assert _lines(tmp_path / "bench" / "few.jsonl")["review"]["status"] == "inconclusive"
