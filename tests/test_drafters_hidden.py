"""MTP and EAGLE3 drafters (drafters_hidden.py) on real llama.cpp with tiny random-weight models.

`glm4moe`: a GLM-4.5-layout target with an MTP block (synthetic_archs.py); `qwen3` + `eagle3`: a
Qwen3-layout target and an EAGLE3 head reading three of its layers. Random weights never agree with
the target, so rollback at every offset is exercised with `ForcedDrafter` (the real drafter does all
its work, its proposal is replaced by the target's continuation corrupted at a random offset).
Baseline and sparse prefill (kept tokens at original positions, gaps in between) both.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from tests.conftest import llama_cpp
from tests.test_speculative import DOC, QUESTION, _broken_verify, _greedy_distinct, chi_square

pytestmark = [pytest.mark.engine, pytest.mark.skipif(llama_cpp is None, reason="llama-cpp-python is not installed")]


class HiddenModels(NamedTuple):
    #: glm4moe with an MTP block, greedy output that keeps changing
    mtp_target: Path
    #: qwen3 target (varied output) and an EAGLE3 head for it
    qwen3_target: Path
    eagle3_head: Path
    #: qwen2 (no MTP layers, no layer inputs for EAGLE3), same vocabulary: the SpecPrefill scorer
    qwen2: Path


def _varied(root: Path, arch: str) -> Path:
    from specq.testing.synthetic_archs import write_arch_gguf

    best = None
    for seed in range(12):
        path = write_arch_gguf(root / f"{arch}{seed}.gguf", arch, "tiny", seed=seed, dtype="f32")
        distinct = _greedy_distinct(path)
        if best is None or distinct > best[0]:
            best = (distinct, path)
        if distinct >= 6:
            break
    assert best[0] >= 4, f"no seed gave a tiny {arch} with varied greedy output"
    return best[1]


@pytest.fixture(scope="module")
def hidden_models(tmp_path_factory, tiny_models) -> HiddenModels:
    from specq.testing.synthetic_archs import write_arch_gguf

    root = tmp_path_factory.mktemp("hidden_models")
    return HiddenModels(
        mtp_target=_varied(root, "glm4moe"),
        qwen3_target=_varied(root, "qwen3"),
        eagle3_head=write_arch_gguf(root / "eagle3.gguf", "eagle3", "tiny", seed=0, dtype="f32"),
        qwen2=tiny_models.speculator,
    )


# ------------------------------------------------------------------------------------------ setup


class Rig(NamedTuple):
    kind: str
    target: object  # Model
    ctx: object  # the target's Context
    dctx: object  # the drafter's Context
    make: object  # fill -> a fresh drafter
    layers: list


def _rig(models: HiddenModels, kind: str, n_ctx: int = 2048, threads: int = 1) -> Rig:
    from specq.engine.decode.drafters_hidden import Eagle3Drafter, MtpDrafter, open_eagle3_context, open_mtp_context
    from specq.engine.llama.invariance import INVARIANT_TYPE_K
    from specq.engine.llama.binding import Context, Model
    from specq.engine.llama.ext import set_hidden_output

    if kind == "mtp":
        target = Model(models.mtp_target, n_gpu_layers=0, repack=False, load_mtp=True)
        ctx = Context(target, n_ctx=n_ctx, n_threads=threads, type_k=INVARIANT_TYPE_K, position_gaps=True)  # sparse prefills
        set_hidden_output(ctx, True)
        dctx = open_mtp_context(ctx, n_threads=threads, n_seq=3)
        return Rig(kind, target, ctx, dctx, lambda fill="kept", **kw: MtpDrafter(dctx, fill=fill, **kw), [])
    target = Model(models.qwen3_target, n_gpu_layers=0, repack=False)
    ctx = Context(target, n_ctx=n_ctx, n_threads=threads, type_k=INVARIANT_TYPE_K, position_gaps=True)
    head = Model(models.eagle3_head, n_gpu_layers=0)
    dctx, layers = open_eagle3_context(head, ctx, n_threads=threads, n_seq=3)
    return Rig(kind, target, ctx, dctx,
               lambda fill="kept", **kw: Eagle3Drafter(dctx, layers, target.n_embd, fill=fill, **kw), layers)


@pytest.fixture(scope="module", params=["mtp", "eagle3"])
def rig(request, hidden_models):
    r = _rig(hidden_models, request.param)
    yield r
    r.dctx.close()
    r.ctx.close()


def _kept(n: int, sparse: bool) -> list[int]:
    if not sparse:
        return list(range(n))
    rng = np.random.default_rng(n)
    return sorted(set(rng.choice(n, size=n // 2, replace=False).tolist()) | {n - 1})


# ------------------------------------------------------------------------------------------ unit


def test_llama_ext_functions_are_bound():
    """The staging header's functions are found (under their C++ names) in our build."""
    from specq.engine.llama import ext as llama_ext

    assert llama_ext.missing() == []
    assert llama_ext._mangled("llama_set_embeddings_nextn", "P13llama_context", "b", "b") == \
        "_Z26llama_set_embeddings_nextnP13llama_contextbb"


