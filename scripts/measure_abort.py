"""What the in-call stop costs and bounds, on the real target (docs/engine.md, "Cancel and the time limit").

1. Decode cost of the abort check: single-token decodes after a prompt, with the context's abort
   callback set four ways, interleaved round by round (ABCD, BCDA, ...) to spread the machine's noise:
   `none` (no callback: stock llama.cpp), `c` (patch 0003's C callback, no deadline: one atomic load
   per graph node), `c+deadline` (the same plus a clock read per node, as during a job with a time
   limit), `ctypes` (a Python callback through ctypes returning False: what patch 0003 avoids).
2. Prefill in bounded calls: one prompt prefilled with call_tokens of each size; total time and the
   longest single call (the bound on how late a cancel is seen where llama.cpp cannot abort a call).
3. Cancel latency: a prefill in one call (CPU: the C abort cuts it) or, with --gpu, in calls of
   --cancel-calls tokens (a GPU cannot abort inside a call, so the bounded calls are the bound),
   Stop.cancel() from another thread --cancel-after seconds in.

    nice -n 10 .venv/bin/python scripts/measure_abort.py [--prompt 4096] [--decode 48] [--rounds 3]
    # on the H200 (bench/gpu/README.md): the 7B shape at 128K, calls of 2,048 tokens, no decode part
    python3 scripts/measure_abort.py --gpu --target /tmp/models/7b.gguf --prompt 131072 --skip-decode \
        --calls 2048 --cancel-calls 2048 --cancel-after 15 --out $OUT/abort-gpu.json
"""

from __future__ import annotations

import llama_cpp  # isort: skip  (before numpy)

import argparse
import json
import os
import statistics
import threading
import time

from specq.bench.provenance import provenance
from specq.engine.llama import binding as llama
from specq.engine import models
from specq.engine.llama.invariance import resolve
from specq.engine.options import EngineOptions
from specq.engine.llama.stop import Stop
from specq.contracts import RunCancelled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=4096, help="prompt tokens")
    ap.add_argument("--decode", type=int, default=48, help="single-token decodes per variant and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", default="64,128,512,4096", help="call_tokens sizes for the prefill part")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--skip-decode", action="store_true", help="skip part 1 (the decode cost of the check)")
    ap.add_argument("--gpu", action="store_true", help="all layers on the GPU, n_ubatch 2048 (the engine's GPU defaults)")
    ap.add_argument("--target", default="", help="model file (default: the configured target, the real pair's)")
    ap.add_argument("--cancel-calls", type=int, default=4096, help="call_tokens of the cancel part")
    ap.add_argument("--cancel-after", type=float, default=1.0, help="seconds into the prefill to cancel")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    ngl = -1 if args.gpu else 0
    opts = EngineOptions(n_gpu_layers=ngl)
    num = resolve(opts, "gpu" if args.gpu else "cpu")
    path = args.target or models.resolve_model(opts.target)
    model = llama.Model(path, n_gpu_layers=ngl, repack=num.repack)
    threads = os.cpu_count() or 1
    text = open("examples/python-license.txt").read()
    toks = model.tokenize(text)
    toks = (toks * (args.prompt // len(toks) + 1))[: args.prompt]
    report: dict = {"provenance": provenance(),  # the commit: provenance.code.describe
                    "model": os.path.basename(str(path)), "threads": threads, "prompt": args.prompt,
                    "backend": "gpu" if args.gpu else "cpu",
                    "numerics": {"repack": num.repack, "type_k": num.type_k, "flash_attn": num.flash_attn},
                    "load_before": os.getloadavg()}

    def ctx_for(call_tokens: int = 0) -> llama.Context:
        return llama.Context(model, n_ctx=args.prompt + args.decode * args.rounds * 4 + 64, n_batch=4096,
                             n_ubatch=2048 if args.gpu else 512,
                             n_threads=threads, flash_attn=num.flash_attn, type_k=num.type_k, call_tokens=call_tokens)

    if not args.skip_decode:
        decode_cost(args, report, ctx_for, toks)
    prefill_and_cancel(args, report, ctx_for, toks)


def decode_cost(args, report: dict, ctx_for, toks: list[int]) -> None:
    """Part 1: single-token decodes under the four abort-callback variants, interleaved."""
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


def prefill_and_cancel(args, report: dict, ctx_for, toks: list[int]) -> None:
    """Parts 2 and 3: the prompt in bounded calls (the longest call), then a cancel during a prefill."""
    if not args.skip_prefill:
        report["prefill"] = {}
        for c in [int(x) for x in args.calls.split(",")]:
            pctx = ctx_for(c)
            times: list[float] = []
            orig = pctx.run_decode

            def timed(*a, _orig=orig, _times=times, _ctx=pctx, **kw):
                # a GPU decode without outputs returns before its kernels end: wait for them, so each
                # call's time is its work (the next call would wait for them anyway)
                t = time.perf_counter()
                _orig(*a, **kw)
                llama_cpp.llama_synchronize(_ctx.ptr)
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

    cctx = ctx_for(args.cancel_calls)
    stop = Stop()
    cctx.stop = stop
    when: list[float] = []

    def cancel() -> None:
        time.sleep(args.cancel_after)
        when.append(time.monotonic())
        stop.cancel()

    threading.Thread(target=cancel, daemon=True).start()
    try:
        cctx.decode(toks, range(len(toks)), logits="last")
        report["cancel_latency_s"] = None
    except RunCancelled:
        llama_cpp.llama_synchronize(cctx.ptr)  # the job ends when the device is free again
        report["cancel_latency_s"] = round(time.monotonic() - when[0], 4)
    report["cancel"] = {"call_tokens": args.cancel_calls, "after_s": args.cancel_after}
    print(f"cancel {args.cancel_after} s into a {len(toks)}-token prefill in calls of {args.cancel_calls}: "
          f"ended {report['cancel_latency_s']} s after cancel()", flush=True)
    cctx.close()
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
