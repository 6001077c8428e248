"""The PyTorch speculator (engine/scoring/torch_speculator.py) against llama.cpp on the tiny random-weight GGUFs.

Measured on the tiny F16 models (CPU, torch float32 with an F16 KV cache like llama.cpp's): logits of a
364-token prompt differ by at most 0.011-0.013 (logit std ~2.9), argmax equal at every position; window scores
correlate at >= 0.999994 per window (max relative difference 0.3%), kept sets at keep 0.3 identical. The
bars below leave room for other CPUs' kernels. Each comparison is also run with a wrong RoPE base (logits off
by 6-7, argmax equal at 38-48% of positions; scores correlating at 0.13, kept Jaccard 0.26), which must fail
it: the checks tell a right forward from a wrong one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from specq.engine.llama import binding as llama  # noqa: E402
from specq.engine.scoring.selection import select_kept  # noqa: E402

pytestmark = [pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "python-license.txt").read_text()
#: a base the tiny models were not written with (theirs: 1e6)
WRONG_ROPE_BASE = 10_000.0
#: largest |torch - llama.cpp| of a logit (logit std ~3 on these models; measured 0.011-0.013)
LOGIT_ATOL = 0.05


def _llama_logits(path: Path, tokens: list[int]) -> np.ndarray:
    """llama.cpp's logits of every prompt position (flash attention on, as the scorer runs)."""
    model = llama.Model(path, n_gpu_layers=0)
    ctx = llama.Context(model, n_ctx=1024, n_batch=1024, n_ubatch=512, n_threads=2, flash_attn=True)
    try:
        ctx.decode(tokens, range(len(tokens)), logits="all")
        return np.stack([ctx.logits_row(i) for i in range(len(tokens))])
    finally:
        ctx.close()
        model.close()


def _torch_logits(path: Path, tokens: list[int], **kw) -> np.ndarray:
    from specq.engine.scoring.torch_speculator import TorchSpeculator

    spec = TorchSpeculator(path, **kw)
    logits, _ = spec.forward(tokens, 0, spec.new_cache(len(tokens)), logits="all")
    return logits.numpy()


@pytest.mark.parametrize("which", ["target", "speculator"])
def test_logits_match_llama_cpp(tiny_models, which):
    """Every position's logits of a short prompt: within LOGIT_ATOL of llama.cpp's, the same argmax at
    every position; with a wrong RoPE base the same comparison fails."""
    path = getattr(tiny_models, which)
    model = llama.Model(path, n_gpu_layers=0)
    tokens = model.tokenize(TEXT[:400])
    model.close()
    assert 60 < len(tokens) < 1024
    want = _llama_logits(path, tokens)
    got = _torch_logits(path, tokens)
    assert got.shape == want.shape
    diff = np.abs(got - want).max()
    assert diff < LOGIT_ATOL, diff
    assert (got.argmax(-1) == want.argmax(-1)).all()
    # teeth: the rope base alone wrong (position 0 is unrotated, so only later positions can differ)
    wrong = _torch_logits(path, tokens, rope_base=WRONG_ROPE_BASE)
    assert np.abs(wrong - want).max() > 10 * LOGIT_ATOL
    assert (wrong.argmax(-1) != want.argmax(-1)).mean() > 0.2


