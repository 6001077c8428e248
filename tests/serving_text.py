"""The documents the engine-loop tests score (tiny random-weight models, byte-level vocabulary: ~1
token per 1-3 characters), the prefill call and window sizes that make them span several calls
and windows, and the engine and job parameters those tests share."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "python-license.txt").read_text()
#: tokens per llama_decode call of a prefill (EngineOptions.call_tokens)
CALL = 32
#: document tokens per scoring window
WINDOW = 160
DOC = TEXT[:1400]  # several windows of WINDOW tokens
DOC2 = TEXT[1400:2800]
SHORT = "def f(x):\n    return x * 2\n" * 4


def loop_engine(tiny_models, select_override=None, **kw):
    """An Engine for the loop tests: CPU, one llama.cpp thread, calls of CALL tokens, batch-invariant
    target (a job's logits are then the same whoever shares the loop with it); `select_override` as
    Engine's (benchmarks' selection emulation)."""
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    opts = dict(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0, n_ctx=2048,
                n_threads=1, slots=2, call_tokens=CALL, cache_bytes=1 << 26, batch_invariant="on")
    opts.update(kw)
    return Engine(EngineOptions(**opts), select_override=select_override)


def decoder_params(**kw):
    """A baseline job that decodes long (ignore_eos), no drafting."""
    from specq.engine.options import RunParams

    base = dict(question="go on", mode="baseline", draft="none", max_tokens=500, ignore_eos=True, seed=1)
    base.update(kw)
    return RunParams(**base)


def scorer_params(question: str = "Who holds the copyright?", **kw):
    """A specprefill job scored in windows of WINDOW tokens, a short answer."""
    from specq.engine.options import RunParams

    base = dict(question=question, mode="specprefill", min_tokens=0, window=WINDOW, keep=0.3, chunk=16,
                max_tokens=8, seed=1, draft="none")
    base.update(kw)
    return RunParams(**base)
