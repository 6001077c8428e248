"""What the CPU measurement scripts of #17 share (measure_arriving_together.py, measure_group_in_loop.py):
the questions they ask about examples/python-license.txt, their options, the provenance header of
their reports, and one run of the questions submitted together to an engine loop."""

from __future__ import annotations

import argparse
import os
import time

from specq.bench.provenance import provenance
from specq.engine.options import EngineOptions, RunParams
from specq.engine.pipeline import Engine
from specq.engine.serving.loop import ServingEngine

QS = ["Which company did the Python core development team move to in May 2000?",
      "What does the license say about warranties?",
      "Which license is Python distributed under?",
      "Who is the licensee in this agreement?",
      "In which year was the first license version granted?",
      "What must be retained in derivative works?",
      "Which country's law governs the agreement?",
      "What is the name of the foundation?"]


def report_header(script: str, args) -> dict:
    """The command, CPU, threads and load a report starts with, and the benchmarks' `provenance` object
    (`code.describe` = git describe --dirty, a diff hash when dirty, the patched library's probe,
    host), as docs/benchmarks.md asks of a quotable number."""
    return {"provenance": provenance(), "command": f"scripts/{script} " + " ".join(f"{k}={v}" for k, v in vars(args).items()),
            "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""),
            "threads": os.cpu_count() or 1, "load_before": os.getloadavg(), "runs": []}


def arguments():
    """The options both scripts take: OUT.json, --questions, --max-tokens, --document."""
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--document", default="examples/python-license.txt")
    return ap


def questions_together(text: str, n: int, max_tokens: int, mode: str, options: dict, loop_options: dict | None = None):
    """The first `n` questions of QS about `text`, submitted at once to an engine loop with `n` slots (a
    fresh engine: caches empty); (results, wall seconds, the loop's stats + prefix waits + engine info)."""
    eng = Engine(EngineOptions(n_gpu_layers=0, n_ctx=4096, slots=n, **options))
    loop = ServingEngine(eng, **(loop_options or {})).start()
    try:
        t0 = time.perf_counter()
        handles = [loop.submit(text, RunParams(question=q, mode=mode, max_tokens=max_tokens), scope="t") for q in QS[:n]]
        results = [h.result() for h in handles]
        wall = time.perf_counter() - t0
        return results, wall, {"stats": loop.stats(), "prefix_waits": loop.prefix_waits, "engine": vars(eng.info)}
    finally:
        loop.close()
        eng.close()