def test_chunked_prefill_equals_one_call(tiny_models):
    """A prefill in calls of 37 tokens' worth of work (groups of layers over every token, after_call after
    each) leaves the same KV cache as one call, and as a token-by-token decode (masked later positions)."""
    from specq.engine.scoring.torch_speculator import TorchSpeculator

    spec = TorchSpeculator(tiny_models.speculator)
    model = llama.Model(tiny_models.speculator, n_gpu_layers=0)
    tokens = model.tokenize(TEXT[:600])
    model.close()
    one, chunked, stepped = (spec.new_cache(len(tokens)) for _ in range(3))
    calls = []
    spec.prefill(tokens, one)
    spec.prefill(tokens, chunked, call_tokens=37, after_call=lambda: calls.append(1))
    per = max(1, spec.cfg.n_layer * 37 // len(tokens))
    assert len(calls) == -(-spec.cfg.n_layer // per) > 1
    for a in range(0, len(tokens), 50):  # the forward's own later chunks: positions a.. over cells [0, a)
        spec.forward(tokens[a:a + 50], a, stepped, logits="none")
    for il in range(spec.cfg.n_layer):
        torch.testing.assert_close(chunked.k[il], one.k[il], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(chunked.v[il], one.v[il], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(stepped.k[il], one.k[il], atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(stepped.v[il], one.v[il], atol=2e-3, rtol=1e-3)


def test_device_score_formula_equals_numpys(tiny_models):
    """On a GPU the torch speculator scores with score_torch.tensor_scores (nothing leaves the device); here,
    on CPU tensors, that formula must give scorer.attention_scores' numbers for the same queries and keys."""
    from specq.engine.scoring.score_torch import tensor_scores
    from specq.engine.scoring.torch_speculator import TorchSpeculator

    spec = TorchSpeculator(tiny_models.speculator)
    model = llama.Model(tiny_models.speculator, n_gpu_layers=0)
    tokens = model.tokenize(TEXT[:900])
    model.close()
    n = len(tokens)
    cache = spec.new_cache(n + 4)
    spec.prefill(tokens[:-1], cache)
    rows, tok = [], tokens[-1]
    for step in range(4):
        logits, q = spec.forward([tok], n - 1 + step, cache, keep_q=True)
        rows.append({il: qq[0] for il, qq in q.items()})
        tok = int(torch.argmax(logits))
    host = spec.scores(rows, cache, n, 13)
    Q = torch.stack([torch.stack([row[il] for row in rows]) for il in range(spec.cfg.n_layer)])
    dev = tensor_scores(Q, [(lambda il=il: cache.k[il][0, :n]) for il in range(spec.cfg.n_layer)], 13)
    assert host.shape == dev.shape == (n,) and host.std() > 0
    np.testing.assert_allclose(dev, host, rtol=1e-4, atol=1e-6)


def _kept(prompt, scores: np.ndarray, keep: float = 0.3) -> set[int]:
    return set(select_kept(scores, doc_start=prompt.doc_start, n_prompt=prompt.n, protected=prompt.protected_indices(),
                           keep=keep, chunk=32))


def _jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / len(a | b)


def test_window_scores_match_the_llama_scorer(tiny_models):
    """The windowed scorer with speculator_impl=torch: per-token scores of every window correlate with
    llama.cpp's at > 0.99999, the kept set at keep 0.3 overlaps by Jaccard >= 0.99, and the windows were
    prefilled over the same positions; a wrong RoPE base drops below both bars."""
    from specq.engine.prompt.build import build_prompt
    from specq.engine.scoring.scorer import SpecPrefillScorer
    from specq.engine.scoring.torch_speculator import TorchSpeculator

    model = llama.Model(tiny_models.speculator, n_gpu_layers=0)
    prompt = build_prompt(model, TEXT[:3500], "Who moved where?")
    kw = dict(n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=2, flash_attn=True)
    ref = SpecPrefillScorer(model, **kw)
    mine = SpecPrefillScorer(model, torch_speculator=TorchSpeculator(tiny_models.speculator), **kw)
    a = ref.score(prompt, window=700, lookahead=5, pool=13)
    b = mine.score(prompt, window=700, lookahead=5, pool=13)
    assert a.windows == b.windows >= 5 and a.plan == b.plan
    assert mine.prefill_spans == ref.prefill_spans and mine.prefilled_tokens == ref.prefilled_tokens
    assert np.isfinite(b.scores).all() and b.scores.std() > 0
    for s, e in a.plan:  # each window on its own, not only the whole document
        assert np.corrcoef(a.scores[s:e], b.scores[s:e])[0, 1] > 0.99999
    np.testing.assert_allclose(b.scores, a.scores, rtol=1e-2, atol=1e-2)
    assert _jaccard(_kept(prompt, a.scores), _kept(prompt, b.scores)) >= 0.99
    assert set(b.timings_ms) == {"speculator_prefill", "lookahead", "score_math"}

    mine.torch_speculator = TorchSpeculator(tiny_models.speculator, rope_base=WRONG_ROPE_BASE)
    wrong = mine.score(prompt, window=700, lookahead=5, pool=13)
    assert np.corrcoef(a.scores, wrong.scores)[0, 1] < 0.99
    assert _jaccard(_kept(prompt, a.scores), _kept(prompt, wrong.scores)) < 0.9
    ref.close()
    mine.close()
    model.close()


def test_unsupported_architecture_is_refused(tmp_path):
    """A GGUF of another architecture: a clear UnsupportedSpeculator naming it, before any weight is read."""
    import gguf

    from specq.contracts import ModelError
    from specq.engine.scoring.torch_speculator import TorchSpeculator, UnsupportedSpeculator

    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedSpeculator, match="architecture is 'gpt2'") as err:
        TorchSpeculator(path)
    assert isinstance(err.value, ModelError)
    # what speculator_impl auto asks before choosing the forward (no weights read)
    from specq.engine.scoring.torch_speculator import unsupported

    assert "architecture is 'gpt2'" in unsupported(path) and "missing.gguf" in unsupported(tmp_path / "missing.gguf")
    with pytest.raises(ModelError, match="not found"):
        TorchSpeculator(tmp_path / "missing.gguf")


def test_unknown_speculator_impl_is_refused(tiny_models):
    from specq.contracts import ModelError
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, speculator_impl="onnx"))
    try:
        with pytest.raises(ModelError, match="unknown speculator_impl 'onnx'"):
            eng.scorer()
    finally:
        eng.close()


def test_engine_speculator_impl_is_llama_on_the_cpu_and_in_the_evidence_key(tiny_models):
    """EngineOptions.speculator_impl: auto by default, which is llama with the models on the CPU; torch runs the
    PyTorch forward (EngineInfo says so),
    keeps the same chunks here, and its evidence key names it (score_math "torch-speculator"), so a row of
    llama.cpp's speculator is no evidence for it while the default's key is unchanged."""
    from specq.engine.options import EngineOptions, RunParams
    from specq.engine.pipeline import Engine
    from specq.engine.policy.evidence_key import TORCH_SPECULATOR_KEY, EvidenceKey, first_difference

    params = RunParams(question="Who?", mode="specprefill", window=1024, keep=0.3, min_tokens=0, max_tokens=4)
    kw = dict(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0, n_ctx=8192)
    runs, keys = {}, {}
    for impl in ("llama", "torch"):
        opts = EngineOptions(**kw) if impl == "llama" else EngineOptions(speculator_impl=impl, **kw)
        eng = Engine(opts)
        try:
            runs[impl] = eng.run(TEXT[:4000], params)
            positions = "original" if eng.gaps_supported else "compressed"
            keys[impl] = eng.evidence_key(eng.tokenize_prompt(TEXT[:4000], params), params, positions)
        finally:
            eng.close()
    assert runs["llama"].engine.speculator_impl == "llama" and runs["torch"].engine.speculator_impl == "torch"
    assert runs["torch"].timings_ms["speculator_prefill"] > 0
    assert _jaccard(set(runs["llama"].kept_indices), set(runs["torch"].kept_indices)) >= 0.99
    assert keys["llama"].score_math == "numpy" and keys["torch"].score_math == TORCH_SPECULATOR_KEY
    assert first_difference(keys["torch"], keys["llama"]) == "score_math"
    assert EvidenceKey.from_dict(keys["torch"].as_dict()) == keys["torch"]  # a valid key, stored and read back


def test_auto_speculator_impl_says_why_it_chose_llama(tiny_models, monkeypatch):
    """auto: llama with the models on the CPU; with them on a GPU, torch only where PyTorch runs there. This
    machine's PyTorch has no CUDA device, so the GPU branch (the target's placement read as a GPU's) chooses
    llama and names PyTorch's reason; the evidence key follows the choice."""
    from specq.engine.llama import invariance
    from specq.engine.options import EngineOptions, RunParams
    from specq.engine.pipeline import Engine

    kw = dict(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0, n_ctx=4096)
    eng = Engine(EngineOptions(**kw))
    try:
        assert eng.options.speculator_impl == "auto"
        assert eng.speculator_impl() == "llama" and eng.speculator_impl_reason == "auto: the models are on the CPU"
    finally:
        eng.close()
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine's PyTorch has a CUDA device: auto would choose torch")
    monkeypatch.setattr(invariance, "on_cpu", lambda options, backend: False)
    eng = Engine(EngineOptions(**kw))
    try:
        assert eng.speculator_impl() == "llama" and eng.speculator_impl_reason == "auto: PyTorch has no CUDA device"
        params = RunParams(question="Who?", mode="specprefill", window=1024, keep=0.3, min_tokens=0, max_tokens=4)
        key = eng.evidence_key(eng.tokenize_prompt(TEXT[:2000], params), params, "original")
        assert key.score_math != "torch-speculator"
    finally:
        eng.close()


def test_speculator_impl_setting(monkeypatch):
    """SPECQ_SPECULATOR_IMPL reaches the worker's EngineOptions; a bad value stops the process with a message."""
    from specq.settings import ServiceSettings, SettingsError

    monkeypatch.setenv("SPECQ_SPECULATOR_IMPL", "torch")
    assert ServiceSettings.from_env().engine_options().speculator_impl == "torch"
    monkeypatch.delenv("SPECQ_SPECULATOR_IMPL")
    assert ServiceSettings.from_env().engine_options().speculator_impl == "auto"
    monkeypatch.setenv("SPECQ_SPECULATOR_IMPL", "onnx")
    with pytest.raises(SettingsError, match="SPECQ_SPECULATOR_IMPL must be auto, llama or torch"):
        ServiceSettings.from_env()


def test_bench_ttft_runs_the_speculator_implementation_it_is_given(tiny_models, tmp_path):
    """`specq bench ttft --speculator-impl torch` scores with the PyTorch forward (the report's engine says so);
    a value that is neither llama nor torch is refused before any model loads."""
    import json

    from typer.testing import CliRunner

    from specq.cli import app

    out = tmp_path / "ttft.json"
    args = ["bench", "ttft", "--lengths", "300", "--reps", "1", "--batch-invariant", "auto", "--n-gpu-layers", "0",
            "--threads", "2", "--target", str(tiny_models.target), "--speculator", str(tiny_models.speculator)]
    got = CliRunner().invoke(app, [*args, "--speculator-impl", "torch", "--out", str(out)])
    assert got.exit_code == 0, got.output
    report = json.loads(out.read_text())
    assert report["engine"]["speculator_impl"] == "torch" and report["rows"][0]["length"] == 300 and report["rows"][0]["specprefill_ttft_ms"] > 0
    bad = CliRunner().invoke(app, [*args, "--speculator-impl", "cuda"])
    assert bad.exit_code != 0 and "--speculator-impl must be auto, llama or torch" in bad.output


@pytest.mark.parametrize("eog", ["none", "odd", "all"])
def test_windows_scored_together_equal_one_at_a_time(tiny_models, eog):
    """score_windows with the windows in one batch (as on a GPU: padded prefill, one forward per look-ahead
    step for all, greedy tokens kept on the device) gives each window the scores it gets alone, also when
    windows stop at an end-of-generation token after different steps ("odd": every odd token ends one)."""
    from specq.engine.scoring.torch_speculator import TorchSpeculator

    spec = TorchSpeculator(tiny_models.speculator)
    model = llama.Model(tiny_models.speculator, n_gpu_layers=0)
    tokens = model.tokenize(TEXT[:2400])
    model.close()
    windows = [tokens[:300], tokens[300:520], tokens[520:900]]  # unequal: the batch pads
    is_eog = {"none": None, "odd": lambda t: t % 2 == 1, "all": lambda t: True}[eog]
    alone, together = {}, {}
    one = [spec.score_window(w, 6, 13, is_eog=is_eog, timings=alone) for w in windows]
    calls = []
    both = spec.score_windows(windows, 6, 13, is_eog=is_eog, call_tokens=90, after_call=lambda: calls.append(1),
                              timings=together, batch=3)
    # 90 tokens' worth of work a call: groups of layers over all 3 windows' (padded) tokens
    assert len(calls) == -(-spec.cfg.n_layer // max(1, spec.cfg.n_layer * 90 // (3 * (len(windows[2]) - 1))))
    for a, b, w in zip(one, both, windows):
        assert a.shape == b.shape == (len(w),) and a.std() > 0
        np.testing.assert_allclose(b, a, rtol=2e-3, atol=2e-3)
    assert set(together) == {"speculator_prefill", "lookahead", "score_math"}
    # teeth: the same windows scored with the steps cut at once differ from the full look-ahead
    if eog == "none":
        cut = spec.score_windows(windows, 6, 13, is_eog=lambda t: True, batch=3)
        assert max(np.abs(c - a).max() for c, a in zip(cut, one)) > 1e-2


def test_the_worker_says_who_runs_the_speculator(tmp_path, tiny_models):
    """`specq up` with its warm-up (a specprefill job) logs, when ready, which implementation scored and why auto
    chose it: llama.cpp on this CPU machine."""
    import time

    from service_helpers import embedded_up

    with embedded_up(tmp_path, tiny_models) as st:
        deadline = time.monotonic() + 120
        while "ready: target" not in st.log("up") and time.monotonic() < deadline:
            time.sleep(0.5)
        log = st.log("up")
    ready = next((line for line in log.splitlines() if "ready: target" in line), log[-3000:])
    assert "run by llama.cpp (auto: the models are on the CPU)" in ready, ready
