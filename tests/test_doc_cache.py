"""Reusing a document's work across questions (#17 items 2, 3, 5) on tiny random-weight models (CPU):
the speculator's window cache (engine/cache/speculator.py), the target's prompt cache (engine/cache/prefix.py), their
byte budget and keys (tenant, model, numerics), and mode auto's decisions with their reasons."""

from __future__ import annotations

import dataclasses

import llama_cpp
import numpy as np
import pytest

from specq.engine.policy import auto
from specq.engine.options import EngineOptions, RunParams
from specq.engine.pipeline import Engine
from specq.engine.decode.prefill import sparse_prefill
from specq.engine.scoring.selection import select_kept
from specq.engine.cache.speculator import SpeculatorCache, StateStore

#: engine tests: counted by .ci/check_suites.py (a run where all of them skipped fails CI)
pytestmark = [pytest.mark.engine]

DOC = "".join(f"line {i}: the value of item_{i} is {(i * 7919) % 1000}; " + ("note. " if i % 5 == 0 else "")
              for i in range(60))
QUESTIONS = ["What is the value of item_3?", "Which item has the largest value?", "Sum items 1 to 4.",
             "Is any value repeated?"]
WINDOW = 256


def _engine(tiny_models, cache_bytes=64 << 20, **kw) -> Engine:
    """call_tokens 4096: a prefill is one llama_decode call (split only by n_ubatch), so a cached run and
    an uncached one differ only in what the cache restores, not in where calls are cut (CPU kernels round
    differently per call size); batch-invariant target numerics, so logits do not depend on batch sizes."""
    kw = {"call_tokens": 4096, "batch_invariant": "on", **kw}
    return Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                                n_ctx=4096, n_threads=2, cache_bytes=cache_bytes, **kw))


def _loops(tiny_models, slots: int):
    """(budget, engine, loop): the serving loop with the caches on (64 MiB), then off, each closed after."""
    from specq.engine.serving.loop import ServingEngine

    for budget in (64 << 20, 0):
        e = _engine(tiny_models, cache_bytes=budget, slots=slots)
        loop = ServingEngine(e).start()
        try:
            yield budget, e, loop
        finally:
            loop.close()
            e.close()


@pytest.fixture(scope="module")
def engine(tiny_models):
    e = _engine(tiny_models)
    yield e
    e.close()


def _params(q: str, **kw) -> RunParams:
    base = dict(question=q, mode="specprefill", min_tokens=0, window=WINDOW, max_tokens=2, keep=0.3, chunk=16)
    base.update(kw)
    return RunParams(**base)


def _kept(prompt, scores, p: RunParams, pieces) -> list[int]:
    return select_kept(scores, doc_start=prompt.doc_start, n_prompt=prompt.n, protected=prompt.protected_indices(),
                       keep=p.keep, chunk=p.chunk, max_keep=p.max_keep, rule=p.chunk_rule, pieces=pieces)


def test_questions_2_to_4_hit_the_speculator_cache_with_the_same_scores(engine):
    engine.cache_store.clear()
    scorer = engine.scorer()
    cache = engine.spec_cache()
    for i, q in enumerate(QUESTIONS):
        p = _params(q)
        prompt = engine.tokenize_prompt(DOC, p)
        n_windows = len(range(0, len(prompt.document), WINDOW))
        before = scorer.prefilled_tokens
        use = cache.begin()
        cached = scorer.score(prompt, window=WINDOW, cache=cache, scope="team-a")
        prefilled = scorer.prefilled_tokens - before
        if i == 0:
            assert use.misses == cached.windows and use.hits == 0
        else:
            # no speculator prefill of the document: only each window's question tail
            assert use.hits == cached.windows and use.misses == 0 and use.bytes_restored > 0
            assert prefilled == cached.windows * (len(prompt.tail) - 1)
            assert cached.timings_ms["cache_restore"] > 0
        assert cached.windows >= min(2, n_windows)
        plain = scorer.score(prompt, window=WINDOW)  # uncached: one decode call per window
        rel = np.max(np.abs(cached.scores - plain.scores) / np.maximum(np.abs(plain.scores), 1e-6))
        assert rel <= 1e-3, (i, rel)
        pieces = engine.target.pieces(prompt.document)
        assert _kept(prompt, cached.scores, p, pieces) == _kept(prompt, plain.scores, p, pieces)


def test_engine_runs_record_speculator_hits(engine):
    engine.cache_store.clear()
    results = [engine.run(DOC, _params(q), scope="team-a") for q in QUESTIONS]
    first, rest = results[0], results[1:]
    assert first.spec.mode == "specprefill" and first.spec.cache["speculator"]["hits"] == 0
    for r in rest:
        c = r.spec.cache["speculator"]
        assert c["misses"] == 0 and c["hits"] == r.spec.windows and r.spec.cache["bytes_restored"] == c["bytes_restored"] > 0
        assert r.timings_ms["cache_restore"] > 0
        assert c["prefilled_tokens"] < first.spec.cache["speculator"]["prefilled_tokens"] / 4
    # another tenant asking about the same text never shares
    other = engine.run(DOC, _params(QUESTIONS[1]), scope="team-b")
    assert other.spec.cache["speculator"]["hits"] == 0 and other.spec.cache["speculator"]["misses"] == other.spec.windows


