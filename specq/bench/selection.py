"""`specq bench selection`: answer-chunk recall of global vs per-window selection on the speculator.

For each task (a fact with a number, planted at a depth of a long filler document, and a question
about it) and each prompt length, the speculator scores the prompt once with the windowed scorer;
both selection rules then pick from the same scores (the same keep budget), so the comparison costs
one scoring per (task, length). A task counts as recalled when every token of the answer's number
(± 2 tokens) is kept. Only the speculator runs (the target's answer is not part of this measure;
the target shares the speculator's tokenizer, so the kept indices are the target's).
"""

from __future__ import annotations

import json
import os
import sys
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import EXAMPLES


@dataclass(frozen=True)
class Task:
    fact: str
    question: str
    answer: str
    depth: float


TASKS = (
    Task("The access code for the archive room is 4712.", "What is the access code for the archive room?", "4712", 0.15),
    Task("The shipment for order 88 left the warehouse from pier 39.", "From which pier did the shipment for order 88 leave?", "39", 0.35),
    Task("The project's nightly build server listens on port 6123.", "On which port does the project's nightly build server listen?", "6123", 0.55),
    Task("Dr. Okafor's office is room 517 in the east wing.", "Which room is Dr. Okafor's office in?", "517", 0.75),
    Task("The bakery's bread recipe needs exactly 275 grams of flour.", "How many grams of flour does the bakery's bread recipe need?", "275", 0.92),
)


def plant(filler: str, task: Task) -> str:
    """The filler with the task's fact as a paragraph of its own, at about `depth` of its length."""
    at = filler.rfind("\n\n", 0, int(len(filler) * task.depth))
    at = at if at > 0 else 0
    return filler[:at] + "\n\n" + task.fact + filler[at:]


def describe() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=5,
                             cwd=EXAMPLES.parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_selection_bench(speculator: str, lengths: list[int], *, keep: float = 0.3, window: int = 0, lookahead: int = 8,
                        pool: int = 13, chunk: int = 32, n_threads: int = 0, tasks: tuple[Task, ...] = TASKS,
                        say: Callable[[str], None] = print, on_row: Callable[[dict], None] | None = None) -> dict[str, Any]:
    from ..engine.llama.binding import Model  # llama.cpp before numpy
    from ..engine.models import resolve_model
    from ..engine.prompt.build import build_prompt
    from ..engine.scoring.scorer import DEFAULT_WINDOW, SpecPrefillScorer
    from ..engine.scoring.selection import DEFAULT_CHUNK_RULE, reads_text, select_kept, select_kept_per_window
    from .ttft import hardware, make_document

    load0 = os.getloadavg()
    t_start = time.time()
    path = resolve_model(speculator)
    model = Model(path, n_gpu_layers=0)
    threads = n_threads or (os.cpu_count() or 1)
    n_ctx = (window or DEFAULT_WINDOW) + 1024
    scorer = SpecPrefillScorer(model, n_ctx=n_ctx, n_batch=4096, n_ubatch=512, n_threads=threads, flash_attn=True)
    rows: list[dict[str, Any]] = []
    fillers = {n: make_document(model, n) for n in lengths}
    # task by task, every length for each: a run cut short still has rows at every length
    for task in tasks:
        for n in lengths:
            doc = plant(fillers[n], task)
            prompt = build_prompt(model, doc, task.question)
            t0 = time.perf_counter()
            scored = scorer.score(prompt, scorer="windowed", lookahead=lookahead, pool=pool, window=window)
            score_s = time.perf_counter() - t0
            fact_at = doc.index(task.fact) + task.fact.index(task.answer)
            pos = prompt.doc_start + len(model.tokenize(doc[:fact_at]))
            span = range(pos - 2, pos + len(model.tokenize(task.answer)) + 2)
            common = dict(doc_start=prompt.doc_start, n_prompt=prompt.n, protected=prompt.protected_indices(), keep=keep,
                          chunk=chunk, rule=DEFAULT_CHUNK_RULE,
                          pieces=model.pieces(prompt.document) if reads_text(DEFAULT_CHUNK_RULE) else None)
            kept = {"global": set(select_kept(scored.scores, **common)),
                    "per-window": set(select_kept_per_window(scored.scores, scored.plan, **common))}
            window_of = next(w for w, (a, b) in enumerate(scored.plan) if a <= pos - prompt.doc_start < b)
            row = {"length": n, "prompt_tokens": prompt.n, "answer": task.answer, "depth": task.depth,
                   "windows": scored.windows, "answer_window": window_of, "score_s": round(score_s, 2)}
            for rule, k in kept.items():
                row[f"{rule}_recalled"] = all(i in k for i in span)
                row[f"{rule}_kept"] = len(k)
            rows.append(row)
            say(f"{n} tokens, answer {task.answer} at depth {task.depth:.2f} (window {window_of + 1}/{scored.windows}): "
                f"global {'kept' if row['global_recalled'] else 'MISSED'}, per-window "
                f"{'kept' if row['per-window_recalled'] else 'MISSED'} ({score_s:.0f} s scoring)")
            if on_row:
                on_row(row)
    scorer.close()
    model.close()
    summary = []
    for n in lengths:
        mine = [r for r in rows if r["length"] == n]
        if not mine:
            continue
        summary.append({"length": n, "n": len(mine),
                        "global_recall": sum(r["global_recalled"] for r in mine),
                        "per_window_recall": sum(r["per-window_recalled"] for r in mine),
                        "global_kept_mean": round(sum(r["global_kept"] for r in mine) / len(mine), 1),
                        "per_window_kept_mean": round(sum(r["per-window_kept"] for r in mine) / len(mine), 1)})
    return {
        "benchmark": "selection",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": describe(),
        "hardware": hardware(),
        "load_average_start": [round(x, 2) for x in load0],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.time() - t_start, 1),
        "speculator": Path(path).name,
        "settings": {"keep": keep, "window": window or DEFAULT_WINDOW, "lookahead": lookahead, "pool": pool, "chunk": chunk,
                     "threads": threads, "scorer": "windowed"},
        "summary": summary,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    """`python -m specq.bench.selection [--lengths 8192,16384] [--json out.json]` (also `specq bench selection`)."""
    import argparse

    from ..engine.models import DEFAULT_SPECULATOR

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speculator", default=DEFAULT_SPECULATOR)
    ap.add_argument("--lengths", default="8192,16384")
    ap.add_argument("--keep", type=float, default=0.3)
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tasks", type=int, default=len(TASKS), help="the first N tasks")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    lengths = [int(x) for x in a.lengths.split(",") if x.strip()]
    partial: list[dict] = []

    def save(row: dict) -> None:
        partial.append(row)
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps({"partial": True, "rows": partial}, indent=2))

    report = run_selection_bench(a.speculator, lengths, keep=a.keep, window=a.window, n_threads=a.threads,
                                 tasks=TASKS[: a.tasks], say=lambda s: print(s, flush=True), on_row=save)
    report["command"] = "python -m specq.bench.selection " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["summary"], indent=2))


if __name__ == "__main__":
    main()
