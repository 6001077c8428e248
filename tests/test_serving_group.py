"""Group-sparse prefill in the serving loop (engine/serving/groups.py): specprefill questions about one
document in the loop together share one sparse prefill of the target.

Tiny random-weight models on the CPU, one llama.cpp thread, batch-invariant target: each member's
answer must equal, token for token, a single run forced to head + union + its own tail
(Engine.run(_kept=...)), which is what group_sparse.run_group is checked against too."""

from __future__ import annotations

import dataclasses
import threading

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from specq.contracts import RunCancelled  # noqa: E402

from serving_text import DOC, DOC2, loop_engine, scorer_params  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

QUESTIONS = ["Who holds the copyright?", "What does the license permit?", "Which version is it?",
             "Is there a warranty?"]


def _params(question: str, **kw):
    # sampled (fixed seed): a sampled answer only matches when the logits do
    return scorer_params(question, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def engine(tiny_models):
    eng = loop_engine(tiny_models, slots=4, n_ctx=4096)
    yield eng
    eng.close()


def _loop(engine, **kw):
    from specq.engine.serving.loop import ServingEngine

    return ServingEngine(engine, **{"group_sparse": True, **kw}).start()  # on: it is opt-in


def _forced_alone(engine, doc, result, question, **kw):
    engine.cache_store.clear()
    return engine.run(doc, _params(question, **kw), scope="t", _kept=result.kept_indices)


@pytest.mark.parametrize("score_thread", ["off", "on"])
def test_questions_together_share_one_union_prefill(engine, score_thread):
    """score_thread on: the GPU default (mates are scored one at a time on the score thread while the
    first waits); off: the CPU default (scored on the loop's thread). One member drafts with n-grams."""
    engine.cache_store.clear()
    loop = _loop(engine, score_thread=score_thread)
    try:
        handles = [loop.submit(DOC, _params(q, **({"draft": "ngram"} if i == 2 else {})), scope="t")
                   for i, q in enumerate(QUESTIONS)]
        results = [h.result(600) for h in handles]
        stats = loop.stats()
    finally:
        loop.close()
    assert stats["groups_formed"] == 1 and stats["group_copies"] == 3
    assert (stats["scored_beside"] == 4) == (score_thread == "on"), stats
    groups = [r.group for r in results]
    assert sorted(g["index"] for g in groups) == [0, 1, 2, 3]
    assert all(g["size"] == 4 and g["layout"] == "slots" for g in groups)
    union = groups[0]["union_kept_tokens"]
    assert all(g["union_kept_tokens"] == union for g in groups)
    assert all(0 < g["own_kept_tokens"] <= union < g["document_tokens"] for g in groups)
    first = [g for g in groups if g["union_from"] == "own prefill"]
    assert len(first) == 1  # one member computed the union; the other three copied it
    for r, g in zip(results, groups):
        assert len(r.kept_indices) == r.usage.kept_tokens
        if g["union_from"] == "own prefill":
            assert g["prefilled_tokens"] == r.usage.kept_tokens
        else:
            assert g["union_from"].startswith("slot ")
            # only its own question + template tail: the head and the union came from another slot
            assert 0 < g["prefilled_tokens"] < r.usage.kept_tokens - union
        assert r.timings_ms["group_wait"] >= 0
    # every answer = a single run forced to head + union + its own tail
    for i, (q, r) in enumerate(zip(QUESTIONS, results)):
        single = _forced_alone(engine, DOC, r, q, **({"draft": "ngram"} if i == 2 else {}))
        assert single.kept_indices == r.kept_indices
        assert r.tokens == single.tokens and len(r.tokens) == 6


def test_each_member_keeps_at_least_its_own_selection(engine):
    """The union holds every chunk the member's own selection (a plain specprefill run) keeps."""
    engine.cache_store.clear()
    loop = _loop(engine)
    try:
        results = [h.result(600) for h in [loop.submit(DOC, _params(q), scope="t") for q in QUESTIONS[:2]]]
        engine.cache_store.clear()
        plain = [engine.run(DOC, _params(q), scope="t") for q in QUESTIONS[:2]]
    finally:
        loop.close()
    for q, r, p in zip(QUESTIONS, results, plain):
        assert set(p.kept_indices) <= set(r.kept_indices)
        prompt = engine.tokenize_prompt(DOC, _params(q))
        own = [i for i in p.kept_indices if prompt.doc_start <= i < prompt.doc_end]
        assert r.group["own_kept_tokens"] == len(own)


def test_other_documents_tenants_and_off_do_not_group(engine):
    engine.cache_store.clear()
    loop = _loop(engine)
    try:
        handles = [loop.submit(DOC, _params(QUESTIONS[0]), scope="t"),
                   loop.submit(DOC2, _params(QUESTIONS[1]), scope="t"),   # another document
                   loop.submit(DOC, _params(QUESTIONS[2]), scope="u"),    # another tenant
                   loop.submit(DOC, _params(QUESTIONS[3], draft="model"), scope="t")]  # a drafter group-sparse does not serve
        results = [h.result(600) for h in handles]
        assert loop.stats()["groups_formed"] == 0
    finally:
        loop.close()
    assert all(r.group is None for r in results)
    engine.cache_store.clear()
    off = _loop(engine, group_sparse=False)
    try:
        results = [h.result(600) for h in [off.submit(DOC, _params(q), scope="t") for q in QUESTIONS[:2]]]
        assert off.stats()["groups_formed"] == 0
    finally:
        off.close()
    assert all(r.group is None for r in results)


def _auto(question: str):
    return _params(question, mode="auto", min_tokens=-1)


def _auto_group(engine, questions, **submit):
    """`questions` about DOC (a stored document of tenant "t") submitted at once to a fresh loop with empty
    caches, in mode auto: (results, the loop's groups_formed)."""
    engine.cache_store.clear()
    loop = _loop(engine)
    try:
        handles = [loop.submit(DOC, _auto(q), scope="t", reused_document=True, **submit) for q in questions]
        return [h.result(600) for h in handles], loop.stats()["groups_formed"]
    finally:
        loop.close()


def test_auto_runs_a_stored_documents_questions_together_as_one_group(engine):
    """Mode auto's rule 1a (engine/policy/auto.py): questions about a stored document submitted together (a
    worker's group claim says how many: `group_hint`) run specprefill as one group-sparse prefill, each
    answer the forced single run's, and a later question about that document stays on that path; the
    same questions one at a time take rule 1b (baseline, then a prompt-cache hit), and so does a group
    with the rule off (auto_group_min_tokens -1)."""
    opts = engine.options
    saved = (opts.auto_min_tokens, opts.auto_quality_min_tokens, opts.auto_group_min_tokens)
    opts.auto_min_tokens, opts.auto_quality_min_tokens, opts.auto_group_min_tokens = 64, 0, 64
    try:
        engine.cache_store.clear()
        loop = _loop(engine)
        try:
            handles = [loop.submit(DOC, _auto(q), scope="t", reused_document=True, group_hint=4) for q in QUESTIONS]
            together = [h.result(600) for h in handles]
            assert loop.stats()["groups_formed"] == 1
            # a later question alone stays on its document's path: specprefill on the cached windows, not a
            # full prefill (the document is not in the prompt cache); another tenant's takes rule 1b
            later = loop.submit(DOC, _auto("Who wrote it?"), scope="t", reused_document=True).result(600)
            other = loop.submit(DOC, _auto("Who wrote it?"), scope="u", reused_document=True).result(600)
        finally:
            loop.close()
        assert later.spec.mode == "specprefill" and "earlier questions ran as a group" in later.spec.reason, later.spec
        assert later.spec.cache["speculator"]["hits"] > 0 and later.spec.cache["speculator"]["misses"] == 0
        assert other.spec.mode == "baseline" and "stored document: a full prefill" in other.spec.reason
        for q, r in zip(QUESTIONS, together):
            assert r.spec.mode == "specprefill", r.spec
            assert r.spec.reason.startswith("auto: group of 4 questions about a stored document: one group-sparse "
                                            "prefill"), r.spec.reason
            assert r.group["size"] == 4
            single = _forced_alone(engine, DOC, r, q)
            assert r.tokens == single.tokens and len(r.tokens) == 6

        engine.cache_store.clear()
        loop = _loop(engine)
        try:
            alone = [loop.submit(DOC, _auto(q), scope="t", reused_document=True).result(600) for q in QUESTIONS[:2]]
        finally:
            loop.close()
        assert alone[0].spec.mode == "baseline" and "stored document: a full prefill" in alone[0].spec.reason
        assert alone[1].spec.mode == "baseline" and "prompt cache hit" in alone[1].spec.reason
        assert all(r.group is None for r in alone)

        opts.auto_group_min_tokens = -1
        off, formed = _auto_group(engine, QUESTIONS, group_hint=4)
        assert formed == 0 and [r.spec.mode for r in off] == ["baseline"] * 4
        assert all("stored document" in r.spec.reason or "prompt cache hit" in r.spec.reason for r in off)
    finally:
        opts.auto_min_tokens, opts.auto_quality_min_tokens, opts.auto_group_min_tokens = saved
        engine.cache_store.clear()


def test_a_cancelled_union_prefill_is_taken_over(engine):
    """The member prefilling head + union is cancelled during it: another member prefills the union
    itself, and every answer is still the forced single run's."""
    engine.cache_store.clear()
    loop = _loop(engine, prefill_chunk=32)
    handles = []
    cancelled = threading.Event()

    def progress_of(i):
        def report(phase, done, total):
            # the first member to start its prefill is the one computing the union: cancel it there
            if phase == "sparse_prefill" and done == 0 and not cancelled.is_set():
                cancelled.set()
                handles[i].cancel()
        return report

    try:
        for i, q in enumerate(QUESTIONS[:3]):
            handles.append(loop.submit(DOC, _params(q), progress_of(i), scope="t"))
        outcomes = []
        for h in handles:
            try:
                outcomes.append(h.result(600))
            except RunCancelled:
                outcomes.append(None)
    finally:
        loop.close()
    assert outcomes.count(None) == 1
    done = [(q, r) for q, r in zip(QUESTIONS, outcomes) if r is not None]
    assert len(done) == 2
    assert sorted(r.group["union_from"] == "own prefill" for _, r in done) == [False, True]
    for q, r in done:
        single = _forced_alone(engine, DOC, r, q)
        assert r.tokens == single.tokens


def _loop_results(eng, questions):
    loop = _loop(eng)
    try:
        return [h.result(600) for h in [loop.submit(DOC, _params(q, chunk=8), scope="t") for q in questions]]
    finally:
        loop.close()


def test_emulated_union_is_injected_by_the_benchmark(tiny_models, monkeypatch):
    """The bench's selection emulation (specq/testing/emulated_selection.py, random-weight benchmarks
    only) is a seam the benchmark injects, `Engine(select_override=...)`: K questions' emulated
    selections keep as many chunks as their own and cover about U of the document, and the result says
    the selection was emulated. SPECQ_BENCH_UNION in the environment changes nothing: production code
    never reads it."""
    from specq.testing.emulated_selection import EmulatedUnion

    monkeypatch.setenv("SPECQ_BENCH_UNION", "0.5:4")
    plain = loop_engine(tiny_models, slots=4, n_ctx=4096)
    try:
        assert plain.select_override is None
        results = _loop_results(plain, QUESTIONS)
    finally:
        plain.close()
    assert not any("EMULATED" in r.spec.reason for r in results)
    monkeypatch.delenv("SPECQ_BENCH_UNION")

    eng = loop_engine(tiny_models, slots=4, n_ctx=4096, select_override=EmulatedUnion.parse("0.5:4"))
    try:
        results = _loop_results(eng, QUESTIONS)
    finally:
        eng.close()
    assert all("EMULATED" in r.spec.reason and "0.5:4" in r.spec.reason for r in results)
    g = results[0].group
    assert g["size"] == 4 and all(r.group["union_kept_tokens"] == g["union_kept_tokens"] for r in results)
    assert 0.4 <= g["union_kept_fraction"] <= 0.55
    assert all(abs(r.group["own_kept_fraction"] - 0.3) < 0.05 for r in results)
    for bad in ("2:1", "0.5", "x:4", "0:4"):
        with pytest.raises(ValueError, match="U:K"):
            EmulatedUnion.parse(bad)


def test_auto_questions_on_an_inline_document_never_join_a_group(engine):
    """Issue 47 item 6: with group-sparse prefill on, two mode-auto questions on one inline document (no
    document_id: rule 1a never applies) that rule 3 sends to specprefill run their own kept chunks, not one
    group-sparse prefill (which the group rows do not vouch for); each reason says what ran."""
    opts = engine.options
    saved = (opts.auto_min_tokens, opts.auto_quality_min_tokens)
    opts.auto_min_tokens, opts.auto_quality_min_tokens = 64, 0  # the operator's override: rule 3 says specprefill
    try:
        engine.cache_store.clear()
        loop = _loop(engine)
        try:
            handles = [loop.submit(DOC, _auto(q), scope="t") for q in QUESTIONS[:2]]
            results = [h.result(600) for h in handles]
            formed = loop.stats()["groups_formed"]
        finally:
            loop.close()
        assert formed == 0 and all(r.group is None for r in results)
        for r in results:
            assert r.spec.mode == "specprefill" and r.spec.reason.startswith("auto: one-off long document"), r.spec
            assert "operator override" in r.spec.reason
    finally:
        opts.auto_min_tokens, opts.auto_quality_min_tokens = saved
        engine.cache_store.clear()
