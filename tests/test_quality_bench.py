"""specq bench quality: the task generator (answer once, depth), the statistics, the journal; and a
small real-model run of both halves (marked real_models)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from specq.bench import quality_tasks as qt
from specq.bench.quality_report import aggregate, cp_lower, paired, read_journal


def count(s: str) -> int:  # a crude tokenizer stand-in: ~3.6 characters per token
    return int(len(s) / 3.6)


@pytest.mark.parametrize("index", range(8))
@pytest.mark.parametrize("length", [4000, 16000])
def test_task_answer_once_and_depth(index, length):
    t = qt.make_task(index, length, count)
    kind, depth = qt.task_plan(index)
    assert t.kind == kind and t.depth == depth
    assert count(t.document) <= length
    assert count(t.document) >= 0.9 * length
    assert abs(t.actual_depth - depth) <= 0.06
    doc = t.document
    ev = [doc[s:e] for s, e in t.evidence]
    if kind in ("needle", "multikey"):
        assert doc.count(t.answer) == 1
        assert t.answer in ev[0]
        if kind == "multikey":  # the distractors: the same vault word, other numbers
            vault = re.search(r"vault '([a-z]+)-\d+'", t.question).group(1)
            assert len(re.findall(rf"vault '{vault}-\d+' is \d+", doc)) == 6
    elif kind == "raises":
        msg = re.search(r'message "(.*)"\?', t.question).group(1)
        assert doc.count(msg) == 1 and ev[1] == msg
        assert len(re.findall(rf"\bdef {t.answer}\(", doc)) == 1 and ev[0] == f"def {t.answer}"
        assert t.answer.lower() not in msg.lower()
    else:
        name = re.search(r"constant (\w+) assigned", t.question).group(1)
        assert len(re.findall(rf"\b{name}\b", doc)) == 1
        assert ev[0].startswith(f"{name} = ") and t.answer in ev[0]


def test_tasks_are_deterministic():
    a, b = qt.make_task(5, 4000, count), qt.make_task(5, 4000, count)
    assert a.document == b.document and a.question == b.question and a.id == b.id
    assert qt.make_task(5, 4000, count, seed=1).document != a.document


def test_depths_cover_the_range():
    assert sorted(qt.task_plan(i)[1] for i in range(9)) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert len({qt.task_plan(i) for i in range(36)}) == 36  # every (kind, depth) pair once


def test_grading():
    t = qt.make_task(0, 4000, count)  # needle
    assert qt.is_correct(t, f"The code is {t.answer}.")
    assert not qt.is_correct(t, f"{t.answer}9")
    r = qt.make_task(2, 4000, count)  # raises
    assert qt.is_correct(r, f"`{r.answer}`") and not qt.is_correct(r, f"{r.answer}_x")


def test_evidence_chunks_and_random_control():
    bounds = list(range(0, 101))  # 100 one-character tokens
    assert qt.evidence_chunks(bounds, [(31, 33)], 32) == [0, 1]
    assert qt.evidence_chunks(bounds, [(40, 41), (99, 100)], 32) == [1, 3]
    assert qt.random_recall(10, 3, 1) == pytest.approx(0.3)
    assert qt.random_recall(10, 3, 2) == pytest.approx(3 / 45)
    assert qt.random_recall(10, 1, 2) == 0.0


def test_clopper_pearson_lower():
    assert cp_lower(10, 10, 0.9) == pytest.approx(0.1 ** (1 / 10), abs=1e-9)
    assert cp_lower(0, 10) == 0.0
    # P(X >= k | p_lo) = 0.1 at the bound
    lo = cp_lower(37, 50, 0.9)
    tail = sum(math.comb(50, i) * lo**i * (1 - lo) ** (50 - i) for i in range(37, 51))
    assert tail == pytest.approx(0.1, abs=1e-6)
    assert lo < 37 / 50


def test_paired_ratio_and_bound():
    p = paired([(True, True)] * 10)
    assert p["ratio"] == 1.0 and p["ratio_lower"] == 1.0 and p["baseline_only"] == 0
    p = paired([(True, True)] * 8 + [(True, False)] * 2)
    assert p["ratio"] == pytest.approx(0.8) and p["ratio_lower"] == pytest.approx(0.8)  # c = 0: theta_lo = 0
    p = paired([(True, True)] * 30 + [(True, False)] * 2 + [(False, True)] * 3 + [(False, False)] * 5)
    assert (p["both_right"], p["baseline_only"], p["specprefill_only"], p["both_wrong"]) == (30, 2, 3, 5)
    assert p["ratio"] == pytest.approx(33 / 32)
    th = cp_lower(3, 5, 0.9)
    assert p["ratio_lower"] == pytest.approx((30 + 5 * th) / (30 + 5 - 5 * th))
    assert p["ratio_lower"] < p["ratio"]


def test_journal_resumes_and_survives_a_torn_line(tmp_path):
    from specq.bench.quality import Journal, QualitySettings

    path = tmp_path / "j.jsonl"
    s = QualitySettings()
    j = Journal(path, s)
    rec = {"task": "t1", "length": 4000, "kind": "needle", "kept": {"windowed": {"0.3": True}}, "random": {"0.3": 0.3}}
    j.append("recall", rec)
    with path.open("a") as f:
        f.write('{"half": "recall", "task": "t2", "kep')  # killed mid-write
    j2 = Journal(path, s)
    assert j2.done("recall", "t1") and not j2.done("recall", "t2")
    assert not Journal(path, QualitySettings(keeps=[0.3])).done("recall", "t1")  # other settings: not done
    j2.append("recall", {**rec, "task": "t3"})
    assert [r["task"] for r in read_journal(path)] == ["t1", "t3"]
    agg = aggregate(read_journal(path))
    assert agg["recall"][0]["n"] == 2 and agg["recall"][0]["recall"] == 1.0
    json.dumps(agg)


def test_recall_rows_count_each_arms_own_documents_and_random_control():
    """Journals joined in one report may cover different tasks (an arm stopped early): each recall
    row's documents and random control come from that arm's own tasks, not the whole length's."""
    def rec(task, family, arms, random):  # each journal has its own settings key
        return {"half": "recall", "settings_key": arms[0], "task": task, "family": family, "length": 16000,
                "kind": "raises", "kept": {a: {"0.3": True} for a in arms}, "random": {"0.3": random}}

    records = [rec(f"f{f}-q{q}", f"f{f}", ["windowed"], 0.1) for f in range(4) for q in range(2)]
    records += [rec(f"f{f}-q{q}", f"f{f}", ["windowed@8192"], 0.1) for f in range(2) for q in range(2)]
    records += [rec("f9-q0", "f9", ["windowed"], 0.5)]  # an arm-only task moves that arm's control alone
    rows = {r["scorer"]: r for r in aggregate(records)["recall"]}
    assert (rows["windowed"]["n"], rows["windowed"]["documents"]) == (9, 5)
    assert (rows["windowed@8192"]["n"], rows["windowed@8192"]["documents"]) == (4, 2)
    assert rows["windowed@8192"]["random_recall"] == pytest.approx(0.1)
    assert rows["windowed"]["random_recall"] == pytest.approx((8 * 0.1 + 0.5) / 9)


