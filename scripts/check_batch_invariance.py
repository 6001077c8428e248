#!/usr/bin/env python3
"""Is the target batch-invariant? Logits of the same positions from lone decodes vs. one batch.

After one prefill of a long prompt, the next `--batch` tokens (the greedy continuation) are decoded
twice from the same KV state: one llama_decode per token (plain greedy decoding), then all of them in
one batch (a speculative verification batch). Speculative greedy output equals plain greedy output
for sure only if every row is bit-identical: max |Δlogit| == 0.

Usage: python scripts/check_batch_invariance.py [--repack 0,1] [--flash-attn 0,1] [--threads 1,2]
           [--kv f16,q8_0] [--prompt-tokens 2300] [--batch 5] [--target NAME|PATH]
Each setting runs in its own process (GGML environment variables are read once per process).
Environment for the child: e.g. GGML_CPU_TILED_MM=0 disables llama.cpp's tiled K-quant matmul.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(target: str, repack: bool, flash_attn: bool, threads: int, kv: str, prompt_tokens: int,
            batches: list[int]) -> dict:
    sys.path.insert(0, str(ROOT))
    import llama_cpp  # noqa: F401  (before numpy)

    from specq.engine.llama.binding import Context, Model
    from specq.engine.models import resolve_model
    from specq.engine.prompt.build import build_prompt

    import numpy as np

    if kv != "f16":  # KV cache types ("q8_0", or K/V as "f16/f32"): set on the context parameters
        types = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}
        type_k, type_v = (types[x] for x in (kv.split("/") if "/" in kv else (kv, kv)))
        default_params = llama_cpp.llama_context_default_params

        def params():
            p = default_params()
            p.type_k, p.type_v = type_k, type_v
            return p

        llama_cpp.llama_context_default_params = params
    model = Model(resolve_model(target, pull=False), n_gpu_layers=0, repack=repack)
    ctx = Context(model, n_ctx=4096, n_threads=threads, flash_attn=flash_attn)
    text = (ROOT / "examples" / "textwrap.py").read_text(encoding="utf-8")
    doc = text[: prompt_tokens * 4]
    toks = build_prompt(model, doc, "Explain what this module does, function by function.").tokens
    while len(toks) > prompt_tokens and len(doc) > 200:
        doc = doc[: int(len(doc) * 0.95)]
        toks = build_prompt(model, doc, "Explain what this module does, function by function.").tokens
    n = len(toks)
    t0 = time.perf_counter()
    ctx.decode(toks, range(n))
    prefill_s = time.perf_counter() - t0
    first = ctx.logits_row(-1)
    k = max(batches)
    # lone decodes: the greedy continuation, one token per llama_decode
    cont, lone = [int(np.argmax(first))], []
    t0 = time.perf_counter()
    for i in range(k):
        ctx.decode([cont[i]], [n + i])
        row = ctx.logits_row(-1)
        lone.append(row)
        cont.append(int(np.argmax(row)))
    lone_s = (time.perf_counter() - t0) / k
    out = {"repack": repack, "flash_attn": flash_attn, "threads": threads, "kv": kv, "prompt_tokens": n,
           "prefill_tok_s": round(n / prefill_s, 1), "lone_ms": round(lone_s * 1000, 1), "max_abs": {}}
    for b in batches:
        ctx.seq_rm(0, n)
        ctx.decode(cont[:b], range(n, n + b), logits="all")
        worst = max(float(np.max(np.abs(ctx.logits_row(i) - lone[i]))) for i in range(b))
        out["max_abs"][str(b)] = worst
    ctx.close()
    model.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--repack", default="1,0")
    ap.add_argument("--flash-attn", default="1,0")
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--prompt-tokens", type=int, default=2300)
    ap.add_argument("--batch", default="2,5")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [int(x) for x in a.batch.split(",")]
    if a.child:
        r, f, t, kv = a.child.split(":")
        print(json.dumps(measure(a.target, r == "1", f == "1", int(t), kv, a.prompt_tokens, batches)))
        return
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    for r, f, t, kv in itertools.product(ints(a.repack), ints(a.flash_attn), ints(a.threads), a.kv.split(",")):
        cmd = [sys.executable, __file__, "--child", f"{r}:{f}:{t}:{kv}", "--target", a.target,
               "--prompt-tokens", str(a.prompt_tokens), "--batch", a.batch]
        res = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        if res.returncode != 0:
            print(json.dumps({"setting": f"{r}:{f}:{t}:{kv}", "error": res.stderr.strip()[-400:]}), flush=True)
            continue
        print(res.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
