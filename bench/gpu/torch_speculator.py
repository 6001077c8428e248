"""The PyTorch speculator's scoring pass on a GPU, against the card's measured F16 throughput (issue 50, item 2).

`speculator_impl torch` (specq/engine/scoring/torch_speculator.py) runs the speculator's window procedure
in PyTorch: prefill the windows, `lookahead` greedy steps, the score formula on the device. This script
times exactly that for a prompt of each `--lengths` cut into the scorer's windows (engine/options.py:
DEFAULT_WINDOW tokens each; ONE_PASS_TOKENS and below one window), scored together as the scorer does
(`--batch 0`: one window at a time), with the prefill in one call (`call_tokens` 0: causal SDPA,
FlashAttention where PyTorch has it) and in the engine's calls of 2,048 tokens' worth of work (groups of
layers), and reports tokens/s and the fraction of the card's F16 matmul throughput measured in the same
process (specq/bench/flops.py, as `bench ttft`).

It needs no llama.cpp: it runs on the GPU machine before (or without) the CUDA build. The model is a
random-weight GGUF of a real shape (`--shape`, written here by specq.testing.synthetic with the real
Qwen2 vocabulary when `--vocab` is given); timing does not depend on weight values.

    PYTHONPATH=/tmp/site:$PWD python3 bench/gpu/torch_speculator.py --shape 0.5b --vocab .gpu/ggml-vocab-qwen2.gguf \
      --lengths 8192,32768 --out $OUT/torch-speculator.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specq.bench.flops import measured_peak, prefill_flops, read_shape  # noqa: E402
from specq.bench.provenance import code_state, host, load_now  # noqa: E402
from specq.engine.options import DEFAULT_WINDOW, ONE_PASS_TOKENS  # noqa: E402


def windows(n: int) -> list[int]:
    """Window sizes the scorer would use for an n-token document (head and question tail left out)."""
    if n <= ONE_PASS_TOKENS:
        return [n]
    k = -(-n // DEFAULT_WINDOW)
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="a GGUF (default: write a random-weight one of --shape)")
    ap.add_argument("--shape", default="0.5b")
    ap.add_argument("--vocab", default="bytes")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--lookahead", type=int, default=8)
    ap.add_argument("--pool", type=int, default=13)
    ap.add_argument("--call-tokens", default="0,2048", help="prefill call sizes to time (0: one call a window)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1, help="1: the windows scored together, as the scorer does; 0: one at a time")
    ap.add_argument("--graphs", type=int, default=1, help="1: look-ahead steps as CUDA graphs (the default on CUDA); 0: eager")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (a check of this script with a tiny shape)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    load = load_now()
    code = code_state()
    import torch

    from specq.engine.scoring.torch_speculator import TorchSpeculator

    path = a.model
    t0 = time.perf_counter()
    if not path:
        from specq.testing.synthetic import write_qwen2_gguf

        path = str(write_qwen2_gguf(Path("/tmp") / f"torch-spec-{a.shape}.gguf", a.shape, vocab=a.vocab, seed=0))
    write_s = time.perf_counter() - t0
    peak = measured_peak() if a.device == "cuda" else None

    def sync() -> None:
        if a.device == "cuda":
            torch.cuda.synchronize()
    t0 = time.perf_counter()
    spec = TorchSpeculator(path, device=a.device, graphs=bool(a.graphs))
    load_s = time.perf_counter() - t0
    shape = read_shape(path)
    rng = torch.Generator().manual_seed(0)
    n_vocab = spec.embd.shape[0]
    rows = []
    report = {"benchmark": "torch-speculator", "model": Path(path).name, "shape": a.shape, "write_s": round(write_s, 1),
              "load_s": round(load_s, 1), "peak": peak, "lookahead": a.lookahead, "pool": a.pool,
              "dtype": str(spec.dtype), "kv_dtype": str(spec.kv_dtype), "batch": a.batch,
              "graphs": spec.graphs, "rows": rows}

    def save() -> None:
        report["provenance"] = {
            "code": code, "library": {"torch": torch.__version__, "cuda": torch.version.cuda,
                                      "llama_cpp_python": "not used (torch only)"},
            "numerics": {"speculator_impl": "torch", "device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"},
            "positions": [], "warnings": [], "host": host(load), "argv": list(sys.argv),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")

    for n in (int(x) for x in a.lengths.split(",")):
        sizes = windows(n)
        for call in (int(x) for x in a.call_tokens.split(",")):
            per_rep = []
            for rep in range(a.reps + 1):  # the first is a warm-up
                timings: dict[str, float] = {}
                sync()
                t = time.perf_counter()
                toks = [torch.randint(0, n_vocab, (w,), generator=rng).tolist() for w in sizes]
                if a.batch:  # as the scorer runs them: all windows together (one forward per look-ahead step)
                    spec.score_windows(toks, a.lookahead, a.pool, call_tokens=call, timings=timings)
                else:
                    for t in toks:
                        spec.score_window(t, a.lookahead, a.pool, call_tokens=call, timings=timings)
                sync()
                if rep:
                    per_rep.append({"wall_ms": (time.perf_counter() - t) * 1000.0, **timings})
            med = {k: statistics.median(r[k] for r in per_rep) for k in per_rep[0]}
            flops = prefill_flops(shape, [(0, w - 1) for w in sizes])
            tflops = flops / (med["speculator_prefill"] / 1000.0) / 1e12
            row = {"tokens": n, "windows": len(sizes), "window_tokens": sizes[0], "call_tokens": call,
                   "ms": {k: round(v, 1) for k, v in med.items()},
                   "prefill_tokens_per_s": round(n / (med["speculator_prefill"] / 1000.0)),
                   "prefill_tflops": round(tflops, 1),
                   "fraction_of_peak": round(tflops / peak["tflops"], 3) if peak else None,
                   "reps": a.reps}
            rows.append(row)
            report["graphs"], report["graphs_off"] = spec.graphs, spec.graphs_off
            print(json.dumps(row), flush=True)
            save()
    save()


if __name__ == "__main__":
    main()