def test_renormalise():
    from specq.bench.quality import renormalise

    s = np.array([1.0, 2.0, 4.0, 10.0, 20.0, 5.0])
    m = renormalise(s, [(0, 3), (3, 6)], "max")
    assert m.tolist() == [0.25, 0.5, 1.0, 0.5, 1.0, 0.25]
    z = renormalise(s, [(0, 3), (3, 6)], "z")
    assert z[:3].mean() == pytest.approx(0) and z[3:].std() == pytest.approx(1)
    assert np.argsort(z[:3]).tolist() == np.argsort(s[:3]).tolist()


@pytest.mark.real_models
@pytest.mark.timeout(1800)
def test_quality_runner_on_the_real_pair(real_engine, tmp_path):
    """Both halves on a handful of 1.2K-token tasks (windows of 600 tokens, so two), a rerun skips
    them, and the report aggregates them."""
    from specq.bench.quality import Journal, QualitySettings, build_report, run_answer, run_recall

    s = QualitySettings(lengths=[1200], n=2, scorers=["windowed", "full"], window=600, max_tokens=12)
    a = QualitySettings(lengths=[1200], n=1, window=600, max_tokens=12)
    path = tmp_path / "q.jsonl"
    run_recall(real_engine, s, Journal(path, s))
    run_answer(real_engine, a, Journal(path, a))
    recs = read_journal(path)
    assert sum(r["half"] == "recall" for r in recs) == 2 and sum(r["half"] == "answer" for r in recs) == 1
    lines = path.read_text().count("\n")
    run_recall(real_engine, s, Journal(path, s))  # resumed: nothing to do
    run_answer(real_engine, a, Journal(path, a))
    assert path.read_text().count("\n") == lines
    rec = [r for r in recs if r["half"] == "recall"]
    assert [r["kind"] for r in rec] == ["needle", "multikey"]
    assert all(r["windows"]["windowed"] == 2 and r["windows"]["full"] == 1 for r in rec)
    assert all(set(r["kept"]) == {"windowed", "full", "windowed-max", "windowed-z", "windowed-mean", "full-mean",
                                      "windowed-scope", "full-scope", "windowed-block", "full-block"} for r in rec)
    assert all(0 < p < 1 for r in rec for p in r["random"].values())
    rep = build_report([path], real_engine, s)
    assert {r["scorer"] for r in rep["recall"]} >= {"windowed", "full"}
    assert rep["answer"][0]["tasks"] == 1 and rep["provenance"]["git_describe"]
    ans = [r for r in recs if r["half"] == "answer"][0]
    assert ans["closed_book"]["correct"] is False  # a random 7-digit code is not known without the document
    assert ans["baseline"]["correct"]  # the 1.5B target finds a planted code in 1.2K tokens
    # the planted needle is kept by the speculator at keep 0.5 (at random: about a quarter of the time)
    assert rec[0]["kept"]["full"]["0.5"]