def test_synthetic_archs_layouts(hidden_models, tmp_path):
    from specq.testing.synthetic import read_hparams
    from specq.testing.synthetic_archs import GLM_SHAPES, estimate_arch_bytes, write_arch_gguf

    h = read_hparams(hidden_models.mtp_target)
    assert h["architecture"] == "glm4moe" and h["n_layer"] == 5  # 4 trunk layers + the MTP block
    t = h["tensors"]
    assert "blk.4.nextn.eh_proj.weight" in t and t["blk.4.ffn_gate_exps.weight"][0] == (128, 64, 4)
    assert "blk.3.ffn_gate_inp.weight" not in t  # the tiny trunk is dense
    e = read_hparams(hidden_models.eagle3_head)
    assert e["architecture"] == "eagle3" and e["tensors"]["fc.weight"][0] == (384, 128)
    # the GPU shape: GLM-4.5-Air's active path (8 routed + 1 shared expert of 1408, 96/8 heads of 128)
    air = GLM_SHAPES["glm45-air-8e"]
    assert (air.n_layer, air.n_embd, air.n_head, air.n_head_kv, air.head_dim, air.n_expert_used) == (46, 4096, 96, 8, 128, 8)
    n_params = estimate_arch_bytes("glm4moe", "glm45-air-8e", n_vocab=151552) / 2
    assert 13.0e9 < n_params < 14.5e9, n_params
    with pytest.raises(ValueError, match="n_expert_used"):
        write_arch_gguf(tmp_path / "x.gguf", "glm4moe", "tiny", n_expert_used=9)
    assert not list(tmp_path.iterdir())


def test_auto_prefers_the_models_own_drafter():
    from specq.engine.decode.drafters import resolve_auto

    assert resolve_auto("auto", "cpu", ["mtp", "eagle3"]) == "mtp"
    assert resolve_auto("auto", "cuda", ["eagle3"]) == "eagle3"
    assert resolve_auto("auto", "cpu", []) == "ngram"
    assert resolve_auto("mtp", "cpu", []) == "mtp"


# ------------------------------------------------------------------------------------------ greedy, engine


@pytest.fixture(scope="module")
def mtp_engine(hidden_models):
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(hidden_models.mtp_target), speculator=str(hidden_models.qwen2),
                               n_gpu_layers=0, n_ctx=4096, n_threads=1, batch_invariant="on"))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def eagle3_engine(hidden_models):
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(hidden_models.qwen3_target), speculator=str(hidden_models.qwen2),
                               drafter=str(hidden_models.eagle3_head), n_gpu_layers=0, n_ctx=4096, n_threads=1,
                               batch_invariant="on"))
    yield eng
    eng.close()


def _params(**kw):
    from specq.engine.options import RunParams

    base = dict(question=QUESTION, mode="specprefill", min_tokens=0, keep=0.5, window=256, max_tokens=100)
    base.update(kw)
    return RunParams(**base)


@pytest.mark.parametrize("mode", ["baseline", "specprefill"])
@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_engine_greedy_identical_to_none(kind, mode, request):
    eng = request.getfixturevalue(f"{kind}_engine")
    assert eng.info.batch_invariant and eng.info.mtp == (kind == "mtp")
    doc = DOC[:1500]
    ref = eng.run(doc, _params(mode=mode, draft="none"))
    assert len(set(ref.tokens)) >= 3 and ref.spec.mode == mode
    if mode == "specprefill":
        assert ref.usage.kept_tokens < ref.usage.prompt_tokens
    for draft in (kind, "auto"):
        r = eng.run(doc, _params(mode=mode, draft=draft, n_draft=4))
        assert r.tokens == ref.tokens, f"{draft} changed the greedy output"
        assert r.draft.method == kind and r.draft.verify_batches > 10
        assert r.draft.drafted - r.draft.accepted >= 10  # random heads: rejections everywhere
    if kind == "eagle3":
        assert eng.info.drafter == Path(request.getfixturevalue("hidden_models").eagle3_head).name


