"""What the in-call stop costs and bounds, on the real target (docs/engine.md, "Cancel and the time limit").

1. Decode cost of the abort check: single-token decodes after a prompt, with the context's abort
   callback set four ways, interleaved round by round (ABCD, BCDA, ...) to spread the machine's noise:
   `none` (no callback: stock llama.cpp), `c` (patch 0003's C callback, no deadline: one atomic load
   per graph node), `c+deadline` (the same plus a clock read per node, as during a job with a time
   limit), `ctypes` (a Python callback through ctypes returning False: what patch 0003 avoids).
2. Prefill in bounded calls: one prompt prefilled with call_tokens of each size; total time and the
   longest single call (the bound on how late a cancel is seen where llama.cpp cannot abort a call).
3. Cancel latency inside one call: a prefill in one call, Stop.cancel() from another thread after 1 s.

    nice -n 10 .venv/bin/python scripts/measure_abort.py [--prompt 4096] [--decode 48] [--rounds 3]
"""

from __future__ import annotations

import llama_cpp  # isort: skip  (before numpy)

import argparse
import json
import os
import statistics
import subprocess
import threading
import time

from specq.engine import llama, models
from specq.engine.invariance import resolve
from specq.engine.options import EngineOptions
from specq.engine.stop import Stop
from specq.contracts import RunCancelled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=4096, help="prompt tokens")
    ap.add_argument("--decode", type=int, default=48, help="single-token decodes per variant and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", default="64,128,512,4096", help="call_tokens sizes for the prefill part")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    opts = EngineOptions(n_gpu_layers=0)
    num = resolve(opts, "cpu")
    path = models.resolve_model(opts.target)
    model = llama.Model(path, n_gpu_layers=0, repack=num.repack)
    threads = os.cpu_count() or 1
    text = open("examples/python-license.txt").read()
    toks = model.tokenize(text)
    toks = (toks * (args.prompt // len(toks) + 1))[: args.prompt]
    report: dict = {"commit": subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip(),
                    "model": os.path.basename(str(path)), "threads": threads, "prompt": args.prompt,
                    "numerics": {"repack": num.repack, "type_k": num.type_k, "flash_attn": num.flash_attn},
                    "load_before": os.getloadavg()}

    def ctx_for(call_tokens: int = 0) -> llama.Context:
        return llama.Context(model, n_ctx=args.prompt + args.decode * args.rounds * 4 + 64, n_batch=4096, n_ubatch=512,
                             n_threads=threads, flash_attn=num.flash_attn, type_k=num.type_k, call_tokens=call_tokens)

    # 1. decode cost
    ctx = ctx_for()
    t0 = time.perf_counter()
    ctx.decode(toks, range(len(toks)), logits="last")
    report["prefill_one_call_s"] = time.perf_counter() - t0
    print(f"prefill {len(toks)} tokens in one call: {report['prefill_one_call_s']:.1f} s", flush=True)
    py_calls = [0]

    @llama_cpp.ggml_abort_callback
    def py_cb(_data):
        py_calls[0] += 1
        return False

    def set_variant(v: str) -> None:
        if v == "none":
            llama_cpp.llama_set_abort_callback(ctx.ptr, ctypes_null, None)
        elif v == "ctypes":
            llama_cpp.llama_set_abort_callback(ctx.ptr, py_cb, None)
        elif v == "c":
            llama._SET_STOP_DEADLINE(ctx.ptr, -1)
        else:  # c+deadline: a deadline far away, read after every node
            llama._SET_STOP_DEADLINE(ctx.ptr, 3_600_000_000)

    import ctypes

    ctypes_null = ctypes.cast(None, llama_cpp.ggml_abort_callback)
    variants = ["none", "c", "c+deadline", "ctypes"]
    rates: dict[str, list[float]] = {v: [] for v in variants}
    pos = len(toks)
    tok = toks[-1]
    for r in range(args.rounds):
        order = variants[r % 4:] + variants[: r % 4]
        for v in order:
            set_variant(v)
            start = pos
            t0 = time.perf_counter()
            for _ in range(args.decode):
                ctx.decode([tok], [pos], logits="last")
                pos += 1
            dt = time.perf_counter() - t0
            ctx.seq_rm(0, start, -1)
            pos = start
            rates[v].append(args.decode / dt)
            print(f"round {r}: {v:11s} {args.decode / dt:6.2f} tok/s", flush=True)
    set_variant("c")
    med = {v: statistics.median(x) for v, x in rates.items()}
    report["decode_tok_s"] = {v: {"runs": [round(x, 3) for x in rates[v]], "median": round(med[v], 3),
                                  "vs_none": round(med[v] / med["none"] - 1.0, 4)} for v in variants}
    report["ctypes_calls_per_token"] = py_calls[0] / max(1, args.decode * args.rounds)
    ctx.close()

    # 2. prefill in bounded calls
    if not args.skip_prefill:
        report["prefill"] = {}
        for c in [int(x) for x in args.calls.split(",")]:
            pctx = ctx_for(c)
            times: list[float] = []
            orig = pctx.run_decode

            def timed(*a, _orig=orig, _times=times, **kw):
                t = time.perf_counter()
                _orig(*a, **kw)
                _times.append(time.perf_counter() - t)

            pctx.run_decode = timed
            t0 = time.perf_counter()
            pctx.decode(toks, range(len(toks)), logits="last")
            total = time.perf_counter() - t0
            report["prefill"][str(c)] = {"total_s": round(total, 2), "calls": len(times), "max_call_s": round(max(times), 3),
                                         "last_call_s": round(times[-1], 3)}
            print(f"call_tokens {c}: {total:.1f} s in {len(times)} calls, longest {max(times):.3f} s, last {times[-1]:.3f} s",
                  flush=True)
            pctx.close()

    # 3. cancel latency inside one call
    cctx = ctx_for(4096)
    stop = Stop()
    cctx.stop = stop
    when: list[float] = []

    def cancel() -> None:
        time.sleep(1.0)
        when.append(time.monotonic())
        stop.cancel()

    threading.Thread(target=cancel, daemon=True).start()
    try:
        cctx.decode(toks, range(len(toks)), logits="last")
        report["cancel_latency_s"] = None
    except RunCancelled:
        report["cancel_latency_s"] = round(time.monotonic() - when[0], 4)
    print(f"cancel inside one {len(toks)}-token call: ended {report['cancel_latency_s']} s after cancel()", flush=True)
    cctx.close()
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