@pytest.mark.parametrize("index", range(6))
@pytest.mark.parametrize("length", [4000, 16000])
def test_family_one_document_answer_once(index, length):
    """A family: one document, every question's answer stands once in it, evidence spans point at it."""
    fam = qt.make_family(index, length, count)
    assert len(fam) >= 6
    doc = fam[0].document
    assert all(t.document is doc or t.document == doc for t in fam)
    assert 0.9 * length <= count(doc) <= length
    assert len({t.id for t in fam}) == len(fam) and len({t.question for t in fam}) == len(fam)
    assert len({t.meta["family"] for t in fam}) == 1
    for t in fam:
        ev = [doc[s:e] for s, e in t.evidence]
        assert t.depth == min(qt.DEPTHS, key=lambda d: abs(d - t.actual_depth))  # the depth bin of the evidence
        if t.kind in ("needle", "multikey"):
            assert doc.count(t.answer) == 1 and t.answer in ev[0]
        elif t.kind == "raises":
            msg = re.search(r'message "(.*)"\?', t.question).group(1)
            assert doc.count(msg) == 1 and ev[1] == msg and ev[0] == f"def {t.answer}"
        else:
            name = re.search(r"constant (\w+) assigned", t.question).group(1)
            assert len(re.findall(rf"^{name} = ", doc, re.M)) == 1 and ev[0].startswith(f"{name} = ")
    kinds = {t.kind for t in fam}
    assert kinds <= {"multikey", "raises", "const"} or kinds == {"needle"}
    if "multikey" in kinds:  # the vaults: each asked, each the others' distractor
        assert sum(t.kind == "multikey" for t in fam) == qt.FAMILY_PLANTED
    depths = sorted(t.actual_depth for t in fam if t.planted)
    assert depths[0] < 0.25 and depths[-1] > 0.75  # planted lines spread over the document