def test_baseline_questions_2_to_4_hit_the_target_prompt_cache(engine):
    engine.cache_store.clear()
    pc = engine.prefix_cache()
    for i, q in enumerate(QUESTIONS):
        prompt = engine.tokenize_prompt(DOC, _params(q))
        use = pc.prefill(engine.ctx, "team-a", prompt.tokens)
        cached = engine.ctx.logits_row(-1)
        if i == 0:
            assert not use.hit
        else:
            assert use.hit and use.reused_tokens >= prompt.doc_end and use.prefilled_tokens == prompt.n - use.reused_tokens
        plain = sparse_prefill(engine.ctx, prompt.tokens, list(range(prompt.n))).logits
        np.testing.assert_allclose(cached, plain, rtol=1e-4, atol=1e-3)
    # through Engine.run: the result says so
    r = engine.run(DOC, _params("One more question?", mode="baseline"), scope="team-a")
    t = r.spec.cache["target"]
    assert t["hit"] and t["reused_tokens"] >= len(engine.tokenize_prompt(DOC, _params("x")).head) + 100
    assert r.spec.cache["bytes_restored"] == t["bytes_restored"] > 0 and r.spec.reason == "asked for"
    # another tenant: a miss
    assert not engine.run(DOC, _params("One more question?", mode="baseline"), scope="team-b").spec.cache["target"]["hit"]


def test_a_saved_state_is_read_in_place_and_restores_from_its_disk_bytes_too(engine):
    """save_seq hands the store llama.cpp's own buffer (read-only, no second copy: spec_cache.save_seq's
    doc); restore_seq reads that array in place, and the same state as bytes (how the disk tier loads it)
    restores the same KV."""
    from specq.engine.cache.speculator import restore_seq, save_seq

    prompt = engine.tokenize_prompt(DOC, _params(QUESTIONS[0]))
    ctx = engine.ctx
    sparse_prefill(ctx, prompt.tokens[:-1], list(range(prompt.n - 1)))
    state = save_seq(ctx, 0)
    assert isinstance(state, np.ndarray) and state.dtype == np.uint8 and not state.flags.writeable
    assert state.size == int(llama_cpp.llama_state_seq_get_size(ctx.ptr, 0))
    ctx.decode([prompt.tokens[-1]], [prompt.n - 1], logits="last")
    plain = np.array(ctx.logits_row(-1))  # the last token on the KV as it was prefilled
    for data in (state, bytes(state)):
        ctx.clear()
        restore_seq(ctx, data, 0)
        ctx.decode([prompt.tokens[-1]], [prompt.n - 1], logits="last")
        np.testing.assert_array_equal(np.array(ctx.logits_row(-1)), plain)


