"""A cached follow-up's path to its first token (issue 50 item 1) on tiny random-weight models (CPU): the
long document's tokens remembered (engine/llama/token_memo.py), its set-up in the step of its mode
decision, and its `ft_*` timings (engine/serving/loop.py module doc) — with the same tokens as a fresh
run, and a document one token different served only the prefix the two share."""

from __future__ import annotations

import llama_cpp  # noqa: F401  # isort: skip
import pytest

from specq.engine.options import EngineOptions, RunParams
from specq.engine.pipeline import Engine

pytestmark = [pytest.mark.engine]

#: > token_memo.MIN_CHARS characters: its tokens are remembered
DOC = "".join(f"line {i}: the value of item_{i} is {(i * 7919) % 1000}; " for i in range(120))
QUESTIONS = ["What is the value of item_3?", "Which item has the largest value?", "Sum items 1 to 4."]
PARTS = ("ft_tokenize", "ft_admit", "ft_pick", "ft_decide", "ft_setup", "ft_between", "ft_fill", "ft_sample")


def _loop(tiny_models, cache_bytes: int):
    from specq.engine.serving.loop import ServingEngine

    e = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                             n_ctx=8192, n_threads=2, call_tokens=4096, batch_invariant="on", slots=2,
                             cache_bytes=cache_bytes, spec_cache_save="repeat"))
    return e, ServingEngine(e).start()


def _params(q: str) -> RunParams:
    return RunParams(question=q, mode="auto", max_tokens=6, ignore_eos=True)


def test_the_token_memo_returns_the_tokens_of_a_fresh_tokenization(tiny_models):
    from specq.engine.llama.binding import Model
    from specq.engine.llama.token_memo import MIN_CHARS, TokenMemo

    assert len(DOC) >= MIN_CHARS
    m = Model(tiny_models.target, n_gpu_layers=0)
    plain = Model(tiny_models.target, n_gpu_layers=0)
    plain.token_memo = TokenMemo(budget_tokens=0)  # tokenizes every time
    fresh = plain.tokenize(DOC)
    first, again = m.tokenize(DOC), m.tokenize(DOC)
    assert first == again == fresh and m.token_memo.hits == 1
    again.append(0)  # a caller's list is its own
    assert m.tokenize(DOC) == fresh
    other = DOC.replace("item_110", "item_11O")
    assert m.tokenize(other) == plain.tokenize(other) != fresh
    assert m.tokenize(DOC, parse_special=True) == plain.tokenize(DOC, parse_special=True)


def test_a_follow_up_answers_as_a_fresh_run_and_its_parts_add_up(tiny_models):
    """Follow-ups about a stored document (mode auto, one after another): each reuses its slot's cells and
    prefills only its question, in the step of its mode decision, and decodes the tokens the loop without
    any cache decodes; a document one token different reuses only the shared prefix and answers as fresh."""
    changed = DOC[:-200] + DOC[-200:].replace("item_", "itemX", 1)
    answers = {}
    for budget in (64 << 20, 0):
        e, loop = _loop(tiny_models, budget)
        try:
            runs = [loop.submit(DOC, _params(q), reused_document=True).result(300) for q in QUESTIONS]
            runs.append(loop.submit(changed, _params(QUESTIONS[1]), reused_document=True).result(300))
            answers[budget] = [r.tokens for r in runs]
            if budget:
                doc_end = e.tokenize_prompt(DOC, _params(QUESTIONS[1])).doc_end
                for r in runs[1:3]:
                    t = r.spec.cache["target"]
                    assert r.spec.mode == "baseline" and t["from_slot"] and t["reused_tokens"] >= doc_end, t
                    assert abs(sum(r.timings_ms[k] for k in PARTS) - r.timings_ms["ttft"]) < 0.01
                    assert all(r.timings_ms[k] >= 0 for k in PARTS if k != "ft_between"), r.timings_ms
                assert e.target.token_memo.hits >= len(QUESTIONS) - 1
                new, old = (e.tokenize_prompt(d, _params(QUESTIONS[1])).tokens for d in (changed, DOC))
                first_diff = next(i for i, (a, b) in enumerate(zip(new, old)) if a != b)
                t = runs[3].spec.cache["target"]
                assert t["hit"] and t["reused_tokens"] <= first_diff, (t, first_diff)
        finally:
            loop.close()
            e.close()
    assert answers[64 << 20] == answers[0]
