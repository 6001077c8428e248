"""The speculator's prefill throughput against the card's F16 throughput (issue 50, item 2: measure first).

Scoring a 32K-token prompt on a GPU prefills the speculator over 8 windows of ~4K tokens as 8 parallel
KV streams, in llama_decode calls of `call_tokens` (2,048) tokens with n_ubatch 2,048 (the target's
settings: engine/pipeline.py). This script times exactly that prefill (no capture callback, no score
math: the part `bench ttft` calls `speculator_prefill`) and the same tokens under other micro-batch and
call sizes, for the speculator and for the target, and compares each with the card's measured F16
matmul throughput (torch, an 8192^3 GEMM) through the model's FLOPs (projections + MLP + causal
attention; the LM head is not run: logits "none"); both from specq/bench/flops.py, which `specq bench
ttft` uses for its rows' `fraction_of_peak` too. The shapes are read from the GGUF files.

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

from specq.bench.flops import measured_peak, prefill_flops, read_shape
from specq.bench.provenance import Start, provenance
from specq.engine.llama.binding import Context, Model


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--target", default="")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    start = Start()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    card = measured_peak()
    if card is None:
        raise SystemExit("no CUDA torch: this script compares with the card's F16 peak")
    peak = card["tflops"] * 1e12
    print(f"{gpu}: {card['method']}: {card['tflops']:.0f} TFLOP/s", flush=True)
    report = {"benchmark": "speculator-throughput", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "gpu": gpu,
              "card_f16_tflops": card["tflops"], "peak": card, "tokens": a.tokens, "rows": []}
    configs = [
        # (streams, n_ubatch, call_tokens, n_batch, order): the first is production's scorer path at 32K
        (8, 2048, 2048, 4096, "window-major"), (8, 2048, 2048, 4096, "interleaved"),
        (8, 4096, 4096, 4096, "interleaved"), (8, 8192, 8192, 8192, "interleaved"), (8, 512, 2048, 4096, "interleaved"),
        (1, 2048, 2048, 4096, "window-major"), (1, 4096, 4096, 4096, "window-major"), (1, 8192, 8192, 8192, "window-major"),
    ]
    models = [("speculator", a.model)] + ([("target", a.target)] if a.target else [])
    for role, path in models:
        shape = read_shape(path)
        m = Model(path, n_gpu_layers=-1)
        for streams, ub, call, nb, order in configs if role == "speculator" else configs[:3] + configs[5:7]:
            per = a.tokens // streams
            try:
                s = time_prefill(m, streams=streams, per_stream=per, n_ubatch=ub, call_tokens=call, n_batch=nb,
                                 reps=a.reps, order=order)
            except Exception as e:  # noqa: BLE001 - a config the card cannot hold is reported, not fatal
                print(f"{role} streams={streams} ubatch={ub}: {e}", flush=True)
                continue
            fl = prefill_flops(shape, [(0, per)] * streams)
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