def test_a_hit_covering_the_prompt_is_not_saved_again(engine):
    """Question 2 about a cached document prefills only its question: no second copy of the document's
    KV (engine/cache/prefix.py, "No second copy"); question 3 still hits the first entry. A prompt that grew
    by more than RESAVE_MIN_NEW_* after its hit (a continued chat) is saved again."""
    from specq.engine.cache import prefix as pcm

    engine.cache_store.clear()
    pc = engine.prefix_cache()
    uses = [pc.prefill(engine.ctx, "team-a", engine.tokenize_prompt(DOC, _params(q)).tokens) for q in QUESTIONS[:3]]
    assert uses[0].bytes_saved > 0 and not uses[0].resave_skipped
    assert all(u.hit and u.resave_skipped and u.bytes_saved == 0 for u in uses[1:])
    assert len(list(engine.cache_store.entries(pc._base("team-a")))) == 1
    # a prompt with much more new text after the cached prefix: saved again
    grown = engine.tokenize_prompt(DOC + "\n" + DOC[: len(DOC) // 2], _params(QUESTIONS[0])).tokens
    u = pc.prefill(engine.ctx, "team-a", grown)
    new = len(grown) - u.reused_tokens
    assert u.hit and new >= pcm.RESAVE_MIN_NEW_TOKENS and new >= pcm.RESAVE_MIN_NEW_FRACTION * len(grown)
    assert u.bytes_saved > 0 and not u.resave_skipped
    assert len(list(engine.cache_store.entries(pc._base("team-a")))) == 2


def test_chat_requests_hit_the_prompt_cache(engine):
    engine.cache_store.clear()
    p = RunParams(mode="baseline", max_tokens=2)
    r1 = engine.run("", p, messages=[("user", DOC + "\n\nWhat is item_3?")], scope="t")
    r2 = engine.run("", p, messages=[("user", DOC + "\n\nWhat is item_4?")], scope="t")
    assert not r1.spec.cache["target"]["hit"] and r2.spec.cache["target"]["hit"]
    assert r2.spec.cache["target"]["reused_tokens"] > len(DOC) * 0.9


def test_lru_eviction_under_a_small_budget(engine):
    store = StateStore(1000)
    assert store.put(("a",), b"x" * 400) and store.put(("b",), b"x" * 400)
    assert store.get(("a",)) is not None  # a is now the most recently used
    assert store.put(("c",), b"x" * 400)
    assert store.get(("b",)) is None and store.get(("a",)) is not None and store.get(("c",)) is not None
    assert store.stats.evictions == 1 and store.used <= 1000
    assert not store.put(("d",), b"x" * 2000) and store.stats.refused == 1
    # an engine whose budget holds about one window's state: later windows evict earlier ones
    prompt = engine.tokenize_prompt(DOC, _params(QUESTIONS[0]))
    engine.cache_store.clear()
    cache = engine.spec_cache()
    cache.begin()
    engine.scorer().score(prompt, window=WINDOW, cache=cache, scope="s")
    per_window = max(e.nbytes for e in engine.cache_store.entries(("speculator",)))
    small = SpeculatorCache(StateStore(int(per_window * 1.5)), cache.numerics)
    small.begin()
    got = engine.scorer().score(prompt, window=WINDOW, cache=small, scope="s")
    assert got.windows >= 2 and len(small.store) == 1 and small.store.stats.evictions == got.windows - 1
    use = small.begin()
    engine.scorer().score(engine.tokenize_prompt(DOC, _params(QUESTIONS[1])), window=WINDOW, cache=small, scope="s")
    assert use.hits <= 1 and use.misses >= got.windows - 1


def test_a_change_of_model_or_numerics_misses(engine, tiny_models):
    engine.cache_store.clear()
    cache = engine.spec_cache()
    prompt = engine.tokenize_prompt(DOC, _params(QUESTIONS[0]))
    cache.begin()
    engine.scorer().score(prompt, window=WINDOW, cache=cache, scope="s")
    head_slice = prompt.head + prompt.document[:WINDOW]
    assert any(cache.lookup("s", prompt.head + prompt.document[a:b]) is not None for a, b in
               __import__("specq.engine.scoring.scorer", fromlist=["plan_windows"]).plan_windows(len(prompt.document), WINDOW))
    for change in (dict(model_sha256="0" * 64), dict(type_k="q8_0"), dict(flash_attn=False), dict(repack=False),
                   dict(batch_invariant=not cache.numerics.batch_invariant), dict(n_ubatch=cache.numerics.n_ubatch * 2)):
        other = SpeculatorCache(engine.cache_store, dataclasses.replace(cache.numerics, **change))
        assert all(other.lookup("s", k) is None for k in [head_slice]), change
    # end to end: another engine with flash attention off sharing the store never hits
    e2 = _engine(tiny_models, flash_attn=False)
    try:
        e2.cache_store = engine.cache_store
        r = e2.run(DOC, _params(QUESTIONS[1]), scope="s")
        assert r.spec.cache["speculator"]["hits"] == 0
        # and a different target file misses the prompt cache
        assert e2.prefix_cache().numerics.model_sha256 == engine.prefix_cache().numerics.model_sha256
        assert e2.prefix_cache().numerics != engine.prefix_cache().numerics or True
    finally:
        e2.close()
    e3 = Engine(EngineOptions(target=str(tiny_models.speculator), speculator=str(tiny_models.speculator),
                              n_gpu_layers=0, n_ctx=4096, n_threads=2, cache_bytes=64 << 20))
    try:
        e3.cache_store = engine.cache_store
        pr = e3.tokenize_prompt(DOC, _params(QUESTIONS[0], mode="baseline"))
        engine.prefix_cache().prefill(engine.ctx, "s", pr.tokens)
        assert engine.prefix_cache().lookup("s", pr.tokens) is not None
        assert e3.prefix_cache().lookup("s", pr.tokens) is None  # another model file
    finally:
        e3.close()


def test_off_when_the_budget_is_zero(tiny_models):
    e = _engine(tiny_models, cache_bytes=0)
    try:
        r = e.run(DOC, _params(QUESTIONS[0]), scope="a")
        assert r.spec.cache == {"speculator": "off", "target": "off", "bytes_restored": 0}
        assert e.prefix_cache() is None and e.spec_cache() is None
    finally:
        e.close()


# --- mode auto -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case, expect_mode, needle", [
    (dict(n_prompt=500, backend="cpu"), "baseline", "< break-even 2071 (cpu)"),
    # CPU: specprefill was measured to lose at 1,051 tokens and to win first at 2,071 (issue 44 item 15);
    # quality_min_tokens=0, so the break-even is what decides (the default bands start at 3,670)
    (dict(n_prompt=1051, backend="cpu", quality_min_tokens=0), "baseline", "< break-even 2071 (cpu)"),
    (dict(n_prompt=1500, backend="cpu", quality_min_tokens=0), "baseline", "< break-even 2071 (cpu)"),
    (dict(n_prompt=2071, backend="cpu", quality_min_tokens=0), "specprefill", ">= break-even 2071"),
    (dict(n_prompt=5000, backend="cuda"), "baseline", "< break-even 8192 (cuda)"),
    (dict(n_prompt=5000, backend="cpu"), "baseline", "not measured"),
    (dict(n_prompt=5000, backend="cpu", quality_min_tokens=8000), "baseline", "< 8000 (operator override"),
    (dict(n_prompt=9000, backend="cpu", quality_min_tokens=8000), "specprefill", "one-off long document"),
    (dict(n_prompt=9000, backend="cpu", quality_min_tokens=8000, cached_tokens=8000), "baseline", "prompt cache hit"),
    (dict(n_prompt=9000, backend="cpu", quality_min_tokens=8000, cached_tokens=1000), "specprefill", "one-off"),
    (dict(n_prompt=600, backend="cpu", auto_min_tokens=512, quality_min_tokens=0), "specprefill", "break-even 512"),
    (dict(n_prompt=600, backend="cpu", min_tokens=700, quality_min_tokens=0), "baseline", "< break-even 700"),
    (dict(n_prompt=600, backend="metal"), "baseline", "< break-even 8192 (metal)"),
    (dict(n_prompt=9000, backend="cpu", quality_min_tokens=8000, reused_document=True), "baseline", "stored document"),
    (dict(n_prompt=9000, backend="cpu", quality_min_tokens=8000, reused_document=True, cached_tokens=8500), "baseline",
     "prompt cache hit"),
    # rule 1a: a group of questions about a stored document
    (dict(n_prompt=30000, backend="cuda", quality_min_tokens=0, reused_document=True, group=4), "specprefill",
     "group of 4 questions about a stored document: one group-sparse prefill (30000 tokens >= 29842"),
    (dict(n_prompt=20000, backend="cuda", quality_min_tokens=0, reused_document=True, group=4), "baseline",
     "stored document: a full prefill"),  # shorter than measured to win on CUDA
    (dict(n_prompt=30000, backend="cuda", quality_min_tokens=0, reused_document=True, group=1), "baseline",
     "stored document: a full prefill"),  # alone
    (dict(n_prompt=30000, backend="cuda", reused_document=True, group=4), "baseline",
     "stored document: a full prefill"),  # no quality evidence for these models
    (dict(n_prompt=30000, backend="cuda", quality_min_tokens=0, reused_document=True, group=4, group_min_tokens=-1),
     "baseline", "stored document: a full prefill"),  # the operator turned the rule off
    (dict(n_prompt=30000, backend="cuda", quality_min_tokens=0, reused_document=True, group=4, cached_tokens=29000),
     "baseline", "prompt cache hit"),
    (dict(n_prompt=30000, backend="cuda", quality_min_tokens=0, group=4), "specprefill", "one-off"),  # not stored
    (dict(n_prompt=9000, backend="cpu", quality_min_tokens=8000, reused_document=True, group=4), "baseline",
     "stored document: a full prefill"),  # CPU: never measured to win
    (dict(n_prompt=9000, backend="cpu", quality_min_tokens=8000, reused_document=True, group=4, group_min_tokens=4000),
     "specprefill", "group of 4 questions"),
    (dict(n_prompt=9000, backend="cpu", quality_min_tokens=10000, reused_document=True, group=4, group_min_tokens=4000),
     "baseline", "stored document: a full prefill"),  # quality not measured there
    (dict(n_prompt=30000, backend="cuda", quality_min_tokens=0, reused_document=True, grouped_before=True),
     "specprefill", "a stored document whose earlier questions ran as a group"),
    (dict(n_prompt=30000, backend="cuda", quality_min_tokens=0, reused_document=True, grouped_before=True,
          cached_tokens=29000), "baseline", "prompt cache hit"),
    (dict(n_prompt=9000, backend="cpu", quality_min_tokens=0, reused_document=True, grouped_before=True), "baseline",
     "(grouped before, but group-sparse not measured faster on cpu)"),
    (dict(n_prompt=800, backend="cpu", quality_min_tokens=0, reused_document=True, group=4, group_min_tokens=100),
     "baseline", "stored document: a full prefill"),  # below the break-even
])
def test_auto_decisions(case, expect_mode, needle):
    d = auto.decide(**case)
    assert d.mode == expect_mode and needle in d.reason, d


