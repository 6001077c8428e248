"""Mode auto's quality evidence as data (engine/policy/evidence.py, issue 47 item 2): the shipped rows are exactly
what `specq evidence build` computes from the journals in bench/results (so a row cannot drift from its
data), their bounds are clustered by document and never above the question-level exact bound, in-sample
rows never pass, a pass needs 8 documents and 40 questions (10 of them baseline-right), and bands join only
passing lengths."""

from __future__ import annotations

import dataclasses
import json

import pytest

from specq.bench import evidence_build
from specq.bench.quality_report import paired, read_journal
from specq.engine.policy import auto, evidence
from specq.engine.policy.evidence import PASS_BARS, QUESTION_ALLOWANCE, lookup, merge, row_from_dict, shipped_rows
from specq.engine.policy.evidence_bound import document_bootstrap_lower, row_lower

ROWS = shipped_rows()


#: the lookup journals' sources (one row each); the kinds journals' (one row per kind) are checked against the
#: kind x length table below
LOOKUP_SOURCES = [s for s in evidence_build.SOURCES if not s.get("kinds")]
KINDS_SOURCES = [s for s in evidence_build.SOURCES if s.get("kinds")]


def test_the_shipped_file_is_what_the_journals_give():
    assert json.loads(evidence.SHIPPED_PATH.read_text()) == json.loads(json.dumps(evidence_build.build()))
    assert len(LOOKUP_SOURCES) == len([r for r in ROWS if r.key.task == "lookup"]) == 11
    assert len(ROWS) == 11 + sum(len(evidence_build.kinds_in(s)) for s in KINDS_SOURCES)


@pytest.mark.parametrize("src", KINDS_SOURCES, ids=lambda s: s["journal"].rsplit("/", 1)[1])
def test_each_kinds_row_is_its_line_of_the_kind_table(src):
    """A kinds journal's rows (one per kind, summary none) count what docs/quality.md's kind x length table shows
    for that kind, and a row passes exactly where its line's status is "passes"."""
    from specq.bench import kinds_table

    lines = {(ln["kind"], ln["length"]): ln for ln in kinds_table.journal_rows(evidence_build.REPO / src["journal"])}
    mine = [r for r in ROWS if r.source == src["journal"]]
    assert [r.key.task for r in mine] == evidence_build.kinds_in(src) and "summary" not in [r.key.task for r in mine]
    for r in mine:
        ln = lines[(r.key.task, r.length)]
        assert (r.n, len(r.documents), r.baseline_right, r.arm_right) == (ln["n"], ln["documents"], ln["baseline_right"],
                                                                            ln["specprefill_right"])
        assert r.bound == pytest.approx(ln["lower"], abs=1e-4) and r.passes == (ln["status"] == "passes")
        assert r.provenance["filled"] == {} and not r.in_sample


@pytest.mark.parametrize("src", LOOKUP_SOURCES, ids=lambda s: s["journal"].rsplit("/", 1)[1])
def test_each_row_is_clustered_and_never_above_the_exact_bound(src):
    row = next(r for r in ROWS if r.source == src["journal"])
    records = read_journal(evidence_build.REPO / src["journal"])
    if row.arm == "group":
        answers = {r["task"]: r for r in read_journal(evidence_build.REPO / src["paired_with"]) if r.get("half") == "answer"}
        pairs = [(answers[r["task"]]["baseline"]["correct"], r["group"]["correct"]) for r in records
                 if r.get("half") == "group" and "group" in r and not r["closed_book"]["correct"]]
    else:
        pairs = [(r["baseline"]["correct"], r["specprefill"]["correct"]) for r in records
                 if r.get("half") == "answer" and not r["closed_book"]["correct"]]
    exact = paired(pairs)
    assert row.n == exact["n"] and round(row.ratio, 3) == round(exact["ratio"], 3)
    assert row.bound <= exact["ratio_lower"] + 1e-9
    assert row.bound == pytest.approx(min(exact["ratio_lower"], document_bootstrap_lower(row.documents)), abs=1e-4)
    # every key field is filled, and the row says from where for a journal that did not record it
    answered = [r for r in records if r.get("half") == "answer" and "specprefill" in r]
    if answered and all("key" in r and "doc_sha256" in r for r in answered):
        assert row.provenance["filled"] == {}  # (a journal written since issue 47 records them all)
    else:
        assert set(row.provenance["filled"]) >= {"target_sha256", "positions", "max_keep", "scorer/window"}
        assert row.provenance["notes"]["documents"].startswith("named by family")
    assert not row.passes and "documents < 8" in row.fails_bar() or row.in_sample


