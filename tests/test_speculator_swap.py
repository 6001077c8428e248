"""A speculator swap's evidence: scripts/kept_overlap.py (Jaccard of two sides' kept chunks, from saved
scores) and the speculator-swap table (specq/bench/speculator_swap.py) on small files written here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from specq.bench import speculator_swap
from specq.engine import models
from specq.engine.scoring.selection import select_kept

REPO = Path(__file__).resolve().parents[1]


def _kept_overlap():
    spec = importlib.util.spec_from_file_location("kept_overlap", REPO / "scripts" / "kept_overlap.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _save(directory: Path, task: str, scores: np.ndarray, ev: list[int], document: str = "doc") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(directory / f"{task}-windowed.npz", scores=scores.astype(np.float32), windows=1,
                        evidence_chunks=np.asarray(ev, dtype=np.int64), chunk=4, document=np.array(document))


def test_kept_overlap_is_the_jaccard_of_the_engines_kept_chunks(tmp_path):
    ko = _kept_overlap()
    rng = np.random.default_rng(0)
    a = rng.random(40)  # 10 chunks of 4 tokens; keep 0.3 keeps 3
    same, moved = a.copy(), a.copy()
    top = [int(c) for c in np.argsort(-a.reshape(10, 4).mean(axis=1), kind="stable")[:3]]
    moved[top[0] * 4 : top[0] * 4 + 4] = -1.0  # one kept chunk falls out, another comes in
    _save(tmp_path / "a", "t0", a, [top[0]])
    _save(tmp_path / "a", "t1", a, [top[1]])
    _save(tmp_path / "b", "t0", same, [top[0]])
    _save(tmp_path / "b", "t1", moved, [top[1]])
    out = tmp_path / "overlap.json"
    assert ko.main([str(tmp_path / "a"), str(tmp_path / "b"), "--rules", "mean", "--labels", "x,y", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    r = rep["by_rule"][0]
    assert r["per_task_jaccard"] == {"t0": 1.0, "t1": 0.5}  # 2 shared of 4 chunks in the union
    assert r["jaccard"]["min"] == 0.5 and r["jaccard"]["share_ge_0.9"] == 0.5
    assert r["evidence_recall"] == {"a": 1.0, "b": 1.0}
    # the kept set is select_kept's, whatever the rule
    kept = {i // 4 for i in select_kept(moved, doc_start=0, n_prompt=40, protected=(), keep=0.3, chunk=4, rule="mean")}
    assert ko.kept_chunks(moved, 4, 0.3, "mean") == kept and top[0] not in kept


def test_speculator_swap_table_pairs_a_journal_with_the_one_it_reused(tmp_path):
    root = tmp_path / "bench" / "results"
    root.mkdir(parents=True)
    ref = root / "ref-answer.jsonl"
    rows = [{"half": "answer", "task": f"t{i}", "settings": {"chunk_rule": "border"}, "closed_book": {"correct": False},
             "baseline": {"correct": True}, "specprefill": {"correct": i != 0}} for i in range(3)]
    ref.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sha = models.REGISTRY["qwen2.5-coder-0.5b-instruct-q4_0"].sha256
    new = [{**r, "baseline": {"correct": True, "reused_from": "bench/results/ref-answer.jsonl"},
            "specprefill": {"correct": i != 2}, "key": {"speculator_sha256": sha}} for i, r in enumerate(rows)]
    (root / "cand-answer.jsonl").write_text("".join(json.dumps(r) + "\n" for r in new))
    (root / "quality-x-overlap-4000.json").write_text(json.dumps({
        "a": {"speculator": "p"}, "b": {"speculator": "q"},
        "by_rule": [{"rule": "border", "keep": 0.3, "tasks": 3, "evidence_recall": {"a": 1.0, "b": 0.5},
                     "jaccard": {"min": 0.8, "p10": 0.85, "median": 0.95, "mean": 0.93, "share_ge_0.9": 2 / 3}}]}))
    answers = speculator_swap.answer_rows(root, tmp_path / "docs", tmp_path)
    assert len(answers) == 1
    row = answers[0]
    assert row[1] == "qwen2.5-coder-0.5b-instruct-q4_0" and row[3] == "border"
    assert row[4:] == ["3", "3", "2", "**2**", "1 / 1"]
    assert row[0] == "[cand-answer.jsonl](../bench/results/cand-answer.jsonl)"
    # the default speculator's file run by the PyTorch forward is a candidate too; run by llama.cpp it is the reference
    default = models.REGISTRY[models.DEFAULT_SPECULATOR].sha256
    for name, math in (("torch-answer.jsonl", "torch-speculator"), ("same-answer.jsonl", "numpy")):
        (root / name).write_text("".join(json.dumps({**r, "key": {"speculator_sha256": default, "score_math": math}}) + "\n"
                                         for r in new))
    labels = sorted(r[1] for r in speculator_swap.answer_rows(root, tmp_path / "docs", tmp_path))
    assert labels == sorted([f"{models.DEFAULT_SPECULATOR} (torch speculator)", "qwen2.5-coder-0.5b-instruct-q4_0"])
    overlap = speculator_swap.overlap_rows(root, tmp_path / "docs")
    assert overlap == [["[quality-x-overlap-4000.json](../bench/results/quality-x-overlap-4000.json)", "p → q", "border",
                        "0.3", "3", "**0.800**", "0.850", "0.950", "0.930", "67%", "1.000 → 0.500"]]