def test_mtp_refused_without_mtp_layers(tiny_models, hidden_models):
    from specq.contracts import InputError
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator),
                               drafter=str(hidden_models.eagle3_head), n_gpu_layers=0, n_ctx=1024, n_threads=1))
    try:
        assert not eng.info.mtp and "has no MTP (NextN) layers" in eng.mtp_unsupported
        with pytest.raises(InputError, match="draft mtp is not available: target .* has no MTP"):
            eng.run("some text", _params(mode="baseline", draft="mtp", max_tokens=4))
        # a Qwen2 target never extracts the layer inputs EAGLE3 reads: refused, not aborted in llama.cpp
        with pytest.raises(InputError, match="draft eagle3 is not available: .*qwen2 graph does not extract"):
            eng.run("some text", _params(mode="baseline", draft="eagle3", max_tokens=4))
        assert eng.run("some text", _params(mode="baseline", draft="auto", max_tokens=4)).draft.method == "ngram"
    finally:
        eng.close()


def test_eagle3_refused_without_a_head(mtp_engine):
    from specq.contracts import InputError

    with pytest.raises(InputError, match="no EAGLE3 head configured"):
        mtp_engine.run("some text", _params(mode="baseline", draft="eagle3", max_tokens=4))


# ------------------------------------------------------------------------------------------ rollback


class CacheSpy:
    """Follows every write to and removal from the drafter's sequence: position -> (token, input row)."""

    def __init__(self, drafter, monkeypatch) -> None:
        self.cells: dict[int, tuple[int, np.ndarray]] = {}
        batch, dctx, mine = drafter._batch, drafter.ctx, drafter.seq
        real_decode, real_rm = batch.decode, dctx.seq_rm

        def decode(ctx, tokens, positions, embd, **kw):
            for t, p, row in zip(tokens, positions, np.asarray(embd)):
                assert p not in self.cells, f"position {p} written twice"
                self.cells[int(p)] = (int(t), np.array(row))
            return real_decode(ctx, tokens, positions, embd, **kw)

        def seq_rm(seq, p0, p1=-1):
            if seq == mine:
                for p in [p for p in self.cells if p >= p0 and (p1 < 0 or p < p1)]:
                    del self.cells[p]
            return real_rm(seq, p0, p1)

        monkeypatch.setattr(batch, "decode", decode)
        monkeypatch.setattr(dctx, "seq_rm", seq_rm)


def _reference_rows(r: Rig, tokens: list[int], positions: list[int]) -> np.ndarray:
    """What the drafter should have read for these target tokens, from a fresh target context that
    decodes them in one batch: MTP the final hidden states, EAGLE3 g = fc(its layers' inputs)."""
    from specq.engine.llama.invariance import INVARIANT_TYPE_K
    from specq.engine.llama.binding import Context
    from specq.engine.llama.ext import (
        EmbdBatch, enable_layer_inputs, encoder_output, hidden_rows, layer_input_rows, n_embd_out, set_hidden_output,
    )

    ref = Context(r.target, n_ctx=r.ctx.n_ctx, n_batch=len(tokens), n_ubatch=len(tokens), n_threads=1,
                  type_k=INVARIANT_TYPE_K, position_gaps=True)  # the kept tokens' original positions
    try:
        n = len(tokens)
        if r.kind == "mtp":
            set_hidden_output(ref, True)
            ref.decode(tokens, positions, logits="last")
            return hidden_rows(ref, range(n))
        enable_layer_inputs(ref, r.layers)
        ref.decode(tokens, positions, logits="last")
        feats = np.concatenate([layer_input_rows(ref, lid, 0, n) for lid in r.layers], axis=1)
        width = n_embd_out(r.dctx.model)
        out = np.empty((n, width), dtype=np.float32)
        enc = EmbdBatch(r.dctx.n_ubatch, feats.shape[1])
        for s in range(0, n, r.dctx.n_ubatch):
            e = min(s + r.dctx.n_ubatch, n)
            enc.encode(r.dctx, feats[s:e], seq=1)
            out[s:e] = encoder_output(r.dctx, e - s, width)
        return out
    finally:
        ref.close()


