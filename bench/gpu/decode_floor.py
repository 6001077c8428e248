"""What one decode step of 8 questions about one document costs, by where the document's KV lives.

#17's second goal (`auto` >= 2.5x specprefill without reuse, 8 documents x 8 questions at 32K, 128
tokens each, 8 slots) is bounded by the target's full prefills plus ~1,000 decode steps of 8 rows
(docs/history.md, "the lower bound"). The serving loop keeps one KV stream per slot, so 8 questions
about one document decode over 8 copies of its KV. This measures, on one loaded target, the step
cost of the layouts a server could use:

* `streams`: one stream per sequence (specq's slots, llama-server's per-slot KV), the document
  prefilled into sequence 0 and copied into the other 7 streams (seq_cp copies whole streams);
* `shared`: one unified cache, the document prefilled once and shared by the 8 sequences (seq_cp
  inside one stream adds the sequence to the same cells: one copy of the KV, read once per step);
* `short`: 8 sequences of `--short` tokens each, one stream each: the floor, weights and launches only.

Each sequence then prefills a tail of its own (`--tail` tokens) and the 8 decode `--steps` steps of one
row each, in one batch per step (logits for every row, as the loop samples). Per step: wall time of
llama_decode + synchronize, median and p90. Random token ids: the cost does not depend on them.

    python3 bench/gpu/decode_floor.py --target /tmp/models/7b.gguf --out $OUT/decode-floor.json
"""

from __future__ import annotations

import llama_cpp  # noqa: F401  (before numpy: see bench/gpu/README.md, "Pitfalls")

import argparse
import json
import os
import shlex
import statistics
import sys
import time

import numpy as np

from specq.bench.provenance import Start, numerics_of, provenance
from specq.engine.llama import binding as llama


def _step_times(ctx: llama.Context, n_seq: int, start_pos: list[int], steps: int, vocab: int,
                rng: np.random.Generator) -> list[float]:
    times = []
    pos = list(start_pos)
    for _ in range(steps):
        toks = rng.integers(1000, vocab - 1000, size=n_seq).tolist()
        t0 = time.perf_counter()
        ctx.decode(toks, pos, seq_ids=list(range(n_seq)), logits="all")
        ctx.synchronize()
        times.append((time.perf_counter() - t0) * 1000.0)
        pos = [p + 1 for p in pos]
    return times


def _summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"median_ms": round(statistics.median(ordered), 3),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
            "min_ms": round(ordered[0], 3), "steps": len(ordered)}


def run_case(model: llama.Model, layout: str, args: argparse.Namespace) -> dict:
    n_seq, per_seq = args.seqs, args.ctx
    unified = layout == "shared"
    ctx = llama.Context(model, n_ctx=n_seq * per_seq, n_batch=args.n_batch, n_ubatch=args.n_ubatch,
                        n_threads=args.threads, flash_attn=True, n_seq_max=n_seq, kv_unified=unified)
    rng = np.random.default_rng(0)
    vocab = model.n_vocab
    out: dict = {"layout": layout, "kv_unified": unified, "seqs": n_seq, "cells_per_seq": per_seq,
                 "numerics": numerics_of(model, ctx)}
    doc_len = args.short if layout == "short" else args.doc
    doc = rng.integers(1000, vocab - 1000, size=doc_len).tolist()
    t0 = time.perf_counter()
    ctx.decode(doc, list(range(doc_len)), seq_ids=0, logits="last")
    ctx.synchronize()
    out["doc_tokens"] = doc_len
    out["doc_prefill_ms"] = round((time.perf_counter() - t0) * 1000.0, 1)
    t0 = time.perf_counter()
    for s in range(1, n_seq):
        if unified:
            ctx.seq_cp(0, s, 0, doc_len)   # the same cells, one more sequence on them
        else:
            ctx.seq_cp(0, s)               # whole stream copied (at the next llama_decode)
    # each question's own tail, at its positions after the document (the stream copies run here)
    for s in range(n_seq):
        tail = rng.integers(1000, vocab - 1000, size=args.tail).tolist()
        ctx.decode(tail, list(range(doc_len, doc_len + args.tail)), seq_ids=s, logits="last")
    ctx.synchronize()
    out["copy_and_tails_ms"] = round((time.perf_counter() - t0) * 1000.0, 1)
    _step_times(ctx, n_seq, [doc_len + args.tail] * n_seq, 4, vocab, rng)   # warm the step's kernels
    times = _step_times(ctx, n_seq, [doc_len + args.tail + 4] * n_seq, args.steps, vocab, rng)
    out["step"] = _summary(times)
    ctx.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--doc", type=int, default=29_869, help="document tokens (the #17 workload's p50 prompt)")
    ap.add_argument("--tail", type=int, default=32, help="each question's own tokens after the document")
    ap.add_argument("--short", type=int, default=256, help="each sequence's prompt in the floor case")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=33_792, help="cells per sequence (SPECQ_N_CTX)")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--n-batch", type=int, default=4096)
    ap.add_argument("--n-ubatch", type=int, default=2048)
    ap.add_argument("--cuda-graphs", action="store_true", help="default off, as production (SPECQ_CUDA_GRAPHS)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    ap.add_argument("--layouts", default="short,streams,shared")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    start = Start()   # the code and the load before the run (provenance below, with the host and library)
    llama.set_cuda_graphs(args.cuda_graphs)
    model = llama.Model(args.target, n_gpu_layers=-1, repack=False)
    cases = []
    for layout in args.layouts.split(","):
        case = run_case(model, layout, args)
        print(json.dumps(case), flush=True)
        cases.append(case)
    result = {"command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv),
              "provenance": provenance(start=start, numerics_by_mode={c["layout"]: c["numerics"] for c in cases},
                                       cuda_graphs=args.cuda_graphs, backend=llama.backend_name()),
              "target": os.path.basename(args.target), "n_layer": model.n_layer, "n_head_kv": model.n_head_kv,
              "cases": cases}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
