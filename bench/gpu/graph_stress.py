"""CUDA-graph stress run: production settings on a GPU, N fresh processes, crashes counted (issue 14).

Until 2026-12-02 production ran with CUDA graphs on; this run (graphs on, as then) kept the engine's
defaults on a GPU (n_batch 4096, n_ubatch 2048, 8 parallel scoring windows, torch score
math when it can) and patch 0002 switching the speculator's eval callback on for each lookahead and
off again. Once, re-captured graphs of the speculator's single-token decodes ended in "an illegal
instruction was encountered" (2026-11-29, the forward-only scoring pass at 32K/64K). On 2026-12-02
this script's 8 runs at 32K were clean, but `specq bench ttft` with graphs on crashed the same way in
5 runs of 5, so EngineOptions.cuda_graphs is off by default now (docs/engine.md, "CUDA graphs"); this
script still runs with graphs on, to test whether a future llama.cpp fixes it.

Each run is a fresh process (a CUDA error kills it) that loads the target and the speculator once and
then, per length and repetition: a specprefill job drafting with the speculator (`draft: model`:
scoring toggles the callback, then the speculator drafts with single-token decodes on the same
context), the same speculator passes without capture (`score(capture=False)`, where the crash was
seen), and a baseline job drafting with the model. The driver records each run's exit status (a
negative one is the signal), its wall time and the last lines of its log, and writes a JSON summary.

    python3 bench/gpu/graph_stress.py --target T.gguf --speculator S.gguf --runs 20 \\
        --lengths 32768,65536 --out $OUT/graph-stress.json

Needs our CUDA build on PYTHONPATH (bench/gpu/build.sh); `bash bench/gpu/graph_stress.sh` sets it all up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(args: argparse.Namespace) -> int:
    """One run: load once, then every length × repetition."""
    import llama_cpp  # noqa: F401  (before numpy: see ../shared/gpu/README.md)

    sys.path.insert(0, str(ROOT))
    from specq.bench.ttft import QUESTION, make_document
    from specq.engine.options import EngineOptions, RunParams
    from specq.engine.pipeline import Engine

    lengths = [int(x) for x in args.lengths.split(",")]
    n_ctx = max(lengths) + 2048
    t0 = time.perf_counter()
    # the engine sets GGML_CUDA_DISABLE_GRAPHS from its option (off by default since this run's finding)
    eng = Engine(EngineOptions(target=args.target, speculator=args.speculator, n_ctx=n_ctx,
                               cuda_graphs=not os.environ.get("GGML_CUDA_DISABLE_GRAPHS")))
    print(f"loaded in {time.perf_counter() - t0:.1f} s: {json.dumps(vars(eng.info))}", flush=True)
    _ = eng.scorer()
    for rep in range(args.reps):
        for n in lengths:
            doc = make_document(eng.target, n)
            spec = RunParams(question=QUESTION, mode="specprefill", keep=0.3, min_tokens=0, max_tokens=args.max_tokens,
                             draft="model", n_draft=4)
            base = RunParams(question=QUESTION, mode="baseline", max_tokens=args.max_tokens, draft="model", n_draft=4)
            t = time.perf_counter()
            r = eng.run(doc, spec)
            print(f"rep {rep} length {n}: specprefill+model drafting {time.perf_counter() - t:.2f} s, "
                  f"{r.usage.completion_tokens} tokens, drafted {r.draft.drafted} accepted {r.draft.accepted}", flush=True)
            t = time.perf_counter()
            eng.scorer().score(eng.tokenize_prompt(doc, spec), capture=False)
            print(f"rep {rep} length {n}: forward-only scoring {time.perf_counter() - t:.2f} s", flush=True)
            t = time.perf_counter()
            r = eng.run(doc, base)
            print(f"rep {rep} length {n}: baseline+model drafting {time.perf_counter() - t:.2f} s, "
                  f"{r.usage.completion_tokens} tokens", flush=True)
    eng.close()
    print("run ok", flush=True)
    return 0


def driver(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if not args.allow_graphs_off and env.pop("GGML_CUDA_DISABLE_GRAPHS", None) is not None:
        print("note: GGML_CUDA_DISABLE_GRAPHS was set; removed for the runs (production has graphs on)", flush=True)
    args.graphs = "off" if env.get("GGML_CUDA_DISABLE_GRAPHS") else "on"
    started = time.monotonic()
    runs = []
    for i in range(args.runs):
        if runs and time.monotonic() - started + max(r["wall_s"] for r in runs) > args.budget_s:
            print(f"stopping after {i} runs: the next one would pass the {args.budget_s:g} s budget", flush=True)
            break
        t = time.monotonic()
        cmd = [sys.executable, __file__, "--child", "--target", args.target, "--speculator", args.speculator,
               "--lengths", args.lengths, "--reps", str(args.reps), "--max-tokens", str(args.max_tokens)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        log = (p.stdout + p.stderr).splitlines()
        crashed = p.returncode != 0
        runs.append({"run": i, "returncode": p.returncode, "crashed": crashed, "wall_s": round(time.monotonic() - t, 2),
                     "tail": log[-25:] if crashed else log[-3:]})
        print(f"run {i}: rc {p.returncode}{' CRASH' if crashed else ''} in {runs[-1]['wall_s']} s", flush=True)
        if crashed:
            print("\n".join("    " + line for line in log[-25:]), flush=True)
        if args.out:
            _write(args, runs)
    _write(args, runs)
    crashes = sum(r["crashed"] for r in runs)
    print(f"{len(runs)} runs, {crashes} crashed (CUDA graphs {args.graphs})")
    return 1 if crashes else 0


def _write(args: argparse.Namespace, runs: list[dict]) -> None:
    if not args.out:
        return
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    report = {
        "benchmark": "graph-stress", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": commit,
        "settings": {"target": args.target, "speculator": args.speculator, "lengths": args.lengths, "reps": args.reps,
                     "max_tokens": args.max_tokens, "draft": "model", "n_draft": 4, "cuda_graphs": args.graphs},
        "runs": runs, "crashes": sum(r["crashed"] for r in runs),
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--speculator", required=True)
    ap.add_argument("--lengths", default="32768,65536")
    ap.add_argument("--runs", type=int, default=20, help="fresh processes")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of every length within one process")
    ap.add_argument("--max-tokens", type=int, default=48, help="decoded per job (drafting with the speculator)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no run that would end past this")
    ap.add_argument("--allow-graphs-off", action="store_true", help="keep GGML_CUDA_DISABLE_GRAPHS if set (a control run)")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return child(args) if args.child else driver(args)


if __name__ == "__main__":
    sys.exit(main())