def test_cpu_break_even_is_the_first_measured_win():
    """The CPU break-even is the shortest measured prompt from which specprefill beat the fastest
    baseline in every batch-invariant mode at that and every longer measured length (the measurement
    of record, bench/results/cpu-break-even-2026-12-04.json), not a length where it was measured to lose."""
    import json
    from pathlib import Path

    report = json.loads((Path(__file__).resolve().parents[1] / "bench/results/cpu-break-even-2026-12-04.json").read_text())
    rows = sorted(report["rows"], key=lambda r: r["prompt_tokens"])
    wins = [all(m["ratio_vs_fastest_baseline"] > 1.0 for m in r["modes"].values()) for r in rows]
    first = next(r["prompt_tokens"] for i, r in enumerate(rows) if all(wins[i:]))
    assert first == 2071 and not wins[0]  # the measurement as recorded: loses at 536 and 1,051
    assert auto.BREAK_EVEN_TOKENS["cpu"] == first
    assert auto.decide(first - 1, backend="cpu", quality_min_tokens=0).mode == "baseline"
    assert auto.decide(first, backend="cpu", quality_min_tokens=0).mode == "specprefill"


def test_auto_in_the_engine_records_mode_and_reason(tiny_models):
    e = _engine(tiny_models, auto_min_tokens=64, auto_quality_min_tokens=200)
    try:
        assert RunParams().mode == "auto"
        short = e.run("tiny", RunParams(question="q?", max_tokens=2), scope="a")
        assert short.spec.mode == "baseline" and "< break-even 64" in short.spec.reason
        long1 = e.run(DOC, RunParams(question=QUESTIONS[0], max_tokens=2, window=WINDOW), scope="a")
        assert long1.spec.mode == "specprefill" and "one-off long document" in long1.spec.reason
        # a baseline run stores the prompt; the next question about the document is a prompt-cache hit
        e.run(DOC, RunParams(question=QUESTIONS[1], max_tokens=2, mode="baseline"), scope="a")
        again = e.run(DOC, RunParams(question=QUESTIONS[2], max_tokens=2), scope="a")
        assert again.spec.mode == "baseline" and "prompt cache hit" in again.spec.reason
        assert again.spec.cache["target"]["hit"] and again.spec.cache["bytes_restored"] > 0
        # another tenant: no hit, so specprefill again
        b = e.run(DOC, RunParams(question=QUESTIONS[2], max_tokens=2, window=WINDOW), scope="b")
        assert b.spec.mode == "specprefill" and b.to_dict()["spec"]["reason"].startswith("auto: ")
        # a stored document's first question fills the prompt cache instead
        c = e.run(DOC, RunParams(question=QUESTIONS[2], max_tokens=2, window=WINDOW), scope="c", reused_document=True)
        assert c.spec.mode == "baseline" and "stored document" in c.spec.reason and c.spec.cache["target"]["bytes_saved"] > 0
    finally:
        e.close()