@pytest.mark.parametrize("sparse", [False, True], ids=["baseline", "sparse"])
def test_rollback_long_decode_keeps_drafter_in_step(rig, sparse, monkeypatch):
    """240 greedy tokens with drafts rejected at every offset: the target's tokens are plain greedy's,
    and the drafter's cache holds exactly one pair per accepted target token — the pair its input
    convention defines, from the target's own states (checked against a fresh one-batch recompute)."""
    from specq.bench.forced import ForcedDrafter
    from specq.engine.decode.loop import generate
    from specq.engine.decode.prefill import sparse_prefill
    from specq.engine.prompt.build import build_prompt
    from specq.engine.decode.sampling import Sampler

    target, ctx = rig.target, rig.ctx
    prompt = build_prompt(target, DOC[:700], QUESTION).tokens
    n, kept = len(prompt), _kept(len(prompt), sparse)
    pre = sparse_prefill(ctx, prompt, kept)
    plain = generate(ctx, prompt, pre.logits, pre.next_pos, max_tokens=240, sampler=Sampler())
    assert len(plain.tokens) == 240 and len(set(plain.tokens)) >= 4

    k = 6
    inner = rig.make()
    spy = CacheSpy(inner, monkeypatch)
    drafter = ForcedDrafter(inner, plain.tokens, n, rate=0.7, n_vocab=target.n_vocab, seed=5)
    pre = sparse_prefill(ctx, prompt, kept, observe=drafter.observe)
    got = generate(ctx, prompt, pre.logits, pre.next_pos, max_tokens=240, sampler=Sampler(), drafter=drafter, n_draft=k)
    assert got.tokens == plain.tokens
    assert set(got.draft.accepted_lens) == set(range(k + 1)), got.draft.accepted_lens  # every offset, and none
    # the target's cache: the kept prompt tokens + the accepted output (the last token may be pending)
    n_cached = ctx.seq_pos_max(0) + 1 - pre.next_pos
    assert n_cached in (len(got.tokens) - 1, len(got.tokens))
    tokens = [prompt[i] for i in kept] + got.tokens[:n_cached]
    positions = list(kept) + list(range(pre.next_pos, pre.next_pos + n_cached))
    pending = got.tokens[n_cached] if n_cached < len(got.tokens) else 0

    inner.propose(prompt + got.tokens[:n_cached] + [pending], 1)  # writes what waits, plus a seed
    incremental = rig.dctx.logits_row(-1)
    assert rig.dctx.seq_pos_max(inner.seq) == positions[-1] + (1 if rig.kind == "mtp" else 0)
    monkeypatch.undo()
    rows = _reference_rows(rig, tokens, positions)
    if rig.kind == "mtp":  # (x_p, h of the token before p), the seed (pending, h_last) after the last
        expect = {positions[j]: (tokens[j], rows[j - 1]) for j in range(1, len(tokens))}
        expect[positions[-1] + 1] = (pending, rows[-1])
    else:  # (the token after p, g_p), the last one paired with the pending token
        nxt = tokens[1:] + [pending]
        expect = {positions[j]: (nxt[j], rows[j]) for j in range(len(tokens))}
    assert sorted(spy.cells) == sorted(expect)
    for p, (tok, row) in expect.items():
        got_tok, got_row = spy.cells[p]
        assert got_tok == tok, p
        np.testing.assert_allclose(got_row, row, atol=2e-3, rtol=1e-3, err_msg=f"position {p}")

    # llama.cpp agrees: a fresh sequence holding exactly the expected pairs has as many cells and gives
    # the same next-token logits as the drafter's incremental cache
    size = llama_cpp.llama_state_seq_get_size
    n_bytes = size(rig.dctx.ptr, inner.seq)
    rig.dctx.seq_rm(inner.seq, 0, -1)  # room for the fresh one
    seq = 2  # the very rows the drafter wrote (the target's states differ by rounding between batch sizes)
    ps = sorted(spy.cells)
    inner._batch.decode(rig.dctx, [spy.cells[p][0] for p in ps], ps, np.stack([spy.cells[p][1] for p in ps]), seq=seq,
                        logits=inner._seed_logits)
    assert size(rig.dctx.ptr, seq) == n_bytes
    fresh = rig.dctx.logits_row(-1)
    # one batch vs many small ones: other flash-attention/matmul paths over f16 K/V, up to ~5e-2 apart
    # (logits std ~3)
    assert int(np.argmax(fresh)) == int(np.argmax(incremental))
    np.testing.assert_allclose(fresh, incremental, atol=0.1)
    rig.dctx.seq_rm(seq, 0, -1)


