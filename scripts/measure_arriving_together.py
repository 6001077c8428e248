"""#17 on the CPU real pair: several baseline questions about one document arriving together at a
worker with as many serving slots (engine/serving/loop.py). With the prompt cache, the first prefills the
document and the others restore it once it is saved (`ServingEngine._prefix_owner`); without it
(SPECQ_CACHE_BYTES=0) each prefills the whole prompt. Both runs in one process, one after the other,
same engine options otherwise; per question: TTFT, prefilled tokens, cache hit; and the wall time
of all of them.

    nice -n 10 .venv/bin/python scripts/measure_arriving_together.py OUT.json [--questions 4] [--max-tokens 16]
"""

from __future__ import annotations

import json
import os

from measure_common import QS, arguments, questions_together, report_header


def run(text: str, n: int, max_tokens: int, cache_bytes: int, threads: int) -> dict:
    results, wall, info = questions_together(text, n, max_tokens, "baseline", {"cache_bytes": cache_bytes, "n_threads": threads})
    rows = []
    for q, r in zip(QS, results):
        t = r.spec.cache["target"]
        rows.append({"question": q, "prompt_tokens": r.usage.prompt_tokens, "ttft_ms": round(r.timings_ms["ttft"], 1),
                     "sparse_prefill_ms": round(r.timings_ms["sparse_prefill"], 1),
                     "cache_restore_ms": round(r.timings_ms.get("cache_restore", 0.0), 1),
                     "hit": t["hit"] if isinstance(t, dict) else False,
                     "prefilled_tokens": t["prefilled_tokens"] if isinstance(t, dict) else r.usage.prompt_tokens,
                     "answer": r.text})
    return {"cache_bytes": cache_bytes, "wall_s": round(wall, 2), "prefix_waits": info["prefix_waits"],
            "engine": info["engine"], "rows": rows}


def main() -> None:
    ap = arguments()
    args = ap.parse_args()
    text = open(args.document).read()
    report = report_header("measure_arriving_together.py", args)
    threads = report["threads"]
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
