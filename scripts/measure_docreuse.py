"""#17 measurements on the CPU real pair (Qwen2.5-Coder 1.5B target, 0.5B speculator):

A. one ~3.4K-token document x 4 questions in specprefill mode through the engine's caches: TTFT and
   phases per question (question 1 fills the speculator cache, 2-4 restore it);
B. the same 4 questions in baseline mode through the target's prompt cache;
C. state save/restore vs llama_memory_seq_cp of the speculator's KV (1K tokens);
D. break-even: baseline vs specprefill TTFT at a few lengths, caches off.

    nice -n 10 .venv/bin/python scripts/measure_docreuse.py OUT.json [--lengths 512,1024,2048] [--skip-d]
"""

from __future__ import annotations

import json
import os
import sys
import time

from specq.bench.provenance import Start, provenance
from specq.bench.ttft import make_document
from specq.engine.llama.binding import Context
from specq.engine.options import EngineOptions, RunParams
from specq.engine.pipeline import Engine
from specq.engine.cache.speculator import restore_seq, save_seq

QS = ["Which company did the Python core development team move to in May 2000?",
      "What does textwrap.dedent do?",
      "Which license is Python distributed under?",
      "Name two functions defined in textwrap."]


def load() -> list[float]:
    return list(os.getloadavg())


def main() -> None:
    out_path = sys.argv[1]
    lengths = [512, 1024, 2048]
    if "--lengths" in sys.argv:
        lengths = [int(x) for x in sys.argv[sys.argv.index("--lengths") + 1].split(",")]
    # the benchmarks' provenance object (code + diff hash, the patched library's probe, numerics, host,
    # load before and after), as docs/benchmarks.md asks of a quotable number: the code noted now, the
    # rest once both models are loaded (after the warm-ups), so the speculator's numerics are its own
    start = Start()
    report: dict = {"command": "scripts/measure_docreuse.py " + " ".join(sys.argv[1:])}

    def save():
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)

    eng = Engine(EngineOptions(n_gpu_layers=0, cache_bytes=2 << 30))
    doc = make_document(eng.target, 3400)
    report["engine"] = vars(eng.info)
    warm = make_document(eng.target, 300)
    for mode in ("baseline", "specprefill"):  # loads the speculator, builds the scorer's context
        eng.run(warm, RunParams(question=QS[0], mode=mode, min_tokens=0, max_tokens=1), scope="warm-up")
    report["provenance"] = provenance(eng, start=start)
    rows = []
    for i, q in enumerate(QS):
        t0 = time.perf_counter()
        r = eng.run(doc, RunParams(question=q, mode="specprefill", max_tokens=1), scope="bench")
        rows.append({"q": i + 1, "wall_ms": (time.perf_counter() - t0) * 1000, "prompt_tokens": r.usage.prompt_tokens,
                     "kept_tokens": r.usage.kept_tokens, "timings_ms": r.timings_ms, "cache": r.spec.cache,
                     "windows": r.spec.windows, "load": load()})
        print("A", rows[-1], flush=True)
        report["A_specprefill_cached"] = rows
        save()
    rows = []
    for i, q in enumerate(QS):
        r = eng.run(doc, RunParams(question=q, mode="baseline", max_tokens=1), scope="bench")
        rows.append({"q": i + 1, "prompt_tokens": r.usage.prompt_tokens, "timings_ms": r.timings_ms,
                     "cache": r.spec.cache, "load": load()})
        print("B", rows[-1], flush=True)
        report["B_baseline_prompt_cache"] = rows
        save()
    # C: the speculator's KV of 1K tokens: save/restore vs sequence copy
    spec = eng.speculator
    toks = spec.tokenize(doc)[:1024]
    ctx = Context(spec, n_ctx=4096, n_batch=4096, n_ubatch=eng.n_ubatch, n_threads=eng.options.resolved_threads(),
                  n_seq_max=2)
    ctx.decode(toks, range(len(toks)), logits="none")
    c = {}
    t0 = time.perf_counter(); data = save_seq(ctx, 0); c["save_ms"] = (time.perf_counter() - t0) * 1000
    c["bytes"] = len(data)
    ctx.clear()
    t0 = time.perf_counter(); restore_seq(ctx, data, 0); c["restore_ms"] = (time.perf_counter() - t0) * 1000
    import llama_cpp
    t0 = time.perf_counter(); llama_cpp.llama_memory_seq_cp(ctx.mem, 0, 1, -1, -1); c["seq_cp_ms"] = (time.perf_counter() - t0) * 1000
    c["tokens"] = len(toks)
    ctx.close()
    report["C_save_restore_vs_seq_cp"] = c
    print("C", c, flush=True)
    save()
    eng.close()
    if "--skip-d" in sys.argv:
        return
    eng = Engine(EngineOptions(n_gpu_layers=0, cache_bytes=0))
    warm = make_document(eng.target, 300)
    for mode in ("baseline", "specprefill"):  # loads the speculator and builds the scorer's context
        eng.run(warm, RunParams(question=QS[0], mode=mode, min_tokens=0, max_tokens=1))
    rows = []
    for n in lengths:
        d = make_document(eng.target, n)
        row = {"length": n, "load": load()}
        for mode in ("baseline", "specprefill"):
            r = eng.run(d, RunParams(question=QS[0], mode=mode, min_tokens=0, max_tokens=1))
            row[mode + "_ttft_ms"] = r.timings_ms["ttft"]
            row["prompt_tokens"] = r.usage.prompt_tokens
        row["ratio"] = row["baseline_ttft_ms"] / row["specprefill_ttft_ms"]
        rows.append(row)
        print("D", row, flush=True)
        report["D_break_even"] = rows
        save()
    report["load_end"] = load()
    save()
    eng.close()


if __name__ == "__main__":
    main()
