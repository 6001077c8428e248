"""`specq bench drafters`: what each drafter costs and the decode speed-up it gives at a forced
acceptance rate — ngram, model, mtp and eagle3 on one curve.

Random weights make acceptance rates meaningless, so the curve is drawn with `ForcedDrafter`
(specq/bench/forced.py): each drafter does its real work (n-gram lookup, speculator decodes, MTP or
EAGLE3 steps on the target's hidden states) and its proposal is then replaced by the target's known
greedy continuation, each drafted token kept with probability `rate` until the first that is not.
A user with real weights reads off their own acceptance rate.

Reported (greedy, after one prompt of `prompt_tokens` tokens, plain prefill; every time is the best
of `reps` calls / `repeat` runs, see `_best_ms`). `clock="thread"` times the calling thread's CPU time
instead of wall-clock: with one llama.cpp thread on a CPU build all compute runs in that thread, so
on a machine shared with other jobs it gives the uncontended cost (wall-clock there mostly measures
waiting for a core):
* unit costs in ms: a target single-token decode, a verification batch of k+1 tokens (k = 1..n_draft),
  one MTP / EAGLE3 draft step (one row), the seed step that writes the verified tokens' pairs with
  it, an EAGLE3 encode of k+1 rows, a speculator decode;
* per drafter and rate: decode tokens/s, ratio to `none`, the acceptance actually reached, and the
  ratio predicted from the unit costs: E[tokens per batch] × t(1) / (t_verify(k+1) + t_draft(k)), with
  E = 1 + sum_{i=1..k} rate^i.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import llama_cpp  # noqa: F401  (before numpy)

import numpy as np

from ..engine.options import EngineOptions, RunParams
from .forced import ForcedDrafter

DEFAULT_RATES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
METHODS = ("ngram", "model", "mtp", "eagle3")


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def _best_ms(fn: Callable[[], None], reps: int, clock: Callable[[], float]) -> float:
    """The fastest of `reps` calls after a warm-up (graph allocation): on a shared CPU a call's median
    includes other processes' time slices; on a dedicated GPU the two agree."""
    fn()
    times = []
    for _ in range(reps):
        t0 = clock()
        fn()
        times.append((clock() - t0) * 1000.0)
    return round(min(times), 3)


def _unit_costs(engine, p, methods: Sequence[str], n_draft: int, reps: int,
                clock: Callable[[], float]) -> dict[str, Any]:
    """Per-call costs at the prompt's context length (each call's cells removed again); p: a Prompt."""
    from ..engine.llama.ext import EmbdBatch, hidden_rows, n_embd_out
    from ..engine.decode.prefill import sparse_prefill

    ctx, prompt, n = engine.ctx, p.tokens, p.n
    drafters = {}
    for m in ("mtp", "eagle3"):
        if m in methods:
            drafters[m] = engine.drafter_for(RunParams(draft=m), p)
    observe = [d.observe for d in drafters.values()]
    pre = sparse_prefill(ctx, prompt, list(range(n)), observe=(lambda *a: [o(*a) for o in observe]) if observe else None)
    tok = int(np.argmax(pre.logits))
    out: dict[str, Any] = {}

    def target(b: int) -> Callable[[], None]:
        def run() -> None:
            ctx.decode([tok] * b, list(range(n, n + b)), logits="all")
            for i in range(b):
                ctx.logits_row(i)
            ctx.seq_rm(0, n, -1)
        return run

    out["target_decode_1"] = _best_ms(target(1), reps, clock)
    out["target_verify"] = {str(k): _best_ms(target(k + 1), reps, clock) for k in range(1, n_draft + 1)}
    for m, d in drafters.items():
        dctx = d.ctx
        width = n_embd_out(dctx.model)
        seed = d._seed(tok)
        batch = EmbdBatch(n_draft + 2, width)
        row = np.asarray(seed[2], dtype=np.float32)[None, :]
        d._write(seed)
        p0 = seed[0]

        def step() -> None:
            batch.decode(dctx, [tok], [p0 + 1], hidden_rows(dctx, [-1]), seq=d.seq, logits="last")
            dctx.logits_row(-1)
            dctx.seq_rm(d.seq, p0 + 1, -1)

        def seed_rows(b: int) -> Callable[[], None]:
            def run() -> None:
                dctx.seq_rm(d.seq, p0, -1)
                batch.decode(dctx, [tok] * b, list(range(p0, p0 + b)), np.repeat(row, b, axis=0), seq=d.seq,
                             logits=d._seed_logits)
                dctx.logits_row(-1)
            return run

        out[f"{m}_step"] = _best_ms(step, reps, clock)
        out[f"{m}_seed"] = {str(b): _best_ms(seed_rows(b), reps, clock) for b in (1, n_draft + 1)}
        if m == "eagle3":
            feats = np.zeros((n_draft + 1, d._enc.n_embd), dtype=np.float32)
            out["eagle3_encode"] = _best_ms(lambda: d._enc.encode(dctx, feats, seq=d.seq), reps, clock)
        dctx.seq_rm(d.seq, 0, -1)
    if "model" in methods:
        sctx = engine.scorer().ctx
        sctx.clear()
        sctx.decode(prompt, range(n), logits="last")

        def spec_step() -> None:
            sctx.decode([tok], [n], logits="last")
            sctx.logits_row(-1)
            sctx.seq_rm(0, n, -1)

        out["speculator_decode_1"] = _best_ms(spec_step, reps, clock)
        sctx.clear()
        engine.scorer().cached_tokens.clear()
    ctx.seq_rm(0, n, -1)
    return out


