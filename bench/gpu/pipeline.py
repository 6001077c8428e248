"""Serial vs pipelined SpecPrefill TTFT on one device, with each stage's scoring time S_i and prefill
time P_i and the TTFT bound they imply when scoring and prefill overlap (two devices). Usage:
    python3 bench/gpu/pipeline.py TARGET.gguf SPECULATOR.gguf LENGTHS JSON_OUT [REPS]

Per length, after one dropped warm-up of each mode, REPS alternating rounds of:
  baseline               full prefill (once per length: the reference)
  serial-global-npX      today's path: score all windows (n_parallel X), global selection, one prefill
  serial-pw-npX          the same with per-window selection (the kept set the pipeline prefills)
  pipelined-npX          per-window, the target's stages on a second thread while windows are scored
  staged-npX             the pipeline's stages in series (no overlap): each S_i and P_i uncontended
for X in NP (env, default "1,8": one window per stage, or a group of 8 windows scored together per
stage). From staged: S_i = time window i took to score (after stage i-1's prefill), P_i = stage i's
prefill; bound = pipelines.pipeline_bound(S, P) + tokenize (+ the first token's decode, measured);
equal-stage form S/k + (k-1)·max(S, P)/k + P/k printed beside it. On one GPU the two threads share
the device, so pipelined ≈ serial is expected; the bound is what a second GPU could reach.
"""

from __future__ import annotations

import llama_cpp  # noqa: F401  (before numpy: see ../shared/gpu/README.md)

import json
import os
import statistics
import subprocess
import sys
import time

from specq.bench.ttft import QUESTION, hardware, make_document
from specq.engine.options import EngineOptions, RunParams
from specq.engine.pipeline import Engine
from specq.engine.scoring.pipelined import pipeline_bound
from specq.engine.result import SpecInfo


def set_parallel(engine: Engine, n_parallel: int) -> None:
    """Rebuild the scorer with another n_parallel (the models stay loaded)."""
    if engine.options.n_parallel != n_parallel or engine._scorer is None:
        if engine._scorer is not None:
            engine._scorer.close()
            engine._scorer = None
        engine.options.n_parallel = n_parallel
        engine.scorer()


def staged(engine: Engine, doc: str, params: RunParams) -> dict:
    """The pipeline's stages in series: per-stage S_i and P_i (seconds)."""
    prompt = engine.tokenize_prompt(doc, params)
    timings: dict = {}
    t0 = time.perf_counter()
    engine._pipelined(prompt, params, "original", timings, SpecInfo(), lambda *a: None, threaded=False)
    wall = time.perf_counter() - t0
    tr = engine.last_trace
    S, P, names = [], [], []
    prev_end = 0.0
    for st in tr.stages:
        S.append(max(0.0, st.ready_s - prev_end))  # scoring done since the last stage's prefill ended
        P.append(st.prefill_end_s - st.prefill_start_s)
        prev_end = st.prefill_end_s
        names.append(st.name)
    return {"S": S, "P": P, "names": names, "tokens": [st.n_tokens for st in tr.stages], "wall_s": wall,
            "score_s": sum(S), "prefill_s": sum(P), "bound_s": pipeline_bound(S, P)}