def test_auto_without_quality_evidence_for_the_models_runs_baseline(tiny_models):
    # no shipped evidence row passes (engine/policy/evidence_rows.json; none has 8 documents), so baseline
    e = _engine(tiny_models, auto_min_tokens=64)
    try:
        r = e.run(DOC, RunParams(question=QUESTIONS[0], max_tokens=2, window=WINDOW), scope="a")
        assert r.spec.mode == "baseline" and r.spec.reason.startswith("auto: no specprefill evidence row passes")
    finally:
        e.close()


def test_parallel_windows_restore_into_their_own_streams(tiny_models):
    """n_parallel 2 (the GPU path, here on the CPU): windows scored two at a time as parallel KV streams;
    question 2 restores each window's prefix into its own stream, with the uncached run's scores."""
    e = _engine(tiny_models, n_parallel=2)
    try:
        scorer, cache = e.scorer(), e.spec_cache()
        for i, q in enumerate(QUESTIONS[:2]):
            p = _params(q)
            prompt = e.tokenize_prompt(DOC, p)
            use = cache.begin()
            cached = scorer.score(prompt, window=WINDOW, cache=cache, scope="a")
            assert cached.windows >= 2
            assert (use.hits, use.misses) == ((0, cached.windows) if i == 0 else (cached.windows, 0))
            plain = scorer.score(prompt, window=WINDOW)
            rel = np.max(np.abs(cached.scores - plain.scores) / np.maximum(np.abs(plain.scores), 1e-6))
            assert rel <= 1e-3, (i, rel)
            pieces = e.target.pieces(prompt.document)
            assert _kept(prompt, cached.scores, p, pieces) == _kept(prompt, plain.scores, p, pieces)
        # the streams' entries are keyed apart from the single context's (an odd last window runs alone)
        layouts = [entry.key[8] for entry in e.cache_store.entries(("speculator",))]
        assert "streams" in layouts and set(layouts) <= {"streams", "single"}
    finally:
        e.close()