def test_families_are_deterministic_and_fill_n():
    from specq.bench.quality import QualitySettings, tasks_for

    a = qt.make_family(3, 4000, count)
    b = qt.make_family(3, 4000, count)
    assert [t.question for t in a] == [t.question for t in b] and a[0].document == b[0].document
    got = list(tasks_for(QualitySettings(lengths=[4000], n=20, family=16), 4000, count))
    assert len(got) == 20 and len({t.id for t, _ in got}) == 20
    assert all(scope == t.meta["family"] for t, scope in got)
    assert len({scope for _, scope in got}) >= 2
    single = list(tasks_for(QualitySettings(lengths=[4000], n=3), 4000, count))
    assert [s for _, s in single] == ["", "", ""]
    # the family setting is part of the journal key; journals written before families keep theirs
    assert QualitySettings(family=16).key("recall") != QualitySettings().key("recall")
    assert QualitySettings().key("recall") == QualitySettings(family=0).key("recall")


def test_group_half_pairs_with_the_answer_half(tiny_models, tmp_path):
    """The group half (one group-sparse prefill per family) on the tiny models: every open task of the
    family gets a group answer from one run_group call (no fallback), a rerun skips them, and the report
    pairs them with the answer half's records by task id. (Random weights: the answers are noise; the
    real-pair run is in docs/quality.md.)"""
    from specq.bench.quality import Journal, QualitySettings, build_report, run_answer, run_group
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, n_threads=2, cache_bytes=256 << 20))
    try:
        s = QualitySettings(lengths=[1200], n=3, family=3, window=600, max_tokens=4)
        answers, groups = tmp_path / "a.jsonl", tmp_path / "g.jsonl"
        run_answer(eng, s, Journal(answers, s))
        run_group(eng, s, Journal(groups, s))
        lines = groups.read_text().count("\n")
        run_group(eng, s, Journal(groups, s))  # resumed: nothing to do
        assert groups.read_text().count("\n") == lines == 3
        recs = read_journal(groups)
        open_ = [r for r in recs if "group" in r]
        assert len({r["family"] for r in recs}) == 1 and open_
        assert all(r["group"]["fallback"] is None and r["group"]["size"] == len(open_) for r in open_)
        own = min(r["group"]["own_kept_tokens"] for r in open_)
        assert all(0 < r["group"]["union_kept_fraction"] <= 1 for r in open_) and own > 0
        rep = build_report([answers, groups])
        (row,) = rep["group"]
        assert row["n"] == len(open_) and row["documents"] == 1 and row["fallbacks"] == 0
        assert 0 <= row["same_text_as_specprefill"] <= row["n"]
        with pytest.raises(ValueError):
            run_group(eng, QualitySettings(lengths=[1200], n=1), Journal(tmp_path / "x.jsonl", s))
    finally:
        eng.close()


def test_recall_window_arm_pairs_with_the_default_window(tiny_models, tmp_path):
    """`windowed@W` scores the same tasks with windows of W document tokens (here more windows than
    the default arm's) and the report pairs it with `windowed` per keep; a malformed arm fails before
    any work. (Random weights: which chunks are kept is noise; the mechanics are the point.)"""
    from specq.bench.quality import Journal, QualitySettings, build_report, run_recall
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, n_threads=2))
    try:
        s = QualitySettings(lengths=[1200], n=2, scorers=["windowed", "windowed@300"], window=600)
        path = tmp_path / "arm.jsonl"
        run_recall(eng, s, Journal(path, s))
        recs = [r for r in read_journal(path) if r["half"] == "recall"]
        assert len(recs) == 2
        assert all(r["windows"]["windowed"] == 2 and r["windows"]["windowed@300"] >= 4 for r in recs), recs
        assert all(set(r["kept"]) == {"windowed", "windowed-max", "windowed-z", "windowed@300", "windowed-mean",
                                      "windowed@300-mean", "windowed-scope", "windowed@300-scope", "windowed-block",
                                      "windowed@300-block"} for r in recs)
        arms = build_report([path])["recall_window_arms"]
        # each arm against its default: the window size against `windowed`, another chunk rule against its own scorer
        assert {(r["default"], r["arm"]) for r in arms} == {("windowed", "windowed@300"), ("windowed", "windowed-mean"),
                                                            ("windowed@300", "windowed@300-mean"), ("windowed", "windowed-scope"),
                                                            ("windowed@300", "windowed@300-scope"), ("windowed", "windowed-block"),
                                                            ("windowed@300", "windowed@300-block")}
        assert all(r["n"] == 2 for r in arms)
        assert sorted(r["keep"] for r in arms) == sorted(s.keeps * 7)
        assert all(r["both"] + r["default_only"] + r["arm_only"] + r["neither"] == 2 for r in arms)
        bad = QualitySettings(lengths=[1200], n=1, scorers=["full@300"])
        with pytest.raises(ValueError, match="windowed@W"):
            run_recall(eng, bad, Journal(tmp_path / "bad.jsonl", bad))
        assert not (tmp_path / "bad.jsonl").exists() or read_journal(tmp_path / "bad.jsonl") == []
    finally:
        eng.close()