def main() -> None:
    target, spec, lengths_arg, out = sys.argv[1:5]
    reps = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    lengths = [int(x) for x in lengths_arg.split(",")]
    nps = [int(x) for x in os.environ.get("NP", "1,8").split(",")]
    budget = float(os.environ.get("BUDGET_S", "480"))  # stop starting new work after this many seconds
    t_start = time.time()
    ctx = max(lengths) + 2048
    engine = Engine(EngineOptions(target=target, speculator=spec, n_ctx=ctx, n_parallel=nps[0],
                                  speculator_gpu=int(os.environ.get("SPECULATOR_GPU", "-1"))))
    _ = engine.speculator
    report = {"benchmark": "pipeline", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "commit": subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip(),
              "hardware": hardware(), "engine": vars(engine.info), "n_ctx": ctx, "reps": reps, "n_parallel": nps,
              "settings": {"keep": 0.3, "window": "auto (4096)", "lookahead": 8}, "rows": []}

    def save() -> None:
        report["wall_s"] = round(time.time() - t_start, 1)
        with open(out, "w") as f:
            json.dump(report, f, indent=2)

    for n in lengths:
        if time.time() - t_start > budget:
            print(f"length {n}: skipped (budget)", flush=True)
            continue
        doc = make_document(engine.target, n)
        common = dict(question=QUESTION, mode="specprefill", keep=0.3, min_tokens=0, max_tokens=1)
        modes = {}
        for X in nps:
            modes[f"serial-global-np{X}"] = (X, RunParams(**common))
            modes[f"serial-pw-np{X}"] = (X, RunParams(selection="per-window", **common))
            modes[f"pipelined-np{X}"] = (X, RunParams(selection="per-window", pipelined=True, **common))
        row: dict = {"length": n, "ttft_ms": {m: [] for m in modes}, "stages": {}}
        base = engine.run(doc, RunParams(question=QUESTION, max_tokens=1))
        row["prompt_tokens"] = base.usage.prompt_tokens
        row["baseline_ttft_ms"] = round(base.timings_ms["ttft"], 1)
        kept: dict = {}
        for r in range(reps + 1):  # round 0: warm-up (dropped)
            order = list(modes.items()) if r % 2 == 0 else list(modes.items())[::-1]
            for m, (X, params) in order:
                set_parallel(engine, X)
                res = engine.run(doc, params)
                kept[m] = res.kept_indices
                row["windows"] = res.spec.windows
                if r:
                    row["ttft_ms"][m].append(round(res.timings_ms["ttft"], 1))
                    if m.startswith("pipelined"):
                        row.setdefault("pipelined_phases_ms", {})[m] = {k: round(v, 1) for k, v in res.timings_ms.items()}
            if time.time() - t_start > budget:
                print(f"length {n}: stopped after round {r} (budget)", flush=True)
                break
        for X in nps:
            set_parallel(engine, X)
            st = [staged(engine, doc, modes[f"pipelined-np{X}"][1]) for _ in range(2)][-1]
            k = sum(1 for x in st["names"] if x == "window")
            S, P = st["score_s"], st["prefill_s"]
            # the rest of TTFT outside scoring and prefill (tokenize, first decode step), from the serial run
            serial = statistics.median(row["ttft_ms"][f"serial-pw-np{X}"] or [0.0]) / 1000.0
            other = max(0.0, serial - st["wall_s"])
            st["stages"] = k
            st["equal_stage_bound_s"] = S / k + (k - 1) * max(S, P) / k + P / k if k else S + P
            st["ttft_bound_s"] = st["bound_s"] + other
            row["stages"][f"np{X}"] = st
            assert kept[f"pipelined-np{X}"] == kept[f"serial-pw-np{X}"], "pipelined kept a different set"
        row["median_ttft_ms"] = {m: statistics.median(v) for m, v in row["ttft_ms"].items() if v}
        report["rows"].append(row)
        save()
        med = row["median_ttft_ms"]
        print(f"\n{n} tokens ({row['prompt_tokens']}), {row.get('windows')} windows; baseline {row['baseline_ttft_ms']:.0f} ms", flush=True)
        for m, v in med.items():
            print(f"  {m:20s} {v:8.0f} ms  ({row['baseline_ttft_ms'] / v:.2f}x baseline)", flush=True)
        for key, st in row["stages"].items():
            print(f"  stages {key}: k={st['stages']} S={st['score_s']:.3f}s P={st['prefill_s']:.3f}s "
                  f"bound {st['bound_s']:.3f}s (equal stages {st['equal_stage_bound_s']:.3f}s), TTFT bound "
                  f"{st['ttft_bound_s'] * 1000:.0f} ms = {row['baseline_ttft_ms'] / (st['ttft_bound_s'] * 1000):.2f}x baseline",
                  flush=True)
            print("    S_i " + " ".join(f"{x * 1000:.0f}" for x in st["S"]) + " ms", flush=True)
            print("    P_i " + " ".join(f"{x * 1000:.0f}" for x in st["P"]) + " ms", flush=True)
    save()
    engine.close()


if __name__ == "__main__":
    main()