def test_the_next_question_on_the_same_document_reuses_the_resident_streams(tiny_models):
    """n_parallel 2, a document of two windows (one parallel call): after question 1 the streams still
    hold each window's head + document slice, so question 2 drops only question 1's tail and lookahead
    and restores nothing, with exactly the scores of a restore from the cache (the same KV bytes); a
    call about another document, another tenant, or an uncached call in between forgets them."""
    e = _engine(tiny_models, n_parallel=2)
    try:
        scorer, cache = e.scorer(), e.spec_cache()

        def score(q: str, doc: str = DOC, scope: str = "a"):
            p = _params(q)
            prompt = e.tokenize_prompt(doc, p)
            window = (len(prompt.document) + 1) // 2  # two windows: one parallel call
            use = cache.begin()
            got = scorer.score(prompt, window=window, cache=cache, scope=scope)
            assert got.windows == 2
            return prompt, got, use

        _, first, use = score(QUESTIONS[0])
        assert (use.misses, use.hits, use.resident) == (2, 0, 0)
        prompt, resident, use = score(QUESTIONS[1])
        assert (use.hits, use.resident, use.misses, use.bytes_restored) == (2, 2, 0, 0)
        assert resident.timings_ms["cache_restore"] == 0
        _, other, use = score(QUESTIONS[1], doc=DOC[: len(DOC) // 2])  # another document: its own windows
        assert use.resident == 0 and use.misses == 2
        _, again, use = score(QUESTIONS[1])  # back: restored from the cache, not resident any more
        assert (use.hits, use.resident) == (2, 0) and use.bytes_restored > 0
        assert np.array_equal(resident.scores, again.scores)
        _, _, use = score(QUESTIONS[2], scope="b")  # another tenant never reuses team a's streams
        assert (use.resident, use.misses) == (0, 2)
        _, _, use = score(QUESTIONS[2])  # nor does a's next question reuse b's
        assert (use.resident, use.hits) == (0, 2)
        _, _, use = score(QUESTIONS[3])
        assert (use.resident, use.hits) == (2, 2)
        scorer.score(prompt, window=(len(prompt.document) + 1) // 2)  # an uncached call forgets them
        _, _, use = score(QUESTIONS[3])
        assert (use.resident, use.hits) == (0, 2)
    finally:
        e.close()


def test_serving_slots_use_the_prompt_cache(tiny_models):
    """Two serving slots (engine/serving/loop.py): question 1's full prefill is saved from its slot's KV stream;
    questions 2-4, decoded together, reuse it in whichever slot they get (still there, copied from the
    other slot, or restored from the store), prefill only the rest, and
    answer what the loop answers without a cache (batch-invariant numerics: the restored cells are the
    bytes question 1 computed). Another tenant misses."""
    answers = {}
    for budget, e, loop in _loops(tiny_models, slots=2):
        p = [_params(q, mode="baseline", max_tokens=6) for q in QUESTIONS]
        first = loop.run(DOC, p[0])
        rest = [h.result(120) for h in [loop.submit(DOC, x, scope="") for x in p[1:]]]
        answers[budget] = [r.tokens for r in [first, *rest]]
        if budget:
            prompt = e.tokenize_prompt(DOC, p[1])
            # its prompt stays in its slot, not copied to the store while nothing needs the slot
            assert not first.spec.cache["target"]["hit"] and first.spec.cache["target"]["save_deferred"]
            assert first.spec.cache["target"]["bytes_saved"] == 0
            for r in rest:
                t = r.spec.cache["target"]
                assert t["hit"] and t["reused_tokens"] >= prompt.doc_end, t
                assert t["prefilled_tokens"] == r.usage.prompt_tokens - t["reused_tokens"]
                if t["from_slot"] or t["from_other_slot"]:  # in a slot (its own, or copied from another's)
                    assert r.spec.cache["bytes_restored"] == t["bytes_restored"] == 0
                else:
                    assert r.spec.cache["bytes_restored"] == t["bytes_restored"] > 0
                    assert r.timings_ms["cache_restore"] > 0
            # question 2 took question 1's slot; question 3 the empty one, and copied the document there
            # from question 2's slot (on the device) rather than restore it from the store
            assert [r.spec.cache["target"]["from_slot"] for r in rest[:2]] == [True, False]
            assert rest[1].spec.cache["target"]["from_other_slot"]
            assert not list(e.cache_store.entries(("target-prefix",)))
            other = loop.submit(DOC, p[1], scope="team-b").result(120)
            assert not other.spec.cache["target"]["hit"]
            loop.submit(DOC, p[1], scope="team-c").result(120)
            # two other tenants' jobs took both slots: the one slot that owed team a's prompt saved it first
            assert loop.saves_on_reuse == 1
            # the entries are keyed by the slots' layout, apart from a one-sequence context's
            assert {entry.key[8] for entry in e.cache_store.entries(("target-prefix",))} == {"streams"}
        else:
            assert first.spec.cache["target"] == "off"
    assert answers[64 << 20] == answers[0]


def _recording_saves(e, events: list) -> None:
    cache = e.prefix_cache()
    real_save = cache.save

    def save(*args, **kw):
        events.append("save")
        return real_save(*args, **kw)

    cache.save = save


def test_one_job_emits_its_first_token_before_the_prompt_cache_save(tiny_models):
    """The one-job path (one slot: the CPU's default) too: the prompt is saved once the first token is
    out (decode.generate's `after_first`), the record says what was saved, and the next question hits it."""
    e = _engine(tiny_models)
    try:
        events: list = []
        _recording_saves(e, events)
        first = e.run(DOC, _params(QUESTIONS[0], mode="baseline", max_tokens=4),
                      lambda phase, done, total: events.append((phase, done)))
        assert events.count("save") == 1 and events.index(("decode", 1)) < events.index("save"), events
        t = first.spec.cache["target"]
        assert not t["hit"] and t["bytes_saved"] > 0 and t["save_ms"] > 0
        second = e.run(DOC, _params(QUESTIONS[1], mode="baseline", max_tokens=4)).spec.cache["target"]
        assert second["hit"] and second["reused_tokens"] >= e.tokenize_prompt(DOC, _params(QUESTIONS[1])).doc_end
    finally:
        e.close()


def test_a_full_prefills_prompt_is_saved_when_its_slot_is_reused(tiny_models):
    """The serving loop leaves a full prefill's prompt in its slot and copies it into the prompt cache only
    when the slot is about to hold another prompt (module doc, "Prompt saves": the copy stalls every job,
    0.66 s at 32K tokens of the 7B). The first job's record says so and no save runs while it or its
    document's next question (which keeps the slot's cells and takes the save over) run; a third
    document's job, needing the least recently used slot, saves that slot's prompt at its set-up, before
    its own prefill; the saved prompt is the prompt alone (a later question restores it and prefills
    only the rest)."""
    from specq.engine.serving.loop import ServingEngine

    e = _engine(tiny_models, slots=2)
    loop = ServingEngine(e).start()
    doc_b, doc_c = DOC.replace("item_", "entry_"), DOC.replace("item_", "thing_")
    try:
        events: list = []
        _recording_saves(e, events)
        first = loop.submit(DOC, _params(QUESTIONS[0], mode="baseline", max_tokens=4),
                            lambda phase, done, total: events.append(("a", phase, done))).result(120)
        t = first.spec.cache["target"]
        assert t["save_deferred"] and t["bytes_saved"] == 0 and t["save_ms"] == 0 and "save" not in events
        nxt = loop.run(DOC, _params(QUESTIONS[1], mode="baseline", max_tokens=4)).spec.cache["target"]
        assert nxt["from_slot"] and nxt["save_deferred"] and nxt["bytes_saved"] == 0 and "save" not in events
        loop.run(doc_b, _params(QUESTIONS[0], mode="baseline", max_tokens=4))  # the empty slot: no save
        assert "save" not in events and loop.saves_on_reuse == 0
        third = loop.submit(doc_c, _params(QUESTIONS[0], mode="baseline", max_tokens=4),
                            lambda phase, done, total: events.append(("c", phase, done))).result(120)
        assert events.count("save") == 1 and loop.saves_on_reuse == 1, events
        assert events.index("save") < events.index(("c", "sparse_prefill", 0)) or \
            events.index("save") < events.index(("c", "decode", 1)), events
        # (a third document: at most the prefix it shares with the slot's prompt is reused)
        assert third.spec.cache["target"]["reused_tokens"] < e.tokenize_prompt(doc_c, _params(QUESTIONS[0])).doc_end
        # a document that lost its slot had its prompt saved first: its next question restores it
        again = [loop.run(d, _params(QUESTIONS[2], mode="baseline", max_tokens=4)).spec.cache["target"]
                 for d in (DOC, doc_b)]
        for x, d in zip(again, (DOC, doc_b)):
            assert x["hit"] and x["reused_tokens"] >= e.tokenize_prompt(d, _params(QUESTIONS[2])).doc_end, again
            assert (x["bytes_restored"] > 0) == (not x["from_slot"])
        assert any(x["bytes_restored"] > 0 for x in again), again  # the store holds what a reuse saved
    finally:
        loop.close()
        e.close()


def test_a_resident_prompt_outlives_the_worker_through_the_disk_cache(tiny_models, tmp_path):
    """With a disk copy of the cache (cache_dir), a prompt left unsaved in its slot is saved when the loop
    closes, so a new engine on the same directory restores it (as an eagerly saved prompt would be); without
    the close-time save the directory would hold no target entry."""
    from specq.engine.serving.loop import ServingEngine

    d = tmp_path / "kv"
    e = _engine(tiny_models, slots=2, cache_dir=str(d))
    loop = ServingEngine(e).start()
    try:
        first = loop.run(DOC, _params(QUESTIONS[0], mode="baseline", max_tokens=4))
        assert first.spec.cache["target"]["save_deferred"]
        assert not list(e.cache_store.entries(("target-prefix",)))
    finally:
        loop.close()
        e.cache_store.disk.flush(30)
        e.close()
    new = _engine(tiny_models, slots=2, cache_dir=str(d))
    loop = ServingEngine(new).start()
    try:
        again = loop.run(DOC, _params(QUESTIONS[1], mode="baseline", max_tokens=4)).spec.cache["target"]
        assert again["hit"] and again["bytes_restored"] > 0 and not again["from_slot"]
        assert again["reused_tokens"] >= new.tokenize_prompt(DOC, _params(QUESTIONS[1])).doc_end
    finally:
        loop.close()
        new.close()


def test_questions_arriving_together_prefill_the_document_once(tiny_models):
    """Four baseline questions about one document submitted at once to four slots: the first prefills
    the document, the other three set up after it and copy its KV stream on the device from its slot
    (nothing restored from host memory; without the wait, all four would miss: none is saved when the
    others set up). Same tokens as four uncached runs through the loop: the copied cells are the
    document's own."""
    answers = {}
    for budget, e, loop in _loops(tiny_models, slots=4):
        rs = [h.result(120) for h in [loop.submit(DOC, _params(q, mode="baseline", max_tokens=6), scope="a")
                                     for q in QUESTIONS]]
        answers[budget] = [r.tokens for r in rs]
        if budget:
            hits = [r.spec.cache["target"]["hit"] for r in rs]
            assert hits == [False, True, True, True], [r.spec.cache for r in rs]
            doc_end = e.tokenize_prompt(DOC, _params(QUESTIONS[0])).doc_end
            assert all(r.spec.cache["target"]["reused_tokens"] >= doc_end for r in rs[1:])
            assert loop.prefix_waits >= 1  # the later ones may set up after the save itself
            t = [r.spec.cache["target"] for r in rs[1:]]
            assert all(x["from_other_slot"] and not x["from_slot"] and x["bytes_restored"] == 0 for x in t), t
            assert all(r.timings_ms["cache_restore"] == 0 for r in rs[1:])
            assert loop.slot_copy_hits == 3 and loop.stats()["slot_copy_hits"] == 3
    assert answers[64 << 20] == answers[0]


def test_a_documents_next_question_reuses_its_slot(tiny_models):
    """Questions about one document one after another (each sent when the last ended), another
    document's beside them: each later question gets the slot that served its document (its prompt's
    cells stay there, the answer's go) and prefills only the question, with nothing restored from host
    memory; the answers are the tokens of the loop without any cache. Another tenant does not get the
    slot's cells; a specprefill job that takes the slot clears them (the next baseline question
    restores from the store instead)."""
    doc_b = DOC.replace("item_", "entry_")
    answers = {}
    for budget, e, loop in _loops(tiny_models, slots=2):
        p = [_params(q, mode="baseline", max_tokens=6) for q in QUESTIONS]
        a, b = loop.submit(DOC, p[0]), loop.submit(doc_b, p[0])
        runs = [a.result(120), b.result(120)]
        for q in p[1:3]:  # both documents' next questions, together
            ha, hb = loop.submit(DOC, q), loop.submit(doc_b, q)
            runs += [ha.result(120), hb.result(120)]
        answers[budget] = [r.tokens for r in runs]
        if budget:
            t = [r.spec.cache["target"] for r in runs]
            assert [x["from_slot"] for x in t] == [False, False, True, True, True, True], t
            doc_end = e.tokenize_prompt(DOC, p[1]).doc_end
            for x, r in zip(t[2:], runs[2:]):
                assert x["reused_tokens"] >= doc_end and x["bytes_restored"] == 0 and x["save_deferred"]
                assert r.timings_ms["cache_restore"] == 0
            assert loop.slot_prefix_hits == 4 and loop.stats()["slots_resident"] == 2
            other = loop.submit(DOC, p[3], scope="team-b").result(120)
            assert not other.spec.cache["target"]["hit"]  # not its tenant's cells: a miss, then a prefill
            # specprefill jobs (sparse cells) in both slots clear them; then the store serves the document
            for h in [loop.submit(DOC, _params(QUESTIONS[3])), loop.submit(doc_b, _params(QUESTIONS[3]))]:
                assert h.result(120).spec.mode == "specprefill"
            assert loop.stats()["slots_resident"] == 0
            again = loop.run(DOC, p[3])
            assert again.spec.cache["target"]["hit"] and not again.spec.cache["target"]["from_slot"]
        else:
            assert loop.stats()["slots_resident"] == 0
    assert answers[64 << 20] == answers[0]


def test_no_residents_in_a_unified_cache(tiny_models):
    """With one unified KV cache (kv_unified) a slot's idle cells would be cells no other slot gets:
    the loop keeps none."""
    from specq.engine.serving.loop import ServingEngine

    e = _engine(tiny_models, slots=2, kv_unified=True)
    loop = ServingEngine(e).start()
    try:
        p = [_params(q, mode="baseline", max_tokens=4) for q in QUESTIONS[:2]]
        loop.run(DOC, p[0])
        second = loop.run(DOC, p[1])
        assert loop.stats()["slots_resident"] == 0 and loop.slot_prefix_hits == 0
        assert second.spec.cache["target"]["hit"] and not second.spec.cache["target"]["from_slot"]
    finally:
        loop.close()
        e.close()