def test_fill_from_kept_tokens_is_closer_to_the_full_prompt(hidden_models):
    """After a sparse prefill, the EAGLE3 head's first draft distribution is closer (KL) to the one it
    has after a full prefill when it was fed the kept tokens at their original positions than when it
    starts at the first decoded token. (MTP: indistinguishable on these random weights, see
    docs/speculative-decoding.md; both are lossless.)"""
    from specq.engine.decode.prefill import sparse_prefill
    from specq.engine.prompt.build import build_prompt

    r = _rig(hidden_models, "eagle3")
    text = (Path(__file__).resolve().parent.parent / "examples" / "textwrap.py").read_text(encoding="utf-8")

    def first_draft_probs(prompt, kept, fill):
        d = r.make(fill)
        pre = sparse_prefill(r.ctx, prompt, kept, observe=d.observe)
        d.propose(prompt + [int(np.argmax(pre.logits))], 1)
        z = r.dctx.logits_row(-1).astype(np.float64)
        p = np.exp(z - z.max())
        return p / p.sum()

    def kl(p, q):
        return float(np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12))))

    try:
        wins = 0
        for trial in range(5):
            prompt = build_prompt(r.target, text[trial * 700: trial * 700 + 900], "Explain.").tokens
            n = len(prompt)
            kept = sorted(set(np.random.default_rng(trial).choice(n, size=n // 2, replace=False).tolist())
                          | set(range(n - 20, n)))
            dense = first_draft_probs(prompt, list(range(n)), "kept")
            wins += kl(dense, first_draft_probs(prompt, kept, "kept")) < kl(dense, first_draft_probs(prompt, kept, "decoded"))
        assert wins >= 4, wins
    finally:
        r.dctx.close()
        r.ctx.close()


# ------------------------------------------------------------------------------------------ sampling


def _sample_pairs(r: Rig, n_draft: int, trials: int, rule: str | None, sparse: bool, monkeypatch):
    """Empirical (t2, t3) after a pinned t1 vs the target's exact joint distribution (as in
    test_speculative), the hidden-state drafter sampling from a hotter, wider transform of its logits."""
    import specq.engine.decode.loop as decode_mod
    from specq.engine.decode.prefill import sparse_prefill
    from specq.engine.decode.sampling import Sampler
    from specq.engine.decode.speculative import verify

    temperature, top_k = 1.0, 6
    ctx = r.ctx
    prompt = r.target.tokenize("def dedent(text):\n    margin = None\n    text = ")
    kept = _kept(len(prompt), sparse)
    pre = sparse_prefill(ctx, prompt, kept)
    a = int(np.argmax(pre.logits))
    pinned = np.full_like(pre.logits, -1e9)
    pinned[a] = 0.0
    s = Sampler(temperature, top_k)
    P = pre.next_pos
    ctx.decode([a], [P])
    p2 = s.probs(ctx.logits_row(-1))
    exact = {}
    for b in np.flatnonzero(p2):
        ctx.seq_rm(0, P + 1)
        ctx.decode([int(b)], [P + 1])
        p3 = s.probs(ctx.logits_row(-1))
        for c in np.flatnonzero(p3):
            exact[int(b), int(c)] = float(p2[b] * p3[c])

    state = {"emitted": 1, "residual": 0}

    def recording(draft, rows, sampler):
        got = (_broken_verify(rule) if rule else verify)(draft, rows, sampler)
        if got[1] < len(draft.tokens) and state["emitted"] + got[1] in (1, 2):
            state["residual"] += 1
        state["emitted"] += got[1] + 1
        assert draft.probs is not None  # the drafter's own q
        return got

    monkeypatch.setattr(decode_mod, "verify", recording)
    counts = {}
    for trial in range(trials):
        state["emitted"] = 1
        drafter = r.make(sampler=Sampler(2.0, 10, seed=50_000 + trial))
        pre = sparse_prefill(ctx, prompt, kept, observe=drafter.observe)
        g = decode_mod.generate(ctx, prompt, pinned, pre.next_pos, max_tokens=4,
                                sampler=Sampler(temperature, top_k, seed=trial), drafter=drafter, n_draft=n_draft)
        assert g.tokens[0] == a and len(g.tokens) >= 3
        counts[g.tokens[1], g.tokens[2]] = counts.get((g.tokens[1], g.tokens[2]), 0) + 1
    monkeypatch.undo()
    _, _, p_value = chi_square(counts, exact, trials)
    return p_value, state["residual"] / (2 * trials)


@pytest.mark.parametrize("sparse", [False, True], ids=["baseline", "sparse"])
def test_sampling_exact_with_the_drafters_q(rig, sparse, monkeypatch):
    p_value, residual_share = _sample_pairs(rig, 2, 1500, None, sparse, monkeypatch)
    assert residual_share >= 0.30, residual_share
    assert p_value > 1e-3, p_value


def test_sampling_check_catches_a_broken_rule(hidden_models, monkeypatch):
    r = _rig(hidden_models, "mtp")
    try:
        p_value, _ = _sample_pairs(r, 2, 2000, "no_subtract", False, monkeypatch)
        assert p_value < 1e-6, p_value
    finally:
        r.dctx.close()
        r.ctx.close()


# ------------------------------------------------------------------------------------------ CLI


def test_cli_run_with_an_eagle3_head(hidden_models, tmp_path):
    import json

    from typer.testing import CliRunner

    from specq.cli import app

    doc = tmp_path / "doc.py"
    doc.write_text(DOC[:800], encoding="utf-8")
    res = CliRunner().invoke(app, [
        "run", str(doc), "-q", QUESTION, "--draft", "eagle3", "--drafter", str(hidden_models.eagle3_head),
        "--max-tokens", "12", "--target", str(hidden_models.qwen3_target), "--speculator", str(hidden_models.qwen2),
        "--n-gpu-layers", "0", "--threads", "1", "--n-ctx", "2048", "--json",
    ])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["draft"]["method"] == "eagle3" and out["engine"]["drafter"] == hidden_models.eagle3_head.name


# ------------------------------------------------------------------------------------------ benchmark


def test_bench_drafters_runs_and_forces_the_rate(hidden_models):
    """`specq bench drafters` end to end on tiny models (not timed: its numbers are not checked), and the
    forced acceptance is what was asked: 0 accepts nothing, 1 everything; output always none's."""
    from specq.bench.drafters import predicted_ratio, run_drafters_bench
    from specq.engine.options import EngineOptions

    opts = EngineOptions(target=str(hidden_models.mtp_target), speculator=str(hidden_models.qwen2), n_gpu_layers=0,
                         n_ctx=1024, n_threads=1, batch_invariant="on")
    report = run_drafters_bench(opts, methods=("ngram", "model", "mtp"), rates=(0.0, 1.0), n_draft=3, max_tokens=16,
                                prompt_tokens=200, reps=1, say=lambda m: None)
    units = report["unit_ms"]
    assert set(units["target_verify"]) == {"1", "2", "3"} and units["mtp_step"] > 0 and units["speculator_decode_1"] > 0
    rows = {(r["method"], r["rate"]): r for r in report["curve"]}
    assert len(rows) == 6 and all(r["same_as_none"] for r in rows.values())
    for m in ("ngram", "model", "mtp"):
        assert rows[m, 0.0]["accept_rate"] == 0.0 and rows[m, 1.0]["accept_rate"] == 1.0
        assert rows[m, 1.0]["mean_accepted_len"] >= 2.5  # full drafts (the last batch may be shorter)
    assert predicted_ratio(units, "ngram", 1.0, 3) == round(4 * units["target_decode_1"] / units["target_verify"]["3"], 3)


def test_drafter_setting_for_the_worker():
    from specq.settings import ServiceSettings

    assert ServiceSettings.from_env({}).engine_options().drafter == ""
    assert ServiceSettings.from_env({"SPECQ_DRAFTER": "/m/head.gguf"}).engine_options().drafter == "/m/head.gguf"
