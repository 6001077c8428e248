"""The speculator's prefill throughput against the card's F16 throughput (issue 50, item 2: measure first).

Scoring a 32K-token prompt on a GPU prefills the speculator over 8 windows of ~4K tokens as 8 parallel
KV streams, in llama_decode calls of `call_tokens` (2,048) tokens with n_ubatch 2,048 (the target's
settings: engine/pipeline.py). This script times exactly that prefill (no capture callback, no score
math: the part `bench ttft` calls `speculator_prefill`) and the same tokens under other micro-batch and
call sizes, for the speculator and for the target, and compares each with the card's measured F16
matmul throughput (torch, an 8192^3 GEMM) through the model's FLOPs (projections + MLP + causal
attention; the LM head is not run: logits "none").

    PYTHONPATH=/tmp/site:$PWD LD_PRELOAD=/lib/x86_64-linux-gnu/libstdc++.so.6 \
      python3 bench/gpu/speculator_throughput.py --model /tmp/models/0.5b.gguf --target /tmp/models/7b.gguf \
      --out $OUT/speculator-throughput.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

import llama_cpp  # noqa: F401  (before numpy: bench/gpu/README.md's pitfall)

from specq.bench.provenance import Start, provenance
from specq.engine.llama.binding import Context, Model


def model_flops(m: Model, layout: list[int]) -> float:
    """FLOPs of prefilling sequences of the given lengths: 2 x weights per token + causal attention."""
    d, layers = m.n_embd, m.n_layer
    kv = d // m.n_head * m.n_head_kv
    ff = m.ff if hasattr(m, "ff") else 0
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * ff
    linear = 2.0 * per_layer * layers * sum(layout)
    attn = sum(2.0 * 2.0 * (n * n / 2.0) * d * layers for n in layout)
    return linear + attn


def time_prefill(m: Model, *, streams: int, per_stream: int, n_ubatch: int, call_tokens: int, n_batch: int,
                 reps: int, order: str = "window-major") -> float:
    """Median seconds to prefill `streams` sequences of `per_stream` tokens each (one context, one KV
    stream per sequence). order "window-major": window 0's tokens, then window 1's, ... in calls of
    call_tokens (as the scorer's parallel path sends them, engine/scoring/scorer.py _score_parallel);
    "interleaved": each call holds an equal chunk of every window."""
    import numpy as np

    cells = per_stream + 64
    ctx = Context(m, n_ctx=streams * cells, n_seq_max=streams, kv_unified=streams == 1, n_batch=n_batch,
                  n_ubatch=n_ubatch, flash_attn=True, call_tokens=call_tokens)
    rng = np.random.default_rng(0)
    toks = rng.integers(100, 20000, size=streams * per_stream).tolist()
    chunk = max(1, call_tokens // streams) if order == "interleaved" else per_stream
    order_t, order_p, order_s = [], [], []
    for start in range(0, per_stream, chunk):
        for s in range(streams):
            for p in range(start, min(start + chunk, per_stream)):
                order_t.append(toks[s * per_stream + p])
                order_p.append(p)
                order_s.append(s)
    times = []
    for _ in range(reps + 1):
        ctx.clear()
        llama_cpp.llama_synchronize(ctx.ptr)
        t0 = time.perf_counter()
        ctx.decode(order_t, order_p, seq_ids=order_s, logits="none")
        llama_cpp.llama_synchronize(ctx.ptr)
        times.append(time.perf_counter() - t0)
    ctx.close()
    times = sorted(times[1:])
    return times[len(times) // 2]


def card_f16_flops() -> float:
    import torch

    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return 20 * 2 * 8192 ** 3 / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--target", default="")
    ap.add_argument("--ff", type=int, default=4864, help="the speculator's n_ff (the 0.5B shape's)")
    ap.add_argument("--target-ff", type=int, default=18944, help="the target's n_ff (the 7B shape's)")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    start = Start()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    peak = card_f16_flops()
    print(f"{gpu}: torch F16 GEMM 8192^3 {peak / 1e12:.0f} TFLOP/s", flush=True)
    report = {"benchmark": "speculator-throughput", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "gpu": gpu,
              "card_f16_tflops": peak / 1e12, "tokens": a.tokens, "rows": []}
    configs = [
        # (streams, n_ubatch, call_tokens, n_batch, order): the first is production's scorer path at 32K
        (8, 2048, 2048, 4096, "window-major"), (8, 2048, 2048, 4096, "interleaved"),
        (8, 4096, 4096, 4096, "interleaved"), (8, 8192, 8192, 8192, "interleaved"), (8, 512, 2048, 4096, "interleaved"),
        (1, 2048, 2048, 4096, "window-major"), (1, 4096, 4096, 4096, "window-major"), (1, 8192, 8192, 8192, "window-major"),
    ]
    models = [("speculator", a.model, a.ff)] + ([("target", a.target, a.target_ff)] if a.target else [])
    for role, path, ff in models:
        m = Model(path, n_gpu_layers=-1)
        m.ff = ff
        for streams, ub, call, nb, order in configs if role == "speculator" else configs[:3] + configs[5:7]:
            per = a.tokens // streams
            try:
                s = time_prefill(m, streams=streams, per_stream=per, n_ubatch=ub, call_tokens=call, n_batch=nb,
                                 reps=a.reps, order=order)
            except Exception as e:  # noqa: BLE001 - a config the card cannot hold is reported, not fatal
                print(f"{role} streams={streams} ubatch={ub}: {e}", flush=True)
                continue
            fl = model_flops(m, [per] * streams)
            row = {"role": role, "model": path.rsplit("/", 1)[-1], "streams": streams, "per_stream": per,
                   "n_ubatch": ub, "call_tokens": call, "n_batch": nb, "order": order, "seconds": s,
                   "tokens_per_s": a.tokens / s, "tflops": fl / s / 1e12, "fraction_of_card": fl / s / peak}
            report["rows"].append(row)
            print(f"{role} {streams}x{per} {order} ubatch {ub} call {call}: {s * 1000:.0f} ms, {row['tokens_per_s']:,.0f} tok/s, "
                  f"{row['tflops']:.0f} TFLOP/s = {row['fraction_of_card']:.1%} of the card", flush=True)
            report["provenance"] = provenance(None, start=start)
            report["commit"] = report["provenance"]["code"]["describe"]
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1)
        m.close()


if __name__ == "__main__":
    main()