def test_recall_from_saved_scores_under_another_rule(tiny_models, tmp_path):
    """`scores_dir` saves each task's scores; a later run with `scores_from` and another chunk rule
    scores nothing and ranks the saved scores by that rule: its records equal the first run's
    same-pass variants for that rule (and say where the scores came from). A task with no saved scores
    (another seed: other task ids) is scored anew."""
    from dataclasses import replace

    from specq.bench.quality import Journal, QualitySettings, run_recall
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, n_threads=2))
    try:
        saved = tmp_path / "scores"
        s = QualitySettings(lengths=[1200], n=3, scorers=["windowed"], window=600, scores_dir=str(saved))
        run_recall(eng, s, Journal(tmp_path / "a.jsonl", s))
        first = [r for r in read_journal(tmp_path / "a.jsonl") if r["half"] == "recall"]
        assert len(list(saved.glob("*-windowed.npz"))) == 3
        again = replace(s, scores_dir="", scores_from=str(saved), chunk_rule="mean")
        run_recall(eng, again, Journal(tmp_path / "b.jsonl", again))
        second = [r for r in read_journal(tmp_path / "b.jsonl") if r["half"] == "recall"]
        assert [r["task"] for r in second] == [r["task"] for r in first]
        for a, b in zip(first, second):
            assert b["scores_from"] == {"windowed": str(saved)} and b["score_ms"] == {}
            assert b["kept"]["windowed"] == a["kept"]["windowed-mean"] and b["kept"]["windowed-border"] == a["kept"]["windowed"]
            assert b["rank"]["windowed-scope"] == a["rank"]["windowed-scope"] and b["windows"] == a["windows"]
        other = replace(again, seed=1)
        run_recall(eng, other, Journal(tmp_path / "c.jsonl", other))
        assert all("scores_from" not in r and r["score_ms"]["windowed"] > 0
                   for r in read_journal(tmp_path / "c.jsonl") if r["half"] == "recall")
    finally:
        eng.close()


