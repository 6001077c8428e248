"""On the GPU machine: score math on the host (numpy) vs on the device (torch), same speculator, same
windows, side by side. Prints the phase times and how close the scores are. Usage:
    python3 bench/gpu/score_check.py SPECULATOR.gguf [LENGTHS] [JSON_OUT]
"""

from __future__ import annotations

import llama_cpp  # noqa: F401  (before numpy: see bench/gpu/README.md, "Pitfalls")

import json
import statistics
import sys
import time

import numpy as np

from specq.bench.ttft import QUESTION, make_document
from specq.engine.llama import binding as llama
from specq.engine.prompt.build import build_prompt
from specq.engine.scoring.scorer import SpecPrefillScorer
from specq.engine.scoring.selection import select_kept


def main() -> None:
    path = sys.argv[1]
    lengths = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "8192,32768").split(",")]
    llama.init_backend()
    model = llama.Model(path, n_gpu_layers=-1)
    kw = dict(n_ctx=32768, n_batch=4096, n_ubatch=2048, n_threads=int(__import__("os").environ.get("THREADS", "16")), flash_attn=True, n_parallel=8)
    scorers = {m: SpecPrefillScorer(model, score_math=m, **kw) for m in ("numpy", "torch")}
    rows = []
    for n in lengths:
        prompt = build_prompt(model, make_document(model, n), QUESTION)
        got: dict[str, list] = {m: [] for m in scorers}
        scores = {}
        for rep in range(4):  # the first round is a warm-up
            for m, sc in scorers.items():
                t0 = time.perf_counter()
                res = sc.score(prompt)
                total = (time.perf_counter() - t0) * 1000
                if rep:
                    got[m].append(dict(res.timings_ms, total=total))
                scores[m] = res.scores
        a, b = scores["numpy"], scores["torch"]
        ka = set(select_kept(a, doc_start=prompt.doc_start, n_prompt=prompt.n, protected=[], keep=0.3, rule="border"))
        kb = set(select_kept(b, doc_start=prompt.doc_start, n_prompt=prompt.n, protected=[], keep=0.3, rule="border"))
        row = {
            "prompt_tokens": prompt.n,
            "max_rel_diff": float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-6))),
            "corr": float(np.corrcoef(a, b)[0, 1]),
            "kept_overlap": len(ka & kb) / max(1, len(ka)),
        }
        for m in scorers:
            row[m] = {k: round(statistics.median(r[k] for r in got[m]), 1) for k in got[m][0]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            json.dump({"rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
