"""#17 on the CPU real pair: several baseline questions about one document arriving together at a
worker with as many serving slots (engine/serving.py). With the prompt cache, the first prefills the
document and the others restore it once it is saved (`ServingEngine._prefix_owner`); without it
(SPECQ_CACHE_BYTES=0) each prefills the whole prompt. Both runs in one process, one after the other,
same engine options otherwise; per question: TTFT, prefilled tokens, cache hit; and the wall time
of all of them.

    nice -n 10 .venv/bin/python scripts/measure_arriving_together.py OUT.json [--questions 4] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

from specq.engine.options import EngineOptions, RunParams
from specq.engine.pipeline import Engine
from specq.engine.serving import ServingEngine

QS = ["Which company did the Python core development team move to in May 2000?",
      "What does the license say about warranties?",
      "Which license is Python distributed under?",
      "Who is the licensee in this agreement?",
      "In which year was the first license version granted?",
      "What must be retained in derivative works?",
      "Which country's law governs the agreement?",
      "What is the name of the foundation?"]


def run(text: str, n: int, max_tokens: int, cache_bytes: int, threads: int) -> dict:
    eng = Engine(EngineOptions(n_gpu_layers=0, n_ctx=4096, slots=n, cache_bytes=cache_bytes, n_threads=threads))
    loop = ServingEngine(eng).start()
    try:
        t0 = time.perf_counter()
        handles = [loop.submit(text, RunParams(question=q, mode="baseline", max_tokens=max_tokens), scope="t")
                   for q in QS[:n]]
        results = [h.result() for h in handles]
        wall = time.perf_counter() - t0
        rows = []
        for q, r in zip(QS, results):
            t = r.spec.cache["target"]
            rows.append({"question": q, "prompt_tokens": r.usage.prompt_tokens, "ttft_ms": round(r.timings_ms["ttft"], 1),
                         "sparse_prefill_ms": round(r.timings_ms["sparse_prefill"], 1),
                         "cache_restore_ms": round(r.timings_ms.get("cache_restore", 0.0), 1),
                         "hit": t["hit"] if isinstance(t, dict) else False,
                         "prefilled_tokens": t["prefilled_tokens"] if isinstance(t, dict) else r.usage.prompt_tokens,
                         "answer": r.text})
        return {"cache_bytes": cache_bytes, "wall_s": round(wall, 2), "prefix_waits": loop.prefix_waits,
                "engine": vars(eng.info), "rows": rows}
    finally:
        loop.close()
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--document", default="examples/python-license.txt")
    args = ap.parse_args()
    text = open(args.document).read()
    threads = os.cpu_count() or 1
    report = {"command": "scripts/measure_arriving_together.py " + " ".join(f"{k}={v}" for k, v in vars(args).items()),
              "commit": subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip(),
              "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""),
              "threads": threads, "load_before": os.getloadavg(), "runs": []}
    for budget in (1 << 30, 0):
        r = run(text, args.questions, args.max_tokens, budget, threads)
        report["runs"].append(r)
        print(f"cache_bytes {budget}: wall {r['wall_s']} s, prefilled {[x['prefilled_tokens'] for x in r['rows']]}, "
              f"ttft ms {[x['ttft_ms'] for x in r['rows']]}", flush=True)
    report["load_after"] = os.getloadavg()
    a, b = report["runs"]
    report["wall_ratio_uncached_over_cached"] = round(b["wall_s"] / a["wall_s"], 3)
    report["same_answers"] = [x["answer"] for x in a["rows"]] == [x["answer"] for x in b["rows"]]
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: report[k] for k in ("wall_ratio_uncached_over_cached", "same_answers", "load_before", "load_after")}))


if __name__ == "__main__":
    main()