def test_answer_half_reuses_an_earlier_runs_baselines(tiny_models, tmp_path):
    """`--baseline-from`: a run under another chunk rule, scorer or keep takes the closed-book and baseline
    answers of an earlier journal of the same tasks (they do not depend on either) and runs only
    specprefill; the report keeps the rules' and scorers' rows apart; a journal of other settings is
    refused."""
    from dataclasses import replace

    from specq.bench.quality import Journal, QualitySettings, baselines_from, build_report, run_answer
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, n_threads=2))
    try:
        old_s = QualitySettings(lengths=[1200], n=2, window=600, max_tokens=4, chunk_rule="mean")
        old, new = tmp_path / "mean.jsonl", tmp_path / "border.jsonl"
        run_answer(eng, old_s, Journal(old, old_s))
        s = replace(old_s, chunk_rule="border")
        reuse = baselines_from(old, s)
        assert set(reuse) == {r["task"] for r in read_journal(old)}
        runs = []
        real_run = eng.run
        eng.run = lambda *a, **k: runs.append(a[1].mode) or real_run(*a, **k)  # count the engine's runs
        run_answer(eng, s, Journal(new, s), baselines=reuse, baselines_path=str(old))
        eng.run = real_run
        recs = {r["task"]: r for r in read_journal(new)}
        before = {r["task"]: r for r in read_journal(old)}
        assert set(recs) == set(before) and "baseline" not in runs  # no closed-book or baseline run again
        assert runs.count("specprefill") == sum("baseline" in r for r in recs.values())
        for tid, r in recs.items():
            assert r["settings"]["chunk_rule"] == "border" and r["closed_book"]["reused_from"] == str(old)
            if "baseline" in r:
                assert {k: v for k, v in r["baseline"].items() if k != "reused_from"} == before[tid]["baseline"]
        rows = build_report([old, new])["answer"]
        assert sorted(r["chunk_rule"] for r in rows) == ["border", "mean"]
        # another scorer reuses them too, and its row stays apart from the windowed rows of the same rule
        one_pass = replace(s, scorer="full")
        assert set(baselines_from(old, one_pass)) == set(reuse)
        assert set(baselines_from(old, replace(s, window=0))) == set(reuse)  # the journal's window (600) is found
        assert set(baselines_from(old, replace(s, keep=0.1))) == set(reuse)  # a smaller keep's arm: baselines do not depend on it
        run_answer(eng, one_pass, Journal(tmp_path / "full.jsonl", one_pass), baselines=reuse, baselines_path=str(old))
        rows = build_report([old, new, tmp_path / "full.jsonl"])["answer"]
        assert sorted((r["scorer"], r["chunk_rule"]) for r in rows) == [("full", "border"), ("windowed", "border"),
                                                                        ("windowed", "mean")]
        with pytest.raises(ValueError, match="no answer records"):
            baselines_from(old, replace(s, max_tokens=8))
    finally:
        eng.close()
    # the torch speculator's arm: its own journal key, the same baselines, its own report row
    torch_s = replace(s, speculator_impl="torch")
    assert torch_s.key("answer") != s.key("answer") and replace(s, speculator_impl="llama").key("answer") == s.key("answer")
    assert set(baselines_from(old, torch_s)) == set(reuse)
    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, n_threads=2, speculator_impl="torch"))
    try:
        run_answer(eng, torch_s, Journal(tmp_path / "torch.jsonl", torch_s), baselines=reuse, baselines_path=str(old))
    finally:
        eng.close()
    spec = [r for r in read_journal(tmp_path / "torch.jsonl") if "specprefill" in r]
    assert spec and all(r["key"]["score_math"] == "torch-speculator" for r in spec)
    rows = build_report([new, tmp_path / "torch.jsonl"])["answer"]
    assert sorted(r.get("speculator_impl", "llama") for r in rows) == ["llama", "torch"]


def test_journals_hold_the_full_evidence_key(tiny_models, tmp_path):
    """Issue 47 item 3: answer and group records hold every EvidenceKey field the specprefill run ran with
    (resolved: a 600-token window on a ~1,200-token document is two windows) and the document's hash, so
    `specq evidence build` makes a row from them with nothing filled from defaults."""
    from specq.bench.evidence_build import build_row
    from specq.bench.quality import Journal, QualitySettings, run_answer, run_group
    from specq.engine.policy.evidence_key import FIELDS, EvidenceKey
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, n_threads=2, cache_bytes=256 << 20))
    try:
        s = QualitySettings(lengths=[1200], n=3, family=3, window=600, max_tokens=4, chunk=16)
        run_answer(eng, s, Journal(tmp_path / "a.jsonl", s))
        run_group(eng, s, Journal(tmp_path / "g.jsonl", s))
    finally:
        eng.close()
    for name, half in (("a.jsonl", "specprefill"), ("g.jsonl", "group")):
        recs = [r for r in read_journal(tmp_path / name) if half in r]
        assert recs
        for r in recs:
            key = EvidenceKey.from_dict(r["key"])
            assert set(FIELDS) <= set(r["key"]) and len(r["doc_sha256"]) == 64
            assert (key.scorer, key.window, key.chunk, key.keep, key.positions, key.prompt_shape, key.task) == (
                "windowed", 600, 16, 0.3, "original", "native", "lookup")  # (the lookup kinds declare `lookup`)
    src = dict(journal="a.jsonl", length=1200, commit="test", where="test", one_pass=True)
    row = build_row(src, root=tmp_path)
    assert row["provenance"]["filled"] == {} and "notes" not in row["provenance"]
    assert all(len(d) == 64 for d in row["documents"])
    group = build_row({**src, "journal": "g.jsonl", "arm": "group", "paired_with": "a.jsonl"}, root=tmp_path)
    assert group["provenance"]["filled"] == {} and group["key"] == row["key"]
