#!/usr/bin/env python
"""Does one decode batch cost more when its sequences' ids are not consecutive? (issue 50 item 1)

With one KV stream per slot (the serving loop's default) llama.cpp cuts a batch into micro-batches with
`split_equal(n_ubatch, sequential=true)`: one micro-batch takes sequences of consecutive ids only, so
decode rows of slots {0, 2, 4, 6} run as four micro-batches (four passes over the weights) where slots
{0, 1, 2, 3} run as one. Under per-document arrival a document's follow-ups go to the slot holding its
prompt, so busy slots have gaps. This times one decode row per listed sequence (each sequence holds 64
prompt tokens), the configurations round-robin, and writes medians with provenance.

    .venv/bin/python scripts/probe_slot_gaps.py --model ~/.cache/specq/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --rounds 12 --json bench/results/cpu-slot-gaps-2026-12-07.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = {"0": [0], "0-3": [0, 1, 2, 3], "0,2,4,6": [0, 2, 4, 6], "0-7": list(range(8)), "0,1,3,4,6,7": [0, 1, 3, 4, 6, 7]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    import llama_cpp  # noqa: F401  (before numpy)

    from specq.bench.provenance import Start, provenance
    from specq.engine.llama.binding import Context, Model

    start = Start()
    m = Model(args.model, n_gpu_layers=0)
    ctx = Context(m, n_ctx=8 * 1024, n_batch=512, n_ubatch=512, n_threads=args.threads, n_seq_max=8, kv_unified=False)
    for s in range(8):
        ctx.decode(list(range(100, 164)), range(0, 64), seq_ids=s, logits="last")

    def step(seqs: list[int]) -> float:
        t = time.perf_counter()
        ctx.decode([200] * len(seqs), [64] * len(seqs), seq_ids=list(seqs), logits=[True] * len(seqs))
        dt = time.perf_counter() - t
        for s in seqs:
            ctx.seq_rm(s, 64, -1)
        return dt * 1000.0

    for seqs in CONFIGS.values():
        step(seqs)
    ms: dict[str, list[float]] = {k: [] for k in CONFIGS}
    for _ in range(args.rounds):
        for k, seqs in CONFIGS.items():
            ms[k].append(step(seqs))
    out = {"what": "one decode row per listed sequence (slot), one KV stream each: llama_decode ms",
           "model": str(args.model), "rounds": args.rounds,
           "median_ms": {k: round(statistics.median(v), 2) for k, v in ms.items()},
           "min_ms": {k: round(min(v), 2) for k, v in ms.items()}, "ms": ms,
           "provenance": provenance(start=start)}
    print(json.dumps({k: out[k] for k in ("median_ms", "min_ms")}))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
