"""Mode auto's quality evidence (engine/policy/evidence.py): every row equals what its journal in
bench/results says (recomputed with the report's own statistics, so a row cannot drift from its data),
and the bands auto may run specprefill in are exactly the measured lengths for the measured pair."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from specq.bench.quality_report import aggregate, read_journal
from specq.engine.policy import auto
from specq.engine.policy.evidence import MIN_QUESTIONS, QUESTION_ALLOWANCE, QWEN_05B, QWEN_15B, ROWS, bands, model_key

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.arm}-{r.length}-{r.keep}-{r.chunk_rule}")
def test_each_row_is_what_its_journal_says(row):
    records = read_journal(REPO / row.journal)
    assert records, row.journal
    if row.arm == "group":  # its answers paired with the answer run's baseline answers, by task id
        answers = read_journal(REPO / row.paired_with)
        cells = [g for g in aggregate(answers + records)["group"] if g["length"] == row.length]
        assert len(cells) == 1
        g = cells[0]
        assert (g["n"], g["documents"]) == (row.n, row.documents)
        assert round(g["baseline_acc"], 3) == row.baseline_acc and round(g["group_acc"], 3) == row.specprefill_acc
        assert round(g["ratio_vs_baseline"], 3) == row.ratio and round(g["ratio_vs_baseline_lower"], 3) == row.ratio_lower
        grouped = {r["task"] for r in records if r.get("half") == "group"}
        answered = [r for r in answers if r.get("half") == "answer" and r["task"] in grouped
                    and not r["closed_book"]["correct"]]
        assert (min(r["doc_tokens"] for r in answered), max(r["doc_tokens"] for r in answered)) == row.doc_tokens
        return
    cells = [a for a in aggregate(records)["answer"] if a["length"] == row.length and a["chunk_rule"] == row.chunk_rule]
    assert len(cells) == 1
    a = cells[0]
    assert (a["keep"], a["scorer"], a["n"], a["documents"]) == (row.keep, row.scorer, row.n, row.documents)
    assert round(a["baseline_acc"], 3) == row.baseline_acc and round(a["specprefill_acc"], 3) == row.specprefill_acc
    assert round(a["ratio"], 3) == row.ratio and round(a["ratio_lower"], 3) == row.ratio_lower
    answered = [r for r in records if r.get("half") == "answer" and not r["closed_book"]["correct"]]
    assert (min(r["doc_tokens"] for r in answered), max(r["doc_tokens"] for r in answered)) == row.doc_tokens


def test_bands_are_the_measured_lengths_of_the_measured_pair():
    # 4K and 16K both pass and nothing measured between them fails: one band over both
    (band,) = bands(QWEN_15B, QWEN_05B, 0.3, "windowed", "mean")
    assert (band.lo, band.hi) == (3670, 15978 + QUESTION_ALLOWANCE)
    assert [r.length for r in band.rows] == [4000, 16000]
    # a path to the same model files names the same pair; more kept chunks keep the measured ones
    assert bands(f"/models/{QWEN_15B}.gguf", f"/x/{QWEN_05B.upper()}.GGUF", 0.5, "windowed", "mean") == (band,)
    assert model_key("/a/b/Qwen.GGUF") == "qwen"
    assert bands(QWEN_15B, QWEN_05B, 0.2, "windowed", "mean") == ()  # fewer kept: not what was measured
    assert bands(QWEN_15B, QWEN_05B, 0.3, "full", "mean") == ()
    assert bands("some-7b", QWEN_05B, 0.3, "windowed", "mean") == ()
    # a row measured under one chunk rule is no evidence for the other: the border rule (the default)
    # has its own rows, at the same two lengths, at 8K between them and at 30K (40 questions)
    (border,) = bands(QWEN_15B, QWEN_05B, 0.3, "windowed")
    assert (border.lo, border.hi) == (3670, 29940 + QUESTION_ALLOWANCE)
    assert [(r.length, r.chunk_rule) for r in border.rows] == [
        (4000, "border"), (8000, "border"), (16000, "border"), (30000, "border")]
    assert border.rows[-1].n == 40 and border.rows[-1].ratio_lower >= 0.95
    # at 8K the default windowed scorer reads the document in one pass: the one-pass (`full`) row stands
    # for it, not the earlier two-window row with as many questions; `full` itself has only that length
    assert [r.scorer for r in border.rows] == ["windowed", "full", "windowed", "windowed"]
    assert [r.journal for r in ROWS if r.length == 8000 and r.chunk_rule == "border"] == [
        "bench/results/quality-cpu-border-answer-8000.jsonl", border.rows[1].journal]
    (one_pass,) = bands(QWEN_15B, QWEN_05B, 0.3, "full")
    assert (one_pass.lo, one_pass.hi) == (7896, 7967 + QUESTION_ALLOWANCE) and one_pass.rows == (border.rows[1],)
    # a full row on documents longer than one pass of the windowed scorer is no evidence for it
    long_full = replace(border.rows[1], length=16000, doc_tokens=(15919, 15978), ratio_lower=0.5)
    assert bands(QWEN_15B, QWEN_05B, 0.3, "windowed", rows=ROWS + (long_full,)) == (border,)
    assert bands(QWEN_15B, QWEN_05B, 0.3, "windowed", "border") == (border,) != (band,)
    assert bands(QWEN_15B, QWEN_05B, 0.3, "windowed", "border", rows=ROWS[:2]) == ()  # mean rows only
    # the scope rule's only row (4K) fails its lower bound: no band, so auto runs baseline under it
    assert [r.passes for r in ROWS if r.chunk_rule == "scope"] == [False]
    assert bands(QWEN_15B, QWEN_05B, 0.3, "windowed", "scope") == ()


def test_bands_join_passing_lengths_and_stop_at_a_failing_one():
    r4 = ROWS[0]
    r16 = replace(r4, length=16000, doc_tokens=(15900, 15990))
    bad8 = replace(r4, length=8000, doc_tokens=(7900, 7990), ratio=0.9, ratio_lower=0.7)
    weak16 = replace(r16, n=10, ratio_lower=0.5)  # fewer questions at the same length: not the one that stands
    args = (QWEN_15B, QWEN_05B, 0.3, "windowed", "mean")
    joined = bands(*args, rows=(r4, r16, weak16))
    assert [(b.lo, b.hi) for b in joined] == [(3670, 15990 + QUESTION_ALLOWANCE)]
    split = bands(*args, rows=(r4, bad8, r16))
    assert [(b.lo, b.hi) for b in split] == [(3670, 3980 + QUESTION_ALLOWANCE), (15900, 15990 + QUESTION_ALLOWANCE)]
    # a few questions with no discordant pair: the conditional bound equals the ratio (1.0 on the first
    # five 30K questions); too few to stand, so the band does not grow to that length
    few30 = replace(r4, length=30000, doc_tokens=(29880, 29880), n=5, documents=1, ratio=1.0, ratio_lower=1.0)
    assert not few30.passes and replace(few30, n=MIN_QUESTIONS).passes
    assert bands(*args, rows=(r4, r16, few30)) == joined


def test_auto_runs_specprefill_only_inside_a_band():
    bs = bands(QWEN_15B, QWEN_05B, 0.3, "windowed", "mean")
    inside = auto.decide(3900, backend="cpu", quality_bands=bs)
    assert inside.mode == "specprefill" and "3,670-16,234 tokens" in inside.reason and "90% lower 0.96" in inside.reason
    assert "90% lower 1.13" in inside.reason and "mean chunk rule" in inside.reason  # the 16K row is named too
    for n in (3000, 17000):
        out = auto.decide(n, backend="cpu", quality_bands=bs)
        assert out.mode == "baseline" and f"not measured at {n} tokens" in out.reason and "3,670-16,234" in out.reason
    # on CUDA the break-even (8,192) is above the band: baseline
    assert auto.decide(3900, backend="cuda", quality_bands=bs).mode == "baseline"
    # an operator's own threshold replaces the bands
    assert auto.decide(20000, backend="cpu", quality_bands=bs, quality_min_tokens=8000).mode == "specprefill"


def test_a_group_runs_group_sparse_only_inside_a_group_band():
    """Rule 1a rests on rows of the group path's own answers (arm "group"), not on rule 3's: the 4K and
    30K group rows fail (lower 0.927 and 0.771), so no band; a passing group row at 30K would make a
    CUDA group of 8 at 30K tokens run group-sparse, and the reason names that row."""
    group_4k, group_30k = [r for r in ROWS if r.arm == "group"]
    assert (group_4k.length, group_30k.length) == (4000, 30000)
    assert not group_4k.passes and group_4k.ratio_lower < 0.95
    # at 30K group answers lose to the single specprefill answers of the same questions, and to baseline
    assert not group_30k.passes and group_30k.specprefill_acc < group_30k.baseline_acc and group_30k.ratio_lower < 0.8
    assert bands(QWEN_15B, QWEN_05B, 0.3, "windowed", "mean", arm="group") == ()
    assert bands(QWEN_15B, QWEN_05B, 0.3, "windowed", arm="group") == ()
    assert bands(QWEN_15B, QWEN_05B, 0.3, "windowed", "mean")[0].rows[0].arm == "specprefill"
    spec = bands(QWEN_15B, QWEN_05B, 0.3, "windowed")  # rule 3's border band covers 30K
    assert spec[0].covers(29900)
    none = auto.decide(29900, backend="cuda", quality_bands=spec, reused_document=True, group=8,
                       group_bands=bands(QWEN_15B, QWEN_05B, 0.3, "windowed", arm="group"))
    assert none.mode == "baseline" and "(a group of 8, but group-sparse quality not measured at 29900" in none.reason
    passing = replace(group_30k, n=41, ratio_lower=0.96)  # more questions: it would stand for 30K
    gb = bands(QWEN_15B, QWEN_05B, 0.3, "windowed", rows=ROWS + (passing,), arm="group")
    assert [(b.lo, b.hi) for b in gb] == [(29821, 29940 + QUESTION_ALLOWANCE)]
    yes = auto.decide(29900, backend="cuda", quality_bands=spec, reused_document=True, group=8, group_bands=gb)
    assert yes.mode == "specprefill" and yes.reason.startswith("group of 8 questions about a stored document")
    assert "group-sparse answers, keep 0.3, border chunk rule" in yes.reason
    # the CPU has no measured length for it, so its groups take rule 1b even inside the band
    cpu = auto.decide(29900, backend="cpu", quality_bands=spec, reused_document=True, group=8, group_bands=gb)
    assert cpu.mode == "baseline" and "group-sparse not measured faster on cpu" in cpu.reason
