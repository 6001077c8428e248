"""SpecPrefill scoring and selection on real llama.cpp (tiny models), plus the needle test on the real pair."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import numpy as np  # noqa: E402

from specq.engine.llama import binding as llama  # noqa: E402
from specq.engine.llama.capture import QKCapture  # noqa: E402
from specq.engine.options import CHUNK_RULES, EngineOptions, RunParams  # noqa: E402
from specq.engine.scoring.scorer import avg_pool, head_probs, merge_central, plan_windows, sliding_starts  # noqa: E402
from specq.engine.scoring.selection import chunk_scores, rank_scores, select_kept  # noqa: E402

#: engine tests: counted by .ci/check_suites.py (a run where all of them skipped fails CI)
pytestmark = [pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "python-license.txt").read_text()
CODE = Path(textwrap.__file__).read_text()


# ------------------------------------------------------------------------ scores vs llama.cpp's own softmax


def test_recomputed_scores_equal_kq_soft_max(tiny_models):
    """With flash attention off llama.cpp materialises kq_soft_max; our recomputation from the captured
    post-RoPE Q and the K cache must equal it (catches GQA mapping, scaling and masking bugs)."""
    model = llama.Model(tiny_models.target, n_gpu_layers=0)
    cap = QKCapture()
    ctx = llama.Context(model, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=2, flash_attn=False, cb_eval=cap.callback)
    tokens = model.tokenize(TEXT[:300])
    n = len(tokens)
    ctx.decode(tokens[:-1], range(n - 1), logits="none")
    checked = 0
    tok, pos = tokens[-1], n - 1
    for step in range(3):
        cap.arm(q=True, k=True, also=(b"kq_soft_max-",))
        ctx.decode([tok], [pos], logits="last")
        cap.disarm()
        assert sorted(cap.q) == sorted(cap.k) == list(range(model.n_layer))
        for il in range(model.n_layer):
            Q = cap.q[il][:1]  # (1, n_head, d)
            K = cap.k[il][0][:n]  # prompt keys only (stream 0)
            mine = head_probs(Q, K)[0]  # (n_head, n)
            theirs = cap.extra[f"kq_soft_max-{il}"][0][:, 0, :]  # (n_head, n_kv): all visible cells
            assert theirs.shape[0] == model.n_head
            assert np.all(theirs[:, pos + 1 :] == 0)  # masked: cells after this token
            prompt_part = theirs[:, :n] / theirs[:, :n].sum(axis=-1, keepdims=True)  # renormalise over prompt keys
            np.testing.assert_allclose(mine, prompt_part, rtol=2e-3, atol=2e-5)
            np.testing.assert_allclose(mine.max(axis=0), prompt_part.max(axis=0), rtol=2e-3, atol=2e-5)
            checked += 1
        tok, pos = int(np.argmax(ctx.logits_row(-1))), pos + 1
    assert checked == 3 * model.n_layer
    ctx.close()
    model.close()


def test_avg_pool_same_padding():
    x = np.array([[0, 0, 3, 0, 0, 6]], dtype=np.float32)
    np.testing.assert_allclose(avg_pool(x, 3), [[0, 1, 1, 1, 2, 2]])
    np.testing.assert_allclose(avg_pool(x, 1), x)
    assert avg_pool(np.ones((2, 3, 50), dtype=np.float32), 13).shape == (2, 3, 50)


# ------------------------------------------------------------------------ windows


@pytest.mark.parametrize("n_doc,size", [(1000, 300), (1000, 1000), (1001, 250), (64, 4096), (5, 2)])
def test_windows_tile_the_document_once(n_doc, size):
    plan = plan_windows(n_doc, size)
    covered = np.zeros(n_doc, dtype=int)
    for a, b in plan:
        covered[a:b] += 1
        assert b - a <= size
    assert np.all(covered == 1)
    lengths = [b - a for a, b in plan]
    assert max(lengths) - min(lengths) <= 1 or len(plan) == 1  # no tiny last window


def test_sliding_starts_and_central_merge():
    starts = sliding_starts(1000, 400)
    assert starts[0] == 0 and starts[-1] + 400 >= 1000
    assert all(b - a == 200 for a, b in zip(starts, starts[1:-1]))
    # window w scores every token w+1: the merge must pick the window where a token is most central
    windows = [(s, np.full(min(400, 1000 - s), float(w + 1), dtype=np.float32)) for w, s in enumerate(starts)]
    merged = merge_central(1000, windows)
    for t in (0, 150, 399, 500, 999):
        centres = [abs(t - (s + min(1000, s + 400) - 1) / 2) if s <= t < s + 400 else np.inf for s in starts]
        assert merged[t] == float(np.argmin(centres) + 1)


# ------------------------------------------------------------------------ selection


def test_chunk_ranking_keep_and_protected():
    scores = np.zeros(320, dtype=np.float32)
    scores[64:96] = 5.0  # chunk 2
    scores[256:288] = 3.0  # chunk 8
    scores[300] = 100.0  # chunk 9 (partial mean 100/20 = 5.0, tie with chunk 2: earlier wins)
    means = chunk_scores(scores, 32)
    assert means.shape == (10,) and means[2] == 5.0
    kept = select_kept(scores, doc_start=10, n_prompt=340, protected=list(range(10)) + list(range(330, 340)), keep=0.2, chunk=32,
                       rule="mean")
    doc_kept = sorted(i - 10 for i in kept if 10 <= i < 330)
    assert doc_kept == list(range(64, 96)) + list(range(288, 320))
    assert set(range(10)) <= set(kept) and set(range(330, 340)) <= set(kept)
    assert kept == sorted(set(kept))


def test_keep_fraction_and_max_keep():
    rng = np.random.default_rng(0)
    scores = rng.random(3200).astype(np.float32)
    kept = select_kept(scores, doc_start=0, n_prompt=3200, protected=[3199], keep=0.3, chunk=32, rule="border")
    assert abs(len(kept) - 0.3 * 3200) <= 33
    capped = select_kept(scores, doc_start=0, n_prompt=3200, protected=[3199], keep=0.3, chunk=32, max_keep=200, rule="border")
    doc_capped = [i for i in capped if i != 3199]
    assert 160 < len(doc_capped) <= 200 and len(doc_capped) % 32 == 0
    # the cap drops the lowest-ranked chunks: the kept ones are the top-ranked
    means = rank_scores(scores, 32, "border")
    top = set(np.argsort(-means, kind="stable")[: len(doc_capped) // 32])
    assert {i // 32 for i in doc_capped} == top


def test_border_rule_keeps_a_line_the_chunk_grid_cuts():
    """A strongly attended line over the border of chunks 1 and 2 (tokens 40-69) and a weaker line inside
    chunk 5: by means, chunk 2 (6 of the line's tokens) loses to chunk 5 and the line is kept in part;
    by the border rule, chunk 2 takes the span over its left border (tokens 48-79: 22 of the line's)."""
    scores = np.zeros(320, dtype=np.float32)
    scores[40:70] = 1.0
    scores[160:176] = 1.0  # chunk 5: mean 0.5
    kw = dict(doc_start=0, n_prompt=320, protected=[], keep=0.2, chunk=32)
    assert {i // 32 for i in select_kept(scores, rule="mean", **kw)} == {1, 5}
    assert {i // 32 for i in select_kept(scores, rule="border", **kw)} == {1, 2}
    ranks = rank_scores(scores, 32, "border")
    assert ranks[2] == 22 / 32 and ranks[5] == 0.5 and ranks[1] == 24 / 32
    # the same number of chunks either way; the spans are cut at the document's ends
    assert rank_scores(scores[:20], 32, "border").tolist() == chunk_scores(scores[:20], 32).tolist()
    with pytest.raises(ValueError, match="chunk rule"):
        rank_scores(scores, 32, "max")


@pytest.mark.parametrize("n", [1, 31, 32, 33, 100, 3670])
def test_border_rank_is_never_below_the_mean_and_reads_only_neighbours(n):
    rng = np.random.default_rng(n)
    s = rng.random(n).astype(np.float32)
    means, ranks = chunk_scores(s, 32), rank_scores(s, 32, "border")
    assert ranks.shape == means.shape and np.all(ranks >= means)
    for j in range(len(means)):  # brute force: the chunk's mean and the spans over its borders
        spans = [means[j]] + [s[max(b - 16, 0):min(b + 16, n)].mean() for b in (j * 32, (j + 1) * 32) if 0 < b < n]
        assert ranks[j] == pytest.approx(max(spans), rel=1e-6)


# ------------------------------------------------------------------------ the engine with specprefill


@pytest.fixture(scope="module")
def engine(tiny_models):
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0, n_ctx=8192))
    yield eng
    eng.close()


@pytest.mark.parametrize("scorer", ["windowed", "full", "sliding"])
def test_specprefill_run(engine, scorer):
    doc = TEXT[:4000]
    params = RunParams(question="Who?", mode="specprefill", scorer=scorer, window=1024 if scorer != "full" else 0, keep=0.3, min_tokens=0, max_tokens=6)
    windows = []
    r = engine.run(doc, params, progress=lambda phase, done, total: windows.append(total) if phase == "score" else None)
    n_prompt, n_kept = r.usage.prompt_tokens, r.usage.kept_tokens
    n_doc = len(engine.target.tokenize(doc))
    protected = n_prompt - n_doc
    assert r.spec.mode == "specprefill" and r.spec.scorer == scorer
    # kept ≈ keep × document (whole chunks) + protected regions
    assert 0.3 * n_doc <= n_kept - protected <= 0.3 * n_doc + 32
    if scorer == "windowed":
        assert r.spec.windows == 4 and windows[-1] == 4
    if scorer == "full":
        assert r.spec.windows == 1
    for phase in ("score", "speculator_prefill", "lookahead", "score_math", "select", "sparse_prefill"):
        assert r.timings_ms[phase] > 0, phase


def test_the_chunk_rule_is_a_job_parameter(engine):
    """RunParams.chunk_rule reaches selection: each run keeps exactly select_kept's chunks under its rule
    over the same scores (the speculator is deterministic), and the result records the rule. The
    document is real code (a standard-library module), so `scope` has header lines to read."""
    doc = CODE[:6000]
    prompt = engine.tokenize_prompt(doc, RunParams(question="Who?"))
    scores = engine.scorer().score(prompt, scorer="windowed", window=3000, lookahead=8, pool=13).scores
    pieces = engine.target.pieces(prompt.document)
    assert b"".join(pieces).decode() == doc
    kept = {}
    for rule in CHUNK_RULES:
        r = engine.run(doc, RunParams(question="Who?", mode="specprefill", max_tokens=1, chunk_rule=rule, min_tokens=0,
                                      window=3000))
        assert r.spec.chunk_rule == rule and r.to_dict()["spec"]["chunk_rule"] == rule
        want = select_kept(scores, doc_start=prompt.doc_start, n_prompt=prompt.n, protected=prompt.protected_indices(),
                           keep=0.3, rule=rule, pieces=pieces)
        assert r.kept_indices == want
        kept[rule] = set(want)
    # random weights: the rules pick different chunks here, at the same budget
    assert kept["mean"] != kept["border"] != kept["scope"]
    assert len(kept["mean"]) == len(kept["border"]) == len(kept["scope"])


def test_every_document_token_is_scored(engine):
    prompt = engine.tokenize_prompt(TEXT[:3000], RunParams(question="Who?"))
    res = engine.scorer().score(prompt, scorer="windowed", window=500, lookahead=4, pool=1)
    assert res.windows == len(plan_windows(len(prompt.document), 500))
    assert res.scores.shape == (len(prompt.document),)
    assert np.all(res.scores > 0) and np.all(np.isfinite(res.scores))
    # normalised per window: uniform attention would score 1.0 everywhere, so the mean is O(1)
    assert 0.05 < float(res.scores.mean()) < 20


def test_default_window_is_one_pass_up_to_one_pass_tokens(engine, monkeypatch):
    """window 0: a document of up to ONE_PASS_TOKENS is scored in one window (the scores equal the full
    scorer's: the same pass), a longer one in DEFAULT_WINDOW slices, an explicit window is obeyed, and
    a document longer than the speculator's context holds falls back to slices that fit."""
    from specq.engine.scoring import scorer as scoring

    sc = engine.scorer()
    ids = engine.target.tokenize(TEXT)
    assert scoring.DEFAULT_WINDOW < scoring.ONE_PASS_TOKENS < len(ids)
    # the shipped sizes: ~6K tokens fit one pass in this 8,192-token context
    mid = engine.tokenize_prompt(engine.target.detokenize(ids[:6000]), RunParams(question="Who?"))
    assert scoring.DEFAULT_WINDOW < len(mid.document) <= scoring.ONE_PASS_TOKENS
    one = sc.score(mid, scorer="windowed", lookahead=4, pool=13)
    full = sc.score(mid, scorer="full", lookahead=4, pool=13)
    assert one.windows == 1 and one.plan == [(0, len(mid.document))]
    np.testing.assert_allclose(one.scores, full.scores, rtol=1e-5, atol=1e-6)
    assert sc.score(mid, scorer="windowed", window=scoring.DEFAULT_WINDOW, lookahead=4, pool=13).windows == 2
    # a context that holds no more than ~5K document tokens: slices that fit, never one pass
    monkeypatch.setattr(sc, "n_ctx", 5000)
    assert sc.window_tokens(mid, 4) == scoring.DEFAULT_WINDOW
    monkeypatch.setattr(sc, "n_ctx", 3000)
    assert sc.window_tokens(mid, 4) == 3000 - len(mid.head) - len(mid.tail) - 5
    monkeypatch.undo()
    # the rule on smaller sizes (so that both sides of it fit this context)
    monkeypatch.setattr(scoring, "DEFAULT_WINDOW", 1000)
    monkeypatch.setattr(scoring, "ONE_PASS_TOKENS", 2000)
    for n_doc, windows in ((900, 1), (1900, 1), (2100, 3), (5000, 5)):
        p = engine.tokenize_prompt(engine.target.detokenize(ids[:n_doc]), RunParams(question="Who?"))
        assert sc.score(p, scorer="windowed", lookahead=4, pool=13).windows == windows, len(p.document)
        assert sc.score(p, scorer="windowed", window=700, lookahead=4, pool=13).windows == len(plan_windows(len(p.document), 700))


def test_short_prompts_run_baseline(engine):
    r = engine.run(TEXT[:400], RunParams(question="Who?", mode="specprefill", min_tokens=100000, max_tokens=3))
    assert r.spec.mode == "baseline" and r.usage.kept_tokens == r.usage.prompt_tokens
    assert any("min_tokens" in w for w in r.warnings)


# ------------------------------------------------------------------------ the needle test (real pair)

NEEDLE = "The access code for the archive room is 4712."
QUESTION = "What is the access code for the archive room? Answer with the number only."


#: paragraphs of TEXT the needle's haystack takes: ~2.1K tokens (all 50, ~3.4K, cost CI ~3 more minutes)
HAYSTACK_PARAGRAPHS = 30


def _haystack(depth: float) -> str:
    paragraphs = TEXT.split("\n\n")[:HAYSTACK_PARAGRAPHS]
    at = int(round(depth * len(paragraphs)))
    return "\n\n".join(paragraphs[:at] + [NEEDLE] + paragraphs[at:])



@pytest.mark.real_models
@pytest.mark.timeout(3000)  # 10 specprefill runs + 5 random controls: minutes on a 2-core CPU
def test_needle_is_kept_and_answered(real_engine):
    """A planted fact at 10 depths of a ~2.1K-token document: specprefill (keep 0.3) keeps its chunk
    and answers; the same keep budget chosen at random (at 5 of the depths) does clearly worse."""
    eng = real_engine
    rng = np.random.default_rng(1234)
    kept_hits = answered = random_hits = random_answered = 0
    depths = [i / 10 + 0.05 for i in range(10)]
    needle_ids = eng.target.tokenize(" " + NEEDLE)
    controls = 0
    for n_depth, depth in enumerate(depths):
        doc = _haystack(depth)
        params = RunParams(question=QUESTION, mode="specprefill", keep=0.3, min_tokens=0, max_tokens=8)
        r = eng.run(doc, params)
        prompt = eng.tokenize_prompt(doc, params)
        # where the needle's digits sit in the prompt
        text_upto = doc.index(NEEDLE) + NEEDLE.index("4712")
        pos = prompt.doc_start + len(eng.target.tokenize(doc[:text_upto]))
        span = range(pos - 2, pos + 3)
        kept = set(r.kept_indices)
        hit = all(i in kept for i in span)
        kept_hits += hit
        answered += "4712" in r.text
        print(f"depth {depth:.2f}: kept {hit} answer {r.text.strip()!r} ttft {r.timings_ms['ttft']:.0f} ms", flush=True)
        # control (every other depth, to bound CI time): the same number of chunks, chosen at random
        if n_depth % 2:
            continue
        controls += 1
        n_doc = len(prompt.document)
        n_chunks = -(-n_doc // 32)
        pick = rng.choice(n_chunks, size=int(np.ceil(n_chunks * 0.3)), replace=False)
        rand_scores = np.zeros(n_doc, dtype=np.float32)
        for c in pick:
            rand_scores[c * 32 : (c + 1) * 32] = 1.0
        rand_kept = select_kept(rand_scores, doc_start=prompt.doc_start, n_prompt=prompt.n, protected=prompt.protected_indices(), keep=0.3,
                                rule="mean")
        random_hits += all(i in set(rand_kept) for i in span)
        from specq.engine.decode.loop import generate
        from specq.engine.decode.prefill import sparse_prefill
        from specq.engine.decode.sampling import Sampler

        pre = sparse_prefill(eng.ctx, prompt.tokens, rand_kept, "original")
        gen = generate(eng.ctx, prompt.tokens, pre.logits, pre.next_pos, max_tokens=8, sampler=Sampler())
        random_answered += "4712" in eng.target.detokenize(gen.tokens)
    print(f"\nneedle: kept {kept_hits}/10 answered {answered}/10 · random kept {random_hits}/{controls} answered {random_answered}/{controls}")
    assert kept_hits >= 9
    assert answered >= 9
    # random selection keeps the needle's chunk about 30% of the time: clearly worse than >= 90%
    assert random_answered / controls <= answered / 10 - 0.4
    assert random_hits / controls <= kept_hits / 10 - 0.4


def test_parallel_windows_score_like_one_at_a_time(tiny_models):
    """Windows scored as parallel sequences (one batch per lookahead step) must give the scores of
    windows scored one by one: this checks the cell-to-window mapping of the unified cache."""
    from specq.engine.prompt.build import build_prompt
    from specq.engine.scoring.scorer import SpecPrefillScorer

    model = llama.Model(tiny_models.speculator, n_gpu_layers=0)
    prompt = build_prompt(model, TEXT[:3500], "Who moved where?")
    one = SpecPrefillScorer(model, n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=2, flash_attn=True, n_parallel=1)
    par = SpecPrefillScorer(model, n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=2, flash_attn=True, n_parallel=3)
    a = one.score(prompt, window=700, lookahead=5, pool=13)
    b = par.score(prompt, window=700, lookahead=5, pool=13)
    assert a.windows == b.windows == len(plan_windows(len(prompt.document), 700)) >= 5
    np.testing.assert_allclose(a.scores, b.scores, rtol=2e-2, atol=1e-3)
    assert np.corrcoef(a.scores, b.scores)[0, 1] > 0.999
    # both prefilled each window (head + slice + tail) but its last token, from position 0 (bench ttft's
    # speculator tokens and FLOPs are counted from these spans)
    spans = [(0, len(prompt.head) + (e - s) + len(prompt.tail) - 1) for s, e in plan_windows(len(prompt.document), 700)]
    assert one.prefill_spans == spans and sorted(par.prefill_spans) == sorted(spans)
    assert sum(e for _, e in spans) == one.prefilled_tokens == par.prefilled_tokens
    # the benchmark's overhead baseline runs the same parallel forward passes without capture
    calls = par.capture.calls
    bare = par.score(prompt, window=700, lookahead=5, pool=13, capture=False)
    assert bare.windows == b.windows and (bare.scores == 1).all()
    assert par.capture.calls == calls or not par.toggles_callback
    one.close()
    par.close()
    model.close()


@pytest.mark.parametrize("n_parallel", [1, 3])
def test_torch_score_math_equals_numpy(tiny_models, n_parallel):
    """score_math=torch reads the K cache in place (here host memory; on a GPU, device memory) and
    must give the numpy path's scores, one window at a time and with parallel windows."""
    pytest.importorskip("torch")
    from specq.engine.prompt.build import build_prompt
    from specq.engine.scoring.scorer import SpecPrefillScorer

    model = llama.Model(tiny_models.speculator, n_gpu_layers=0)
    prompt = build_prompt(model, TEXT[:3500], "Who moved where?")
    kw = dict(n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=2, flash_attn=True, n_parallel=n_parallel)
    host = SpecPrefillScorer(model, score_math="numpy", **kw)
    dev = SpecPrefillScorer(model, score_math="torch", **kw)
    a = host.score(prompt, window=700, lookahead=5, pool=13)
    b = dev.score(prompt, window=700, lookahead=5, pool=13)
    assert a.windows == b.windows >= 5
    assert np.isfinite(b.scores).all() and b.scores.std() > 0
    np.testing.assert_allclose(b.scores, a.scores, rtol=1e-4, atol=1e-5)
    host.close()
    dev.close()
    model.close()


def test_unknown_score_math_is_refused(tiny_models):
    from specq.contracts import EngineError
    from specq.engine.scoring.scorer import SpecPrefillScorer

    model = llama.Model(tiny_models.speculator, n_gpu_layers=0)
    with pytest.raises(EngineError, match="score_math"):
        SpecPrefillScorer(model, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=1, flash_attn=True, score_math="cupy")
    model.close()


def test_engine_score_math_choice(tiny_models, engine):
    """auto on a CPU build is numpy; an explicit torch runs (on host memory here) and keeps the same chunks."""
    pytest.importorskip("torch")
    from specq.engine.pipeline import Engine

    params = RunParams(question="Who?", mode="specprefill", window=1024, keep=0.3, min_tokens=0, max_tokens=4)
    a = engine.run(TEXT[:4000], params)
    assert a.engine.score_math == "numpy"
    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=8192, score_math="torch"))
    try:
        b = eng.run(TEXT[:4000], params)
    finally:
        eng.close()
    assert b.engine.score_math == "torch"
    assert b.kept_indices == a.kept_indices and b.tokens == a.tokens


def test_interleaved_prefill_puts_a_chunk_of_every_stream_in_each_call():
    """The parallel windows' prefill order (scorer.interleaved): every call of `call_tokens` holds a chunk of each
    stream still being filled, each stream's positions stay in order, and the tokens are those of window-major."""
    from specq.engine.scoring.scorer import interleaved

    spans = [(list(range(100, 130)), 0, 0), (list(range(200, 225)), 5, 1), ([], 0, 2), (list(range(300, 310)), 0, 3)]
    toks, pos, seqs = interleaved(spans, 12)
    assert sorted(zip(seqs, pos, toks)) == sorted((s, p0 + i, t) for ts, p0, s in spans for i, t in enumerate(ts))
    for s in (0, 1, 3):
        mine = [p for p, q in zip(pos, seqs) if q == s]
        assert mine == sorted(mine)
    assert set(seqs[:12]) == {0, 1, 3}  # the first call: 4 tokens of each live stream
    assert seqs[:12] == [0] * 4 + [1] * 4 + [3] * 4
    assert interleaved([], 8) == ([], [], [])


def test_parallel_windows_in_small_interleaved_calls_score_like_one_at_a_time(tiny_models):
    """With calls of 128 tokens each call holds a chunk of all three windows; the scores are still the windows'
    own (the cells written do not depend on the order)."""
    from specq.engine.prompt.build import build_prompt
    from specq.engine.scoring.scorer import SpecPrefillScorer

    model = llama.Model(tiny_models.speculator, n_gpu_layers=0)
    prompt = build_prompt(model, TEXT[:3500], "Who moved where?")
    one = SpecPrefillScorer(model, n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=2, flash_attn=True, n_parallel=1)
    par = SpecPrefillScorer(model, n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=2, flash_attn=True, n_parallel=3,
                            call_tokens=128)
    a = one.score(prompt, window=700, lookahead=5, pool=13)
    b = par.score(prompt, window=700, lookahead=5, pool=13)
    assert a.windows == b.windows
    np.testing.assert_allclose(a.scores, b.scores, rtol=2e-2, atol=1e-3)
    assert np.corrcoef(a.scores, b.scores)[0, 1] > 0.999
    one.close()
    par.close()
    model.close()
