"""#17 item 4 on the CPU real pair: several specprefill questions about one document arriving together
at a worker with as many serving slots, with the loop's group-sparse prefill on and off
(engine/serving/groups.py; SPECQ_GROUP_SPARSE). Runs alternate on, off, on, ... in one process (one
engine per run, the caches empty at each start, the same engine options otherwise); per run the wall
time of all questions, and per question TTFT, the target tokens it prefilled and its answer. The
answers of a group-on run are compared with the group-off run's (plain specprefill per question).

    nice -n 10 .venv/bin/python scripts/measure_group_in_loop.py OUT.json [--questions 4] [--max-tokens 16] [--rounds 1]
"""

from __future__ import annotations

import json
import os

from measure_common import QS, arguments, questions_together, report_header


def run(text: str, n: int, max_tokens: int, group: bool, threads: int) -> dict:
    results, wall, info = questions_together(text, n, max_tokens, "specprefill", {"n_threads": threads},
                                             {"group_sparse": group})
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
    return {"group_sparse": group, "wall_s": round(wall, 2), "stats": info["stats"], "load": os.getloadavg(),
            "rows": rows}


def main() -> None:
    ap = arguments()
    ap.add_argument("--rounds", type=int, default=1, help="on/off pairs")
    args = ap.parse_args()
    text = open(args.document).read()
    report = report_header("measure_group_in_loop.py", args)
    threads = report["threads"]
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
