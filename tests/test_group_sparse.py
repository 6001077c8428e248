"""Group-sparse prefill (#17 item 4, engine/group_sparse.py) on tiny random-weight models (CPU): each
question's answer equals a single run forced to the group's union, the union's kept fraction, the
fallbacks, and a group of one."""

from __future__ import annotations

import dataclasses

import pytest

from specq.engine.group_sparse import forced_kept
from specq.engine.options import EngineOptions, RunParams
from specq.engine.pipeline import Engine

#: engine tests: counted by .ci/check_suites.py (a run where all of them skipped fails CI)
pytestmark = [pytest.mark.engine]

DOC = "".join(f"line {i}: the value of item_{i} is {(i * 7919) % 1000}; " + ("note. " if i % 5 == 0 else "")
              for i in range(60))
QUESTIONS = ["What is the value of item_3?", "Which item has the largest value?", "Sum items 1 to 4."]


@pytest.fixture(scope="module")
def engine(tiny_models):
    """Batch-invariant target numerics (a prefill split into the union and a tail gives the logits of one
    call); call_tokens 4096: a single run's prefill is one call; one thread (the CI box is shared)."""
    e = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                             n_ctx=4096, n_threads=1, cache_bytes=64 << 20, call_tokens=4096, batch_invariant="on"))
    yield e
    e.close()


def _params(**kw) -> RunParams:
    # sampled (temperature 1, fixed seed) so that the answers are not one repeated token: a sampled
    # sequence only matches when the logits do
    base = dict(mode="specprefill", min_tokens=0, window=256, max_tokens=6, keep=0.3, chunk=16, temperature=1.0,
                seed=7, ignore_eos=True)
    base.update(kw)
    return RunParams(**base)


@pytest.mark.parametrize("layout", ["rollback", "restore"])
def test_each_answer_equals_a_single_run_forced_to_the_union(engine, layout):
    params = _params()
    results = engine.run_group(DOC, QUESTIONS, params, scope="t", layout=layout)
    assert [r.group["index"] for r in results] == [0, 1, 2]
    for q, r in zip(QUESTIONS, results):
        assert r.spec.mode == "specprefill" and "fallback" not in r.group and r.group["layout"] == layout
        single = engine.run(DOC, dataclasses.replace(params, question=q), scope="t", _kept=r.kept_indices)
        assert single.kept_indices == r.kept_indices
        assert r.tokens == single.tokens and len(r.tokens) == 6
        assert r.usage.kept_tokens == len(r.kept_indices) and r.usage.prompt_tokens == single.usage.prompt_tokens
        # shared work is recorded as shared, once per group
        assert r.timings_ms["group_prefill"] == results[0].timings_ms["group_prefill"] > 0
        assert r.group["shared_ms"]["group_prefill"] == round(r.timings_ms["group_prefill"], 3)
        assert r.timings_ms["sparse_prefill"] == r.timings_ms["tail_prefill"]
        assert r.timings_ms["ttft"] <= r.timings_ms["total"] <= r.group["wall_ms"]
    # questions 2.. restored the document's speculator windows
    assert all(r.spec.cache["speculator"]["hits"] == r.spec.windows for r in results[1:])


def test_union_fraction_covers_each_question(engine):
    params = _params()
    results = engine.run_group(DOC, QUESTIONS, params, scope="t")
    union = results[0].group["union_kept_fraction"]
    assert all(r.group["union_kept_fraction"] == union for r in results)
    for q, r in zip(QUESTIONS, results):
        assert r.group["own_kept_fraction"] <= union <= 1.0
        # own selection = what a plain specprefill run keeps; the union contains it
        plain = engine.run(DOC, dataclasses.replace(params, question=q), scope="t")
        assert set(plain.kept_indices) <= set(r.kept_indices)
        prompt = engine.tokenize_prompt(DOC, dataclasses.replace(params, question=q))
        own_doc = [i for i in plain.kept_indices if prompt.doc_start <= i < prompt.doc_end]
        assert r.group["own_kept_tokens"] == len(own_doc)
        assert r.kept_indices == forced_kept(prompt, [i for i in r.kept_indices if prompt.doc_start <= i < prompt.doc_end])


def test_different_document_tokens_fall_back(engine, monkeypatch):
    original = engine.tokenize_prompt

    def tokenize(document, params, **kw):  # question 2 sees a longer document
        return original(document + (" extra." if params.question == QUESTIONS[1] else ""), params, **kw)

    monkeypatch.setattr(engine, "tokenize_prompt", tokenize)
    params = _params()
    results = engine.run_group(DOC, QUESTIONS, params, scope="t")
    for j, (q, r) in enumerate(zip(QUESTIONS, results)):
        assert "document tokens differ" in r.group["fallback"] and r.group["index"] == j
        assert any("ran as separate runs" in w for w in r.warnings)
        plain = engine.run(DOC, dataclasses.replace(params, question=q), scope="t")
        assert r.tokens == plain.tokens and r.kept_indices == plain.kept_indices


@pytest.mark.parametrize("kw,why", [(dict(mode="baseline"), "mode baseline"), (dict(draft="model"), "draft model"),
                                    (dict(min_tokens=100000), "ran baseline")])
def test_other_modes_fall_back_with_a_reason(engine, kw, why):
    results = engine.run_group(DOC, QUESTIONS[:2], _params(max_tokens=2, **kw), scope="t")
    assert len(results) == 2 and all(why in r.group["fallback"] for r in results)


def test_a_group_of_one_is_a_plain_specprefill_run(engine):
    params = _params()
    (r,) = engine.run_group(DOC, QUESTIONS[:1], params, scope="t")
    plain = engine.run(DOC, dataclasses.replace(params, question=QUESTIONS[0]), scope="t")
    assert r.kept_indices == plain.kept_indices and r.tokens == plain.tokens
    assert r.group["union_kept_fraction"] == r.group["own_kept_fraction"]
    assert engine.run_group(DOC, [], params) == []


def test_bench_group_rows(engine):
    """`specq bench group`'s three strategies on one small row: every strategy answered every question,
    and the group path's target prefill is head + union + the tails (less than k separate runs' total)."""
    from specq.bench.group import STRATEGIES, run_group_bench

    report = run_group_bench(engine, [400], [2], keep=0.3, chunk=16, window=256, max_tokens=2, reps=1)
    (row,) = report["rows"]
    assert row["group_size"] == 2 and all(len(row[s]["ttft_ms"]) == 2 for s in STRATEGIES)
    g, sep, full = row["group"], row["separate"], row["full+cache"]
    assert not g["fallback"] and g["own_kept_fraction_mean"] <= g["union_kept_fraction"] <= 1.0
    assert g["target_prefilled_tokens"] <= sep["target_prefilled_tokens"] and full["target_prefilled_tokens"] > 0
    assert "code" in report["provenance"] and report["note"].startswith("tiny")


def test_compressed_positions_and_greedy(engine):
    """positions compressed (what a stock llama.cpp runs): the union renumbered 0..U-1, each tail after
    it; greedy answers equal the forced-union single runs."""
    params = _params(positions="compressed", temperature=0.0)
    results = engine.run_group(DOC, QUESTIONS[:2], params, scope="t")
    for q, r in zip(QUESTIONS, results):
        assert r.spec.positions == "compressed" and "fallback" not in r.group
        single = engine.run(DOC, dataclasses.replace(params, question=q), scope="t", _kept=r.kept_indices)
        assert r.tokens == single.tokens
