"""How much two speculators' kept sets agree, per job, from scores saved by the recall bench (issue 50 item 2).

A faster speculator (another file of the same model, e.g. the Q4_0 requantization) is acceptable only if
the target would prefill nearly the same tokens: per job, the Jaccard overlap of the kept document chunks
at keep 0.3 must be >= 0.9. Each side's tokens scores come from
`specq bench quality recall --scores-dir DIR --speculator S` (one .npz per task and scorer, with the
document, its evidence chunks and the scoring window count); the kept set is what the engine keeps,
computed by the engine's own selection code (selection.select_kept: the top window_budget(n, keep)
chunks under the chunk rule; global selection, which is also the per-window one where a task scored in
one window, as every 4K task does). Reported: Jaccard min / p10 / median / mean over the tasks both
sides have, and each side's evidence recall (all of a task's evidence chunks kept). For scale, the same
statistics between two chunk rules on the reference side alone (`rule_change`: how much the kept sets
moved when the engine's rule changed from `mean` to `border`, a change that was accepted).

    .venv/bin/python scripts/kept_overlap.py /tmp/sc-q4km /tmp/sc-q40 [--keep 0.3] [--rules border,mean]
        [--scorer windowed] [--out bench/results/....json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specq.engine.scoring.selection import select_kept  # noqa: E402


def load(directory: Path, scorer: str) -> dict[str, dict]:
    """task id -> {scores, evidence_chunks, chunk, windows, document} of one scores dir."""
    out = {}
    suffix = f"-{scorer}.npz"
    for f in sorted(directory.glob(f"*{suffix}")):
        with np.load(f) as z:
            out[f.name[: -len(suffix)]] = {"scores": z["scores"], "ev": [int(c) for c in z["evidence_chunks"]],
                                           "chunk": int(z["chunk"]), "windows": int(z["windows"]),
                                           "document": str(z["document"])}
    return out


def kept_chunks(scores: np.ndarray, chunk: int, keep: float, rule: str) -> set[int]:
    """The document chunks the engine keeps (select_kept over the document alone, nothing protected)."""
    n = int(scores.shape[0])
    kept = select_kept(scores, doc_start=0, n_prompt=n, protected=(), keep=keep, chunk=chunk, rule=rule)
    return {i // chunk for i in kept}


def stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {"n": int(a.size), "min": round(float(a.min()), 4), "p10": round(float(np.percentile(a, 10)), 4),
            "median": round(float(np.median(a)), 4), "mean": round(float(a.mean()), 4),
            "share_ge_0.9": round(float((a >= 0.9).mean()), 4)}


def compare(a: dict[str, dict], b: dict[str, dict], keep: float, rule: str) -> dict:
    tasks = sorted(set(a) & set(b))
    per_task, rec_a, rec_b = {}, [], []
    for t in tasks:
        x, y = a[t], b[t]
        if x["document"] != y["document"] or x["scores"].shape != y["scores"].shape:
            raise SystemExit(f"{t}: the two sides scored different documents")
        ka, kb = kept_chunks(x["scores"], x["chunk"], keep, rule), kept_chunks(y["scores"], y["chunk"], keep, rule)
        per_task[t] = round(len(ka & kb) / len(ka | kb), 4)
        rec_a.append(all(c in ka for c in x["ev"]))
        rec_b.append(all(c in kb for c in y["ev"]))
    return {"rule": rule, "keep": keep, "tasks": len(tasks), "jaccard": stats(list(per_task.values())),
            "evidence_recall": {"a": round(float(np.mean(rec_a)), 4), "b": round(float(np.mean(rec_b)), 4)},
            "evidence_kept": {"a": int(sum(rec_a)), "b": int(sum(rec_b))},
            "windows": sorted({a[t]["windows"] for t in tasks} | {b[t]["windows"] for t in tasks}),
            "per_task_jaccard": per_task}


def rule_change(a: dict[str, dict], keep: float, rules: tuple[str, str]) -> dict:
    """Per-task Jaccard of one side's kept chunks under two chunk rules (the same scores)."""
    per_task = {}
    for t, x in sorted(a.items()):
        k1, k2 = (kept_chunks(x["scores"], x["chunk"], keep, r) for r in rules)
        per_task[t] = round(len(k1 & k2) / len(k1 | k2), 4)
    return {"rules": list(rules), "keep": keep, "tasks": len(per_task), "jaccard": stats(list(per_task.values())),
            "per_task_jaccard": per_task}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path, help="scores dir of the reference speculator")
    ap.add_argument("b", type=Path, help="scores dir of the candidate speculator")
    ap.add_argument("--keep", type=float, default=0.3)
    ap.add_argument("--rules", default="border,mean", help="chunk rules (the engine's default first)")
    ap.add_argument("--scorer", default="windowed")
    ap.add_argument("--labels", default="a,b", help="what each side is (the speculators), for the report")
    ap.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = ap.parse_args(argv)
    a, b = load(args.a, args.scorer), load(args.b, args.scorer)
    if not set(a) & set(b):
        raise SystemExit("no task scored on both sides")
    from specq.bench.provenance import provenance

    la, lb = args.labels.split(",")
    report = {"benchmark": "speculator-overlap", "provenance": provenance(None),
              "a": {"scores_dir": str(args.a), "speculator": la}, "b": {"scores_dir": str(args.b), "speculator": lb},
              "scorer": args.scorer,
              "by_rule": [compare(a, b, args.keep, rule) for rule in args.rules.split(",")]}
    for r in report["by_rule"]:
        j = r["jaccard"]
        print(f"{r['rule']:>6} keep {r['keep']}: {r['tasks']} tasks, Jaccard min {j['min']} p10 {j['p10']} "
              f"median {j['median']} mean {j['mean']} (>= 0.9: {j['share_ge_0.9']:.0%}); evidence recall "
              f"a {r['evidence_recall']['a']} b {r['evidence_recall']['b']}; windows {r['windows']}")
    rules = tuple(args.rules.split(","))
    if len(rules) == 2:
        report["rule_change"] = rule_change({t: a[t] for t in set(a) & set(b)}, args.keep, rules)
        j = report["rule_change"]["jaccard"]
        print(f"for scale, reference speculator, {rules[0]} vs {rules[1]}: Jaccard min {j['min']} p10 {j['p10']} "
              f"median {j['median']} mean {j['mean']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
