#!/usr/bin/env python3
"""Side-by-side cost of batch-invariant mode (on) vs off, two Engines in one process, finely interleaved.

Usage: python scripts/cost_batch_invariant.py [CHARS of examples/textwrap.py = 8600] [REPS = 4] [ROUNDS = 12]

prefill: the prompt (CHARS=8600: 2,065 tokens) prefilled by each engine in turn (ABBA order), REPS times each.
decode: after the prefill, rounds of 8 plain greedy decodes per engine, alternating, `rounds` rounds.
Reported: median and best (max) tokens/s per mode; a contended round hurts both sides alike.
"""
import json, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import llama_cpp  # noqa
import numpy as np
from specq.engine.options import EngineOptions
from specq.engine.pipeline import Engine
from specq.engine.prompt.build import build_prompt

chars = int(sys.argv[1]) if len(sys.argv) > 1 else 8600
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 12
text = open(Path(__file__).resolve().parent.parent / "examples" / "textwrap.py").read()[:chars]
E = {m: Engine(EngineOptions(n_gpu_layers=0, n_ctx=8192, n_threads=2, batch_invariant=m)) for m in ("on", "off")}
prompt = build_prompt(E["on"].target, text, "Explain what this module does, function by function.").tokens
n = len(prompt)
pre = {m: [] for m in E}
order = ["on", "off", "off", "on"]
for r in range(reps):
    for m in order:
        if len(pre[m]) >= reps:
            continue
        ctx = E[m].ctx
        ctx.clear()
        t0 = time.perf_counter(); ctx.decode(prompt, range(n)); pre[m].append(n / (time.perf_counter() - t0))
        print("prefill", m, round(pre[m][-1], 1), flush=True)
state = {}
for m, e in E.items():
    e.ctx.clear(); e.ctx.decode(prompt, range(n)); state[m] = (int(np.argmax(e.ctx.logits_row(-1))), n)
dec = {m: [] for m in E}
for r in range(rounds):
    for m in (["on", "off"] if r % 2 == 0 else ["off", "on"]):
        ctx = E[m].ctx
        tok, pos = state[m]
        t0 = time.perf_counter()
        for _ in range(8):
            ctx.decode([tok], [pos]); pos += 1; tok = int(np.argmax(ctx.logits_row(-1)))
        dec[m].append(8 / (time.perf_counter() - t0))
        state[m] = (tok, pos)
    print("decode", r, {m: round(dec[m][-1], 2) for m in dec}, flush=True)
for m in E:
    print(json.dumps({"mode": m, "prompt_tokens": n, "prefill_median": round(statistics.median(pre[m]), 1),
                      "prefill_best": round(max(pre[m]), 1), "decode_median": round(statistics.median(dec[m]), 2),
                      "decode_best": round(max(dec[m]), 2), "prefill": [round(x, 1) for x in pre[m]],
                      "decode": [round(x, 2) for x in dec[m]]}))