def predicted_ratio(units: dict[str, Any], method: str, rate: float, k: int) -> float:
    """Speed-up over `none` from the unit costs (i.i.d. acceptance at `rate`, every draft k long)."""
    t1 = units["target_decode_1"]
    verify = units["target_verify"][str(k)]
    if method == "ngram":
        draft = 0.0
    elif method == "model":
        draft = k * units["speculator_decode_1"]
    else:  # seed (writes the verified tokens' pairs) + k-1 steps
        draft = units[f"{method}_seed"][str(k + 1)] + (k - 1) * units[f"{method}_step"]
        if method == "eagle3":
            draft += units["eagle3_encode"]
    expected = 1.0 + sum(rate ** i for i in range(1, k + 1))
    return round(expected * t1 / (verify + draft), 3)


def run_drafters_bench(
    opts: EngineOptions,
    *,
    methods: Sequence[str] = ("ngram", "model", "mtp"),
    rates: Sequence[float] = DEFAULT_RATES,
    n_draft: int = 4,
    max_tokens: int = 64,
    prompt_tokens: int = 1024,
    reps: int = 5,
    repeat: int = 1,
    clock: str = "wall",
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    from ..engine.decode.loop import generate
    from ..engine.pipeline import Engine
    from ..engine.decode.prefill import sparse_prefill
    from ..engine.prompt.build import build_prompt
    from ..engine.decode.sampling import Sampler
    from .ttft import make_document

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)} (known: {', '.join(METHODS)})")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}")
    from .provenance import Start, provenance

    start = Start()
    engine = Engine(opts)
    if clock == "thread" and (engine.info.backend != "cpu" or opts.resolved_threads() != 1):
        engine.close()
        raise ValueError("clock thread measures one llama.cpp thread on a CPU build: use threads 1 on the CPU")
    tick = CLOCKS[clock]
    try:
        if engine.numerics.max_draft and n_draft > engine.numerics.max_draft:
            n_draft = engine.numerics.max_draft
        p = build_prompt(engine.target, make_document(engine.target, prompt_tokens), "Explain what this document says.")
        prompt, n = p.tokens, p.n
        say(f"target {engine.target_path.name} ({engine.info.backend}), prompt {n} tokens, n_draft {n_draft}")
        units = _unit_costs(engine, p, methods, n_draft, reps, tick)
        say(f"unit costs (ms): {units}")

        def timed(make: Callable[[], Any]) -> tuple[float, Any]:
            """The best decode time of `repeat` runs, each with a fresh drafter from make()."""
            best, g = None, None
            for _ in range(max(1, repeat)):
                drafter = make()
                pre = sparse_prefill(engine.ctx, prompt, list(range(n)), observe=getattr(drafter, "observe", None))
                inner = getattr(drafter, "inner", None)
                if inner is not None and inner.name == "model":
                    inner.propose(prompt + [int(np.argmax(pre.logits))], 1)  # its prompt prefill is not decode time
                t0 = tick()
                g = generate(engine.ctx, prompt, pre.logits, n, max_tokens=max_tokens, sampler=Sampler(),
                             drafter=drafter, n_draft=n_draft)
                ms = (tick() - t0) * 1000.0
                best = ms if best is None else min(best, ms)
            return best, g

        base_ms, g = timed(lambda: None)
        ref = g.tokens
        base_tps = len(ref) / (base_ms / 1000.0)
        say(f"none: {base_tps:.2f} tok/s ({len(ref)} tokens)")
        curve = []
        for method in methods:
            for rate in rates:
                def make(method=method, rate=rate):
                    if method == "ngram":
                        from ..engine.decode.drafters import NgramDrafter

                        inner = NgramDrafter(3)
                    else:
                        inner = engine.drafter_for(RunParams(draft=method, n_draft=n_draft), p)
                    return ForcedDrafter(inner, ref, n, rate, engine.target.n_vocab, seed=int(rate * 1000))

                ms, g = timed(make)
                tps = len(g.tokens) / (ms / 1000.0)
                st = g.draft
                row = {
                    "method": method, "rate": rate, "tokens": len(g.tokens), "decode_ms": round(ms, 1),
                    "tok_s": round(tps, 2), "ratio": round(tps / base_tps, 3),
                    "accept_rate": round(st.accepted / st.drafted, 3) if st.drafted else 0.0,
                    "mean_accepted_len": round(float(np.mean(st.accepted_lens)), 3) if st.accepted_lens else 0.0,
                    "verify_batches": st.verify_batches, "same_as_none": g.tokens == ref,
                    "predicted_ratio": predicted_ratio(units, method, rate, n_draft),
                }
                curve.append(row)
                say(f"{method:7} rate {rate:4.2f}: {row['tok_s']:8.2f} tok/s  {row['ratio']:5.2f}x  "
                    f"(predicted {row['predicted_ratio']:5.2f}x, accepted {row['accept_rate']:.3f}, "
                    f"same {'yes' if row['same_as_none'] else 'NO'})")
        prov = provenance(engine, positions=["original"], start=start,
                          warnings=[f"acceptance forced at rates {list(rates)}: drafts replaced by the target's greedy "
                                    "continuation (bench/forced.py); the costs are real"])
        return {
            "benchmark": "drafters", "commit": prov["code"]["describe"], "provenance": prov,
            "target": engine.target_path.name, "speculator": engine.info.speculator, "drafter": engine.info.drafter,
            "backend": engine.info.backend, "batch_invariant": engine.info.batch_invariant,
            "prompt_tokens": n, "n_draft": n_draft, "max_tokens": max_tokens, "reps": reps, "repeat": repeat,
            "clock": clock,
            "none_tok_s": round(base_tps, 2),
            "unit_ms": units, "curve": curve,
        }
    finally:
        engine.close()


__all__ = ["CLOCKS", "DEFAULT_RATES", "METHODS", "predicted_ratio", "run_drafters_bench"]
