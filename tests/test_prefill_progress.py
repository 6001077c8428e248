"""The target's prefill reports its progress (issue 45, item 4): the long phase of a long prompt was
one `sparse_prefill 0/1` report, so `submit --wait` and the page showed a spinner for tens of seconds.
Now the engine reports `sparse_prefill` i/n (tokens in the cache / tokens the target prefills) after
each llama_decode call — in `Engine.run` (one slot: a sparse prefill, and a full prefill through the
target's prompt cache) and in the serving loop (after each prefill chunk) — and the worker's progress
channel (its watcher) stores what it is given. Real llama.cpp, tiny random-weight models."""

from __future__ import annotations

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from specq.engine.options import EngineOptions, RunParams  # noqa: E402

DOC = "".join(f"def f{i}(a, b):\n    return a + b * {i}\n\n" for i in range(60))
CALL = 64  # tokens per llama_decode call: a prompt of ~1,500 tokens takes many


@pytest.fixture(scope="module")
def engine(tiny_models):
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, call_tokens=CALL, cache_bytes=64 << 20))
    yield eng
    eng.close()


def _prefill_reports(seen: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    return [(done, total) for phase, done, total in seen if phase == "sparse_prefill"]


def _check_counts(reports: list[tuple[int, int]], n: int, start: int = 0) -> None:
    assert reports[0] == (0, n)  # the phase begins with its size
    assert all(total == n for _, total in reports)
    done = [d for d, _ in reports[1:]]
    assert done == sorted(done) and done[-1] == n
    assert len(done) >= (n - start) // CALL  # one report per call
    assert done[0] == min(start + CALL, n)


@pytest.mark.parametrize("params", [RunParams(mode="baseline", max_tokens=2),
                                    RunParams(mode="specprefill", min_tokens=0, keep=0.5, max_tokens=2)],
                         ids=["full", "sparse"])
def test_engine_run_reports_prefill_tokens(engine, params):
    seen: list[tuple[str, int, int]] = []
    r = engine.run(DOC, params, progress=lambda *a: seen.append(a), scope=f"progress-{params.mode}")
    n = r.usage.kept_tokens  # the tokens the target prefilled: all of them in baseline
    assert n > 4 * CALL
    _check_counts(_prefill_reports(seen), n)
    assert r.spec.mode == params.mode


def test_a_prompt_cache_hit_counts_from_the_restored_prefix(engine):
    question = RunParams(mode="baseline", max_tokens=2, question="What does f3 return?")
    engine.run(DOC, question, scope="progress-hit")  # saves the prompt
    seen: list[tuple[str, int, int]] = []
    r = engine.run(DOC, RunParams(mode="baseline", max_tokens=2, question="What does f7 return?"),
                   progress=lambda *a: seen.append(a), scope="progress-hit")
    reused = r.spec.cache["target"]["reused_tokens"]
    assert r.spec.cache["target"]["hit"] and reused > 4 * CALL
    reports = _prefill_reports(seen)
    assert reports[0] == (0, r.usage.prompt_tokens)
    assert reports[1][0] == min(reused + CALL, r.usage.prompt_tokens) and reports[-1][0] == r.usage.prompt_tokens


def test_serving_loop_reports_prefill_tokens_per_chunk(engine):
    from specq.engine.serving.loop import ServingEngine

    loop = ServingEngine(engine, prefill_chunk=CALL).start()
    try:
        seen: list[tuple[str, int, int]] = []
        r = loop.run(DOC, RunParams(mode="baseline", max_tokens=2), lambda *a: seen.append(a))
    finally:
        loop.close()
    _check_counts(_prefill_reports(seen), r.usage.kept_tokens)
