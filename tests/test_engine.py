"""The foundation: sparse prefill at original positions on real llama.cpp, the run result object,
the stock-library fallback, and bad input at the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import numpy as np  # noqa: E402

from specq.engine.llama import binding as llama  # noqa: E402
from specq.contracts import InputError, ModelError  # noqa: E402
from specq.engine.options import DEFAULT_CHUNK_RULE, EngineOptions, RunParams  # noqa: E402
from specq.engine.decode.prefill import sparse_prefill  # noqa: E402

#: engine tests: counted by .ci/check_suites.py (a run where all of them skipped fails CI)
pytestmark = [pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "python-license.txt").read_text()


@pytest.fixture(scope="module")
def engine(tiny_models):
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0, n_ctx=4096))
    yield eng
    eng.close()


def gapped(n: int, every: int = 3) -> list[int]:
    """Keep runs of 8 tokens, skip runs of 16, always the last token."""
    kept = [i for i in range(n - 1) if (i // 8) % every == 0]
    return kept + [n - 1]


def test_patched_library_accepts_gaps(engine):
    assert llama.supports_position_gaps(engine.target) is True
    assert "+specq" in llama.library_version()


def test_gapped_prefill_keeps_original_positions(engine):
    ctx = engine.ctx
    tokens = engine.target.tokenize(TEXT[:600])
    n = len(tokens)
    kept = gapped(n)
    assert len(kept) < n / 2
    pre = sparse_prefill(ctx, tokens, kept, "original")
    assert pre.next_pos == n and pre.n_kept == len(kept)
    assert ctx.seq_pos_max(0) == n - 1
    # decoding continues at position N
    ctx.decode([int(np.argmax(pre.logits))], [n], logits="last")
    assert ctx.seq_pos_max(0) == n
    assert np.isfinite(ctx.logits_row(-1)).all()


def test_original_positions_reach_the_model(engine):
    tokens = engine.target.tokenize(TEXT[:600])
    kept = gapped(len(tokens))
    a = sparse_prefill(engine.ctx, tokens, kept, "original").logits
    b = sparse_prefill(engine.ctx, tokens, kept, "compressed").logits
    assert engine.ctx.seq_pos_max(0) == len(kept) - 1
    # the same tokens at other positions: RoPE must make the logits differ
    assert np.max(np.abs(a - b)) > 1e-3
    # and the same positions twice give the same logits (the difference is not noise)
    a2 = sparse_prefill(engine.ctx, tokens, kept, "original").logits
    np.testing.assert_allclose(a, a2, rtol=1e-4, atol=1e-4)


def test_sparse_prefill_refuses_bad_index_lists(engine):
    tokens = engine.target.tokenize("hello world")
    with pytest.raises(ValueError):
        sparse_prefill(engine.ctx, tokens, [0, 1], "original")  # last token missing
    with pytest.raises(ValueError):
        sparse_prefill(engine.ctx, tokens, [3, 1, len(tokens) - 1], "original")


def test_keeping_every_token_is_baseline(engine):
    doc = TEXT[:1500]
    base = engine.run(doc, RunParams(question="Who?", max_tokens=24))
    full = engine.run(doc, RunParams(question="Who?", max_tokens=24, mode="specprefill", keep=1.0, min_tokens=0))
    assert full.spec.mode == "specprefill"
    assert full.usage.kept_tokens == full.usage.prompt_tokens == base.usage.prompt_tokens
    assert full.tokens == base.tokens
    assert len(base.tokens) > 0


def test_small_n_batch_splits_the_prefill(tiny_models, engine):
    from specq.engine.pipeline import Engine

    small = Engine(EngineOptions(target=str(tiny_models.target), n_gpu_layers=0, n_ctx=4096, n_batch=64, n_ubatch=32))
    try:
        doc = TEXT[:1200]
        a = small.run(doc, RunParams(question="Who?", max_tokens=12))
        b = engine.run(doc, RunParams(question="Who?", max_tokens=12))
        assert a.usage.prompt_tokens > 64
        assert a.tokens == b.tokens
    finally:
        small.close()


def test_result_object_has_every_field(engine):
    r = engine.run(TEXT[:800], RunParams(question="Which?", max_tokens=8, seed=1, temperature=0.7, top_k=20)).to_dict()
    assert set(r) >= {"text", "finish_reason", "usage", "timings_ms", "spec", "engine", "draft", "warnings"}
    assert set(r["usage"]) == {"prompt_tokens", "kept_tokens", "completion_tokens"}
    assert set(r["timings_ms"]) >= {"tokenize", "score", "select", "sparse_prefill", "ttft", "decode", "total"}
    assert set(r["spec"]) == {"mode", "reason", "positions", "keep", "keep_source", "lookahead", "windows", "scorer",
                              "cache", "selection", "chunk_rule", "pipelined"}
    assert r["spec"]["chunk_rule"] == (DEFAULT_CHUNK_RULE if r["spec"]["mode"] == "specprefill" else "")
    assert set(r["engine"]) >= {"n_gpu_layers", "flash_attn", "n_batch", "n_ubatch", "backend"}
    assert r["finish_reason"] in ("stop", "length")
    assert 0 < r["timings_ms"]["ttft"] <= r["timings_ms"]["total"]
    json.dumps(r)


def test_seeded_sampling_repeats(engine):
    p = RunParams(question="Which?", max_tokens=16, seed=7, temperature=0.9, top_p=0.9)
    assert engine.run(TEXT[:500], p).tokens == engine.run(TEXT[:500], p).tokens


def test_prompt_longer_than_context_is_refused(engine):
    with pytest.raises(InputError, match="exceeds the target's context"):
        engine.run("x" * 5000, RunParams(max_tokens=8))


def test_mismatched_speculator_is_refused(tiny_models):
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.mismatched), n_gpu_layers=0, n_ctx=2048))
    try:
        with pytest.raises(ModelError, match="different vocabulary"):
            eng.run(TEXT[:2000], RunParams(mode="specprefill", min_tokens=0, max_tokens=4))
    finally:
        eng.close()


def test_progress_reports_phases_and_cancel(engine):
    from specq.contracts import RunCancelled

    seen = []
    engine.run(TEXT[:1500], RunParams(mode="specprefill", min_tokens=0, max_tokens=4), progress=lambda *a: seen.append(a))
    phases = [s[0] for s in seen]
    for phase in ("tokenize", "score", "select", "sparse_prefill", "decode"):
        assert phase in phases
    assert phases.index("score") < phases.index("sparse_prefill") < phases.index("decode")

    def cancel(phase, done, total):
        if phase == "sparse_prefill":
            raise RunCancelled("cancelled")

    with pytest.raises(RunCancelled):
        engine.run(TEXT[:1500], RunParams(max_tokens=4), progress=cancel)
    # the engine still serves the next run
    assert engine.run(TEXT[:300], RunParams(max_tokens=3)).usage.completion_tokens >= 0


# ---------------------------------------------------------------------------------------- CLI


def specq(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "specq.cli", *args], capture_output=True, text=True, env=e, timeout=timeout)


def tiny_args(tiny_models) -> list[str]:
    return ["--target", str(tiny_models.target), "--speculator", str(tiny_models.speculator), "--n-ctx", "4096"]


def test_cli_run_json(tiny_models, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT[:3000])
    p = specq("run", str(doc), "-q", "Who?", "--mode", "specprefill", "--min-tokens", "0", "--max-tokens", "6", "--json", *tiny_args(tiny_models))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["spec"]["mode"] == "specprefill" and r["spec"]["positions"] == "original"
    assert r["usage"]["kept_tokens"] < r["usage"]["prompt_tokens"]


def test_cli_run_table(tiny_models, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT[:1000])
    p = specq("run", str(doc), "-q", "Who?", "--max-tokens", "4", *tiny_args(tiny_models))
    assert p.returncode == 0, p.stderr
    assert "sparse_prefill" in p.stdout and "ttft" in p.stdout and "ran baseline" in p.stdout


# the stock-library fallback (a build without patch 0001's setter): tests/test_abort.py


@pytest.mark.parametrize(
    "content, args, message",
    [
        (b"", [], "is empty"),
        (b"   \n\n ", [], "is empty"),
        (b"\x00\x01\x02binary\x00", [], "looks binary"),
        (b"caf\xe9 \xff\xfe", [], "not UTF-8"),
        (b"hello " * 2000, ["--n-ctx", "512"], "exceeds the target's context"),
        (b"hello", ["--keep", "1.5"], "keep must be"),
        (b"hello", ["--mode", "fast"], "mode must be"),
        (b"hello", ["--max-tokens", "0"], "max_tokens must be"),
        (b"hello", ["--target", "/nonexistent/model.gguf"], "model file not found"),
    ],
)
def test_cli_bad_input_is_one_line(tiny_models, tmp_path, content, args, message):
    f = tmp_path / "in.txt"
    f.write_bytes(content)
    base = ["--target", str(tiny_models.target), "--speculator", str(tiny_models.speculator)]
    p = specq("run", str(f), "--max-tokens", "4", *base, *args)
    assert p.returncode == 1
    assert message in p.stderr
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_cli_missing_file(tiny_models, tmp_path):
    p = specq("run", str(tmp_path / "nope.txt"), "--target", str(tiny_models.target))
    assert p.returncode == 1 and "file not found" in p.stderr and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------- real pair



@pytest.mark.real_models
def test_real_pair_baseline_answers(real_engine):
    r = real_engine.run(TEXT, RunParams(question="Which company did the Python core development team move to in May 2000? Answer with the company name only.", mode="baseline", max_tokens=16))
    assert "BeOpen" in r.text, r.text
    d = r.to_dict()
    assert d["spec"]["mode"] == "baseline" and d["usage"]["kept_tokens"] == d["usage"]["prompt_tokens"] > 2500
    assert d["engine"]["backend"] == "cpu" and d["engine"]["target"].startswith("qwen2.5-coder-1.5b")


_CUDA_GRAPHS_CHILD = """
import os, sys
from specq.engine.llama import binding as llama
from specq.engine.options import EngineOptions
from specq.engine.pipeline import Engine
os.environ.pop(llama.CUDA_GRAPHS_ENV, None)
eng = Engine(EngineOptions(target=sys.argv[1], speculator=sys.argv[2], n_gpu_layers=0, n_ctx=512))
first = os.environ.get(llama.CUDA_GRAPHS_ENV)
# a second engine asking for graphs cannot change what ggml read at the first one's graphs
on = llama.set_cuda_graphs(True)
print(repr(first), on, eng.info.cuda_graphs, os.environ.get(llama.CUDA_GRAPHS_ENV))
"""


def test_cuda_graphs_are_off_by_default_and_the_first_engine_decides(tiny_models):
    """The engine sets ggml's GGML_CUDA_DISABLE_GRAPHS before loading (graphs crashed on the H200,
    EngineOptions.cuda_graphs); ggml reads it once per process, so a later request to turn them on
    is refused rather than silently half-applied. In a child process: the setting is process-wide."""
    out = subprocess.run([sys.executable, "-c", _CUDA_GRAPHS_CHILD, str(tiny_models.target), str(tiny_models.speculator)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "GGML_CUDA_DISABLE_GRAPHS": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "'1' False False 1"
