"""#17 item 4 on the CPU real pair: several specprefill questions about one document arriving together
at a worker with as many serving slots, with the loop's group-sparse prefill on and off
(engine/serving_group.py; SPECQ_GROUP_SPARSE). Runs alternate on, off, on, ... in one process (one
engine per run, the caches empty at each start, the same engine options otherwise); per run the wall
time of all questions, and per question TTFT, the target tokens it prefilled and its answer. The
answers of a group-on run are compared with the group-off run's (plain specprefill per question).

    nice -n 10 .venv/bin/python scripts/measure_group_in_loop.py OUT.json [--questions 4] [--max-tokens 16] [--rounds 1]
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


def run(text: str, n: int, max_tokens: int, group: bool, threads: int) -> dict:
    eng = Engine(EngineOptions(n_gpu_layers=0, n_ctx=4096, slots=n, n_threads=threads))
    loop = ServingEngine(eng, group_sparse=group).start()
    try:
        t0 = time.perf_counter()
        handles = [loop.submit(text, RunParams(question=q, mode="specprefill", max_tokens=max_tokens), scope="t")
                   for q in QS[:n]]
        results = [h.result() for h in handles]
        wall = time.perf_counter() - t0
        rows = []
        for q, r in zip(QS, results):
            g = r.group or {}
            rows.append({"question": q, "prompt_tokens": r.usage.prompt_tokens, "kept_tokens": r.usage.kept_tokens,
                         "ttft_ms": round(r.timings_ms["ttft"], 1), "score_ms": round(r.timings_ms["score"], 1),
                         "sparse_prefill_ms": round(r.timings_ms["sparse_prefill"], 1),
                         "group_wait_ms": round(r.timings_ms.get("group_wait", 0.0), 1),
                         "prefilled_tokens": g.get("prefilled_tokens", r.usage.kept_tokens),
                         "union_kept_fraction": g.get("union_kept_fraction"), "own_kept_fraction": g.get("own_kept_fraction"),
                         "union_from": g.get("union_from"), "answer": r.text})
        return {"group_sparse": group, "wall_s": round(wall, 2), "stats": loop.stats(), "load": os.getloadavg(),
                "rows": rows}
    finally:
        loop.close()
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1, help="on/off pairs")
    ap.add_argument("--document", default="examples/python-license.txt")
    args = ap.parse_args()
    text = open(args.document).read()
    threads = os.cpu_count() or 1
    report = {"command": "scripts/measure_group_in_loop.py " + " ".join(f"{k}={v}" for k, v in vars(args).items()),
              "commit": subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip(),
              "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""),
              "threads": threads, "load_before": os.getloadavg(), "runs": []}
    for _ in range(args.rounds):
        for group in (True, False):
            r = run(text, args.questions, args.max_tokens, group, threads)
            report["runs"].append(r)
            print(f"group_sparse {group}: wall {r['wall_s']} s, prefilled {[x['prefilled_tokens'] for x in r['rows']]}, "
                  f"ttft ms {[x['ttft_ms'] for x in r['rows']]}", flush=True)
    report["load_after"] = os.getloadavg()
    on = [r for r in report["runs"] if r["group_sparse"]]
    off = [r for r in report["runs"] if not r["group_sparse"]]
    report["wall_ratio_off_over_on"] = [round(b["wall_s"] / a["wall_s"], 3) for a, b in zip(on, off)]
    report["same_answer_as_plain"] = [sum(x["answer"] == y["answer"] for x, y in zip(a["rows"], b["rows"]))
                                      for a, b in zip(on, off)]
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: report[k] for k in ("wall_ratio_off_over_on", "same_answer_as_plain", "load_before", "load_after")}))


if __name__ == "__main__":
    main()
