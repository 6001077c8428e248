"""The PyTorch speculator (specq/engine/scoring/torch_speculator.py) against llama.cpp's: on the CPU on the real
speculator, or with `--gpu` on a GPU (any GGUF, e.g. a random-weight one of a real shape).

For each document (Python standard-library source cut to a token count; modules are joined when one is
too short), the windowed scorer scores it once with speculator_impl llama and once with torch (same
window plan, lookahead, pool); the report gives per window the kept-set Jaccard at `--keep` (select_kept,
chunk 32, the default chunk rule), the scores' Pearson correlation, and each implementation's seconds
(speculator prefill, lookahead, score math). `--gpu` builds the scorer as the engine does on a GPU
(all layers offloaded, n_ubatch 2048, 8 windows in parallel, the GPU call size, torch score math) and
runs the torch forward on cuda.

    nice -n 10 .venv/bin/python bench/torch_speculator_cpu.py --out bench/results/cpu-torch-speculator-<date>.json
    LD_PRELOAD=/lib/x86_64-linux-gnu/libstdc++.so.6 PYTHONPATH=/tmp/site:$PWD python3 bench/torch_speculator_cpu.py \
      --gpu --speculator /tmp/models/0.5b.gguf --tokens 8192,32768 --out $OUT/torch-speculator-match.json
"""

from __future__ import annotations

import llama_cpp  # noqa: F401  isort: skip  (before numpy and torch)

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specq.bench.provenance import Start, numerics_of, provenance  # noqa: E402
from specq.engine import models  # noqa: E402
from specq.engine.llama import binding as llama  # noqa: E402
from specq.engine.options import EngineOptions, RunParams  # noqa: E402
from specq.engine.prompt.build import build_prompt  # noqa: E402
from specq.engine.scoring.scorer import SpecPrefillScorer  # noqa: E402
from specq.engine.scoring.selection import select_kept  # noqa: E402
from specq.engine.scoring.torch_speculator import TorchSpeculator  # noqa: E402

#: standard-library modules whose source makes the documents (each cut to its token count)
FILES = ("argparse", "textwrap", "shlex", "fnmatch", "calendar")
QUESTION = "What does this module do, and which function would I call first?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speculator", default=models.DEFAULT_SPECULATOR, help="registry name or GGUF path")
    ap.add_argument("--tokens", default="2048,2304,2560,2816,3072", help="document tokens, one document each")
    ap.add_argument("--keep", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp and torch threads (1: the host is shared)")
    ap.add_argument("--gpu", action="store_true", help="llama.cpp on the GPU (all layers) and torch on cuda")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    start = Start()  # the code and load as the run starts (the tree may change while it runs)
    path = Path(models.resolve_model(args.speculator))
    sizes = [int(x) for x in args.tokens.split(",")]
    model = llama.Model(path, n_gpu_layers=-1 if args.gpu else 0)
    run = RunParams(question=QUESTION)
    opts = EngineOptions(n_gpu_layers=-1 if args.gpu else 0)
    from specq.engine.pipeline import default_call_tokens

    # the engine's scoring context (pipeline.Engine): on the CPU n_ubatch 512, one window at a time; on a
    # GPU n_ubatch 2048, 8 windows in parallel, torch score math; call_tokens per backend
    backend = "cuda" if args.gpu else "cpu"
    kw = dict(n_ctx=max(8192, max(sizes) + 1024), n_batch=opts.n_batch, n_ubatch=opts.n_ubatch or (2048 if args.gpu else 512),
              n_threads=args.threads, flash_attn=True, call_tokens=default_call_tokens(backend),
              n_parallel=8 if args.gpu else 1, score_math="torch" if args.gpu else "numpy")
    t = time.perf_counter()
    scorers = {"llama": SpecPrefillScorer(model, **kw)}
    t_llama = time.perf_counter() - t
    t = time.perf_counter()
    scorers["torch"] = SpecPrefillScorer(model, torch_speculator=TorchSpeculator(path, device=backend), **kw)
    t_torch = time.perf_counter() - t
    rows = []
    import importlib

    for i, n_tok in enumerate(sizes):
        names, toks = [], []
        while len(toks) < n_tok:  # this document's module first, then the next ones, until it is long enough
            name = FILES[(i + len(names)) % len(FILES)]
            names.append(name)
            toks += model.tokenize(Path(importlib.import_module(name).__file__).read_text())
        toks = toks[:n_tok]
        doc = model.detokenize(toks)
        prompt = build_prompt(model, doc, QUESTION)
        got, secs = {}, {}
        for impl, sc in scorers.items():
            t = time.perf_counter()
            got[impl] = sc.score(prompt, lookahead=run.lookahead, pool=run.pool)
            secs[impl] = time.perf_counter() - t
        a, b = got["llama"], got["torch"]
        assert a.plan == b.plan
        kept = {impl: set(select_kept(r.scores, doc_start=prompt.doc_start, n_prompt=prompt.n,
                                      protected=prompt.protected_indices(), keep=args.keep, chunk=run.chunk))
                for impl, r in got.items()}
        per_window = []
        for s, e in a.plan:
            ka = {i for i in kept["llama"] if s <= i - prompt.doc_start < e}
            kb = {i for i in kept["torch"] if s <= i - prompt.doc_start < e}
            per_window.append({"slice": [s, e], "jaccard": round(len(ka & kb) / max(1, len(ka | kb)), 4),
                               "pearson": round(float(np.corrcoef(a.scores[s:e], b.scores[s:e])[0, 1]), 5)})
        row = {"document": "+".join(f"{n}.py" for n in names), "doc_tokens": len(prompt.document), "prompt_tokens": prompt.n,
               "windows": per_window,
               "jaccard_doc": round(len(kept["llama"] & kept["torch"]) / len(kept["llama"] | kept["torch"]), 4),
               "seconds": {k: round(v, 2) for k, v in secs.items()},
               "timings_ms": {k: {p: round(v, 1) for p, v in got[k].timings_ms.items()} for k in got}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    jac = [w["jaccard"] for r in rows for w in r["windows"]]
    summary = {
        "windows": len(jac), "jaccard_min": min(jac), "jaccard_median": statistics.median(jac),
        "windows_jaccard_ge_0.9": sum(j >= 0.9 for j in jac),
        "pearson_min": min(w["pearson"] for r in rows for w in r["windows"]),
        "seconds_total": {k: round(sum(r["seconds"][k] for r in rows), 1) for k in scorers},
        "speculator_prefill_tok_per_s": {
            k: round(sum(r["prompt_tokens"] for r in rows) / (sum(r["timings_ms"][k]["speculator_prefill"] for r in rows) / 1000), 1)
            for k in scorers},
        "load_seconds": {"llama": round(t_llama, 2), "torch": round(t_torch, 2)},
    }
    print(json.dumps(summary), flush=True)
    report = {
        "benchmark": "torch-speculator-gpu" if args.gpu else "torch-speculator-cpu", "speculator": path.name, "keep": args.keep, "chunk": run.chunk,
        "lookahead": run.lookahead, "pool": run.pool, "scorer": "windowed (default window: one pass up to 8,192 tokens)",
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "torch_dtype": "float32, KV cache float16",
        "documents": rows, "summary": summary,
        "provenance": provenance(None, speculator=numerics_of(model, scorers["llama"].ctx), start=start),
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