def test_no_shipped_row_passes_and_in_sample_rows_say_why():
    assert not any(r.passes for r in ROWS) and max(len(r.documents) for r in ROWS if r.key.task == "lookup") == 4
    ins = [r for r in ROWS if r.in_sample]
    assert sorted((r.length, r.key.chunk_rule, r.key.scorer, r.key.score_math) for r in ins) == [
        (4000, "border", "full", "numpy"), (4000, "border", "full", "torch-speculator"), (8000, "border", "full", "numpy")]
    assert all(r.fails_bar().startswith("in-sample (") for r in ins)
    # 16K: 20 questions from 2 documents, whatever the bound
    r16 = next(r for r in ROWS if r.length == 16000 and r.key.chunk_rule == "border")
    assert (r16.n, len(r16.documents)) == (20, 2)


def _docs(k: int, n: int, base: int, arm: int, both: int) -> dict:
    return {f"d{i}": {"n": n, "baseline_right": base, "arm_right": arm, "both_right": both} for i in range(k)}


def test_the_pass_bar():
    key = ROWS[0].key
    good = row_from_dict({"key": key.as_dict(), "length": 4000, "doc_tokens": [3000, 4000], "documents": _docs(8, 5, 4, 4, 4)})
    assert good.passes and good.bound == 1.0 and PASS_BARS["answer_right"].min_documents == 8
    assert "7 documents < 8" in dataclasses.replace(good, documents=_docs(7, 6, 4, 4, 4)).fails_bar()
    assert "32 questions < 40" in dataclasses.replace(good, documents=_docs(8, 4, 4, 4, 4)).fails_bar()
    assert dataclasses.replace(good, in_sample=True).fails_bar() == "in-sample"
    # issue 49: fewer than 10 baseline-right answers is inconclusive, however many questions and whatever the bound
    few_right = dataclasses.replace(good, documents=_docs(8, 5, 1, 1, 1))
    assert row_lower(few_right.documents) == 1.0 and PASS_BARS["answer_right"].min_baseline_right == 10
    assert few_right.fails_bar() == "inconclusive: 8 baseline-right answers < 10" and not few_right.passes
    assert dataclasses.replace(good, documents=_docs(10, 4, 1, 1, 1)).passes
    # one document that loses: clustering pulls the bound down further than the questions alone would
    bad = {**_docs(7, 5, 4, 4, 4), "d7": {"n": 5, "baseline_right": 5, "arm_right": 1, "both_right": 1}}
    assert row_lower(bad) < 0.95


def test_a_malformed_row_names_the_field_and_never_widens():
    ok = {"key": ROWS[0].key.as_dict(), "length": 4000, "doc_tokens": [3000, 4000], "documents": _docs(8, 5, 4, 3, 3)}
    bound = row_from_dict(ok).bound
    cases = [
        ({"key": {**ok["key"], "max_keep": -1}}, "key.max_keep"),
        ({"key": {k: v for k, v in ok["key"].items() if k != "pool"}}, "key.pool: missing"),
        ({"key": {**ok["key"], "target_sha256": "abc"}}, "key.target_sha256"),
        ({"metric": "vibes"}, "metric:"),
        ({"documents": {"d0": {"n": 2, "baseline_right": 3, "arm_right": 0, "both_right": 0}}}, "documents.d0"),
        ({"documents": {}}, "documents:"),
        ({"doc_tokens": [5, 1]}, "doc_tokens:"),
        ({"bound": bound + 0.05}, "bound:"),
        ({"passes": True}, "passes:"),
        ({"n": 41}, "n:"),
    ]
    for change, needle in cases:
        with pytest.raises(ValueError, match="^" + needle.replace(".", r"\.")):
            row_from_dict({**ok, **change})
    assert row_from_dict({**ok, "bound": bound - 0.1}).bound == bound  # a lower claim is recomputed, not kept


