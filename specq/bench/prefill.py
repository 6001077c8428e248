"""`specq bench prefill`: raw prefill and decode speed of one model through the engine's llama layer,
and what a gapped prefill (original positions) costs against a contiguous prefill of the same count.

For a prompt of N tokens and keep fraction k it times, alternating, `reps` times each:
  full       — all N tokens at positions 0..N-1
  gapped     — k·N tokens (every other 32-token chunk run) at their original positions
  compressed — the same k·N tokens at positions 0..k·N-1
and then `decode` single-token steps after a full prefill. Reported: medians and tokens/s.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import llama_cpp  # noqa: F401  (before numpy)

from ..engine.llama.binding import Context, Model
from ..engine.decode.prefill import sparse_prefill


def run_prefill_bench(model_path: str, *, n_tokens: int, keep: float, decode_tokens: int, reps: int, n_gpu_layers: int,
                      n_threads: int, n_batch: int, n_ubatch: int, say: Callable[[str], None] = print) -> dict[str, Any]:
    from .provenance import Start, numerics_of, provenance
    from .ttft import make_document

    start = Start()
    model = Model(model_path, n_gpu_layers=n_gpu_layers)
    # position_gaps: the gapped arm prefills at original positions (patch 0001), as the engine does
    ctx = Context(model, n_ctx=n_tokens + decode_tokens + 64, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads,
                  position_gaps=True)
    tokens = model.tokenize(make_document(model, n_tokens))
    n = len(tokens)
    chunk = 32
    # keep the first `keep` share of every run of chunks: spread over the whole prompt, with gaps
    period = max(1, round(1 / keep))
    kept = [i for i in range(n - 1) if (i // chunk) % period == 0] + [n - 1]
    runs: dict[str, list[float]] = {"full": [], "gapped": [], "compressed": [], "decode": []}
    for r in range(reps + 1):  # the first round is a warm-up
        order = [("full", list(range(n)), "original"), ("gapped", kept, "original"), ("compressed", kept, "compressed")]
        if r % 2:
            order.reverse()
        for name, idx, positions in order:
            t0 = time.perf_counter()
            pre = sparse_prefill(ctx, tokens, idx, positions)
            if r:
                runs[name].append(time.perf_counter() - t0)
        # decode after the full prefill
        sparse_prefill(ctx, tokens, list(range(n)), "original")
        tok, pos = int(pre.logits.argmax()), n
        t0 = time.perf_counter()
        for _ in range(decode_tokens):
            ctx.decode([tok], [pos], logits="last")
            tok, pos = int(ctx.logits_row(-1).argmax()), pos + 1
        if r:
            runs["decode"].append(time.perf_counter() - t0)
        say(f"round {r}/{reps}" + (" (warm-up)" if r == 0 else ""))
    med = {k: statistics.median(v) for k, v in runs.items()}
    report = {
        "model": model.path.name,
        "prompt_tokens": n,
        "kept_tokens": len(kept),
        "full_s": round(med["full"], 4),
        "full_tok_s": round(n / med["full"], 1),
        "gapped_s": round(med["gapped"], 4),
        "gapped_tok_s": round(len(kept) / med["gapped"], 1),
        "compressed_s": round(med["compressed"], 4),
        "compressed_tok_s": round(len(kept) / med["compressed"], 1),
        "gapped_vs_compressed": round(med["gapped"] / med["compressed"], 3),
        "decode_tok_s": round(decode_tokens / med["decode"], 2),
        "reps": reps,
        "threads": n_threads,
    }
    report = {"benchmark": "prefill", **report}
    report["provenance"] = provenance(
        None, positions=["original", "compressed"], start=start,
        numerics_by_mode={"model": numerics_of(model, ctx)})
    report["commit"] = report["provenance"]["code"]["describe"]
    ctx.close()
    model.close()
    return report
