"""One unit of `specq calibrate` (issue 48): a question about a document, answered by the pair both ways.

`run_unit` runs, in order and on one engine:
1. baseline (full prefill, greedy) — the pair's own answer, the reference of the label-free metrics;
2. specprefill with the same settings (its kept prompt indices and positions are recorded);
3. baseline's greedy answer teacher-forced under the sparse context (the specprefill run's kept
   tokens at its positions) and under the full context: the mean per-token log-likelihood of that
   answer in each (`forced_loglik`).

Step 3 prefills with the engine's own `sparse_prefill` and reads the target's logits; nothing is sampled.
The record is what engine/policy/evidence_metrics.question_values reads; grading against a reference
answer is the caller's (the answer may come from a family grader the engine does not know).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from .decode.prefill import sparse_prefill
from .options import RunParams

#: a unit's progress: (phase, done, total) as Engine.run reports it, phase prefixed by the arm
Progress = Callable[[str, int, int], None]


def log_softmax_at(logits: np.ndarray, token: int) -> float:
    """log p(token) under one row of logits."""
    x = np.asarray(logits, dtype=np.float64)
    m = float(x.max())
    return float(x[token] - m - np.log(np.exp(x - m).sum()))


def forced_loglik(engine, prompt_tokens: Sequence[int], kept: Sequence[int], positions: str,
                  answer: Sequence[int]) -> float | None:
    """Mean per-token log-likelihood (nats) of `answer` following the prompt prefilled at `kept` (all
    indices: the full context) with `positions` (prefill.py). None for an empty answer."""
    if not answer:
        return None
    ctx = engine.ctx
    pre = sparse_prefill(ctx, prompt_tokens, kept, positions)
    total = log_softmax_at(pre.logits, int(answer[0]))
    pos = pre.next_pos
    feed = list(answer[:-1])  # each fed token's logits score the next answer token
    step = max(1, ctx.n_batch)
    for start in range(0, len(feed), step):
        chunk = feed[start:start + step]
        ctx.decode(chunk, list(range(pos + start, pos + start + len(chunk))), logits="all")
        for i in range(len(chunk)):
            total += log_softmax_at(ctx.logits_row(i), int(answer[start + i + 1]))
    ctx.clear()
    return total / len(answer)


def run_unit(engine, document: str, question: str, params: RunParams, progress: Progress | None = None, *,
             scope: str = "", stop=None) -> dict[str, Any]:
    """One question's three passes (module doc). `params`: the specprefill settings (mode, question and
    min_tokens are set here); baseline runs the same params in mode baseline. Returns the unit's record:
    `baseline` and `specprefill` ({text, tokens, ttft_ms, ...}), `loglik_full`, `loglik_sparse`,
    `prompt_tokens`, `kept_tokens`, `key` (the EvidenceKey the specprefill run ran with, as a dict),
    `positions`, `seconds`. `scope` keys the engine's caches (engine.run); `stop`: a worker's Stop (cancel
    request, deadline) for both runs."""
    t0 = time.perf_counter()
    spec_p = dataclasses.replace(params, question=question, mode="specprefill", min_tokens=0, temperature=0.0)
    base_p = dataclasses.replace(spec_p, mode="baseline")

    def arm(name: str) -> Callable[[str, int, int], None] | None:
        return None if progress is None else (lambda phase, done, total: progress(f"{name} {phase}", done, total))

    rb = engine.run(document, base_p, arm("baseline"), scope=scope, stop=stop)
    rs = engine.run(document, spec_p, arm("specprefill"), scope=scope, stop=stop)
    if rs.spec.mode != "specprefill":
        raise ValueError(f"specprefill did not run ({rs.spec.reason})")
    prompt = engine.tokenize_prompt(document, spec_p)
    answer = list(rb.tokens)
    if progress is not None:
        progress("teacher-forced", 0, 2)
    sparse = forced_loglik(engine, prompt.tokens, rs.kept_indices, rs.spec.positions, answer)
    if progress is not None:
        progress("teacher-forced", 1, 2)
    full = forced_loglik(engine, prompt.tokens, range(prompt.n), "original", answer)
    if progress is not None:
        progress("teacher-forced", 2, 2)
    key = engine.evidence_key(prompt, spec_p, rs.spec.positions, "native")
    return {
        "baseline": {"text": rb.text, "tokens": len(rb.tokens), "ttft_ms": round(rb.timings_ms.get("ttft", 0.0), 1)},
        "specprefill": {"text": rs.text, "tokens": len(rs.tokens), "ttft_ms": round(rs.timings_ms.get("ttft", 0.0), 1)},
        "loglik_full": None if full is None else round(full, 6),
        "loglik_sparse": None if sparse is None else round(sparse, 6),
        "prompt_tokens": prompt.n, "doc_tokens": prompt.doc_end - prompt.doc_start, "kept_tokens": rs.usage.kept_tokens,
        "positions": rs.spec.positions, "key": key.as_dict(), "seconds": round(time.perf_counter() - t0, 3),
    }


__all__ = ["run_unit", "forced_loglik", "log_softmax_at"]