def _fake(length, lo, hi, passes=True, key=None):
    docs = _docs(8, 5, 4, 4, 4) if passes else _docs(8, 5, 4, 1, 1)
    return row_from_dict({"key": (key or ROWS[0].key).as_dict(), "length": length, "doc_tokens": [lo, hi], "documents": docs})


def test_bands_join_passing_lengths_and_stop_at_a_failing_one():
    r4, r16, bad8 = _fake(4000, 3670, 3980), _fake(16000, 15900, 15990), _fake(8000, 7900, 7990, passes=False)
    key = ROWS[0].key
    joined, why = lookup((r4, r16), key)
    assert why == "" and [(b.lo, b.hi) for b in joined] == [(3670, 15990 + QUESTION_ALLOWANCE)]
    split, _ = lookup((r4, bad8, r16), key)
    assert [(b.lo, b.hi) for b in split] == [(3670, 3980 + QUESTION_ALLOWANCE), (15900, 15990 + QUESTION_ALLOWANCE)]
    inside = auto.decide(3900, backend="cpu", quality_bands=joined)
    assert inside.mode == "specprefill" and "3,670-16,246 tokens" in inside.reason and "(8 documents)" in inside.reason
    out = auto.decide(17000, backend="cpu", quality_bands=joined)
    assert out.mode == "baseline" and "not measured at 17000 tokens" in out.reason
    # matching rows that all fail: no band, and the reason says why each fails
    none, why = lookup((bad8,), key)
    assert none == () and why.startswith("specprefill evidence for these settings does not pass (8000: lower bound")
    # the shipped rows: none passes
    assert lookup(ROWS, key) == ((), lookup(ROWS, key)[1]) and "4000: 4 documents < 8" in lookup(ROWS, key)[1]


def test_group_rows_are_rule_1a_s_only_evidence():
    group = [r for r in ROWS if r.arm == "group"]
    assert [(r.length, round(r.bound, 3)) for r in group] == [(4000, 0.927), (30000, 0.771)]
    key30 = group[1].key
    passing = _fake(30000, 29821, 29940, key=key30)
    gb, _ = lookup((dataclasses.replace(passing, arm="group"),), key30, arm="group")
    spec_only, _ = lookup((passing,), key30, arm="group")
    assert spec_only == () and [(b.lo, b.hi) for b in gb] == [(29821, 29940 + QUESTION_ALLOWANCE)]
    yes = auto.decide(29900, backend="cuda", quality_bands=gb, reused_document=True, group=8, group_bands=gb)
    assert yes.mode == "specprefill" and yes.reason.startswith("group of 8 questions about a stored document")
    assert "group-sparse answers, keep 0.3, border chunk rule" in yes.reason


def test_a_stored_row_supersedes_a_shipped_one_only_with_as_many_documents():
    shipped = ROWS[0]
    fewer = dataclasses.replace(shipped, documents=dict(list(shipped.documents.items())[:3]), created_at="2027-01-01")
    more = dataclasses.replace(shipped, documents={**shipped.documents, "x": {"n": 1, "baseline_right": 1, "arm_right": 1,
                                                                                 "both_right": 1}})
    other = dataclasses.replace(shipped, length=5000)
    assert merge((shipped,), (fewer,)) == (shipped,)
    assert merge((shipped,), (more,))[0] is more
    assert set(map(id, merge((shipped,), (other,)))) == {id(shipped), id(other)}
