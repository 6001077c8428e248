"""`specq bench group`: k questions about one document served three ways, side by side (#17 item 4).

* `separate`: k specprefill runs one after the other (the speculator's window cache on: questions
  2..k restore the document's windows; the target prefills each question's kept chunks);
* `full+cache`: k baseline runs through the target's prompt cache (question 1 prefills the whole
  prompt and saves it; questions 2..k restore the document's KV and prefill their question);
* `group`: Engine.run_group (engine/group_sparse.py): every question scored, one target prefill of
  the union of their kept chunks, each question's tail on it.

Each strategy starts with the engine's caches empty (the document is new to it) and the strategies
alternate per round; medians over rounds. Per strategy: the total wall time for the k answers, and
each question's TTFT measured from the start of the group (sequential service: question j waits for
questions < j; the group path scores every question before any answer), plus the tokens the target
prefilled. On tiny random-weight models these numbers show the cost structure only (which phases
scale with what), not what a real model on a real machine gains.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Sequence

from ..engine.options import RunParams
from .ttft import make_document

QUESTIONS = [
    "Which company did the Python core development team move to in May 2000?",
    "What does textwrap.dedent do with lines that consist solely of whitespace?",
    "Who holds the copyright of the Python software according to the license?",
    "What is the default width used by textwrap.fill?",
    "Which license is Python 2.0.1 compatible with?",
    "How does the TextWrapper handle long words that exceed the width?",
    "What are the terms for redistribution in binary form?",
    "Which function shortens text to fit a given width?",
]
STRATEGIES = ("separate", "full+cache", "group")


def questions_for(k: int) -> list[str]:
    return [QUESTIONS[i % len(QUESTIONS)] + (f" (variant {i // len(QUESTIONS)})" if i >= len(QUESTIONS) else "")
            for i in range(k)]


def _run_strategy(engine, strategy: str, document: str, questions: list[str], params: RunParams) -> dict[str, Any]:
    engine.cache_store.clear()
    t0 = time.perf_counter()
    ttfts, prefilled, warnings = [], 0, []
    if strategy == "group":
        results = engine.run_group(document, questions, params, scope="bench")
        ttfts = [r.timings_ms["ttft"] for r in results]
        g = results[0].group
        # the target prefilled head + union once, then each question's tail
        head = engine.tokenize_prompt(document, dataclasses.replace(params, question=questions[0])).doc_start
        shared = head + g.get("union_kept_tokens", 0)
        prefilled = shared + sum(len(r.kept_indices) - shared for r in results)
        extra = {"union_kept_fraction": g["union_kept_fraction"],
                 "own_kept_fraction_mean": round(statistics.mean(r.group["own_kept_fraction"] for r in results), 4),
                 "group_prefill_ms": round(results[0].timings_ms["group_prefill"], 2),
                 "fallback": g.get("fallback", "")}
    else:
        mode = "specprefill" if strategy == "separate" else "baseline"
        results, elapsed = [], 0.0
        for q in questions:
            r = engine.run(document, dataclasses.replace(params, question=q, mode=mode), scope="bench",
                           reused_document=True)
            ttfts.append(elapsed + r.timings_ms["ttft"])
            elapsed = (time.perf_counter() - t0) * 1000.0
            results.append(r)
            if mode == "specprefill":
                prefilled += r.usage.kept_tokens
            else:
                t = r.spec.cache.get("target")
                prefilled += t["prefilled_tokens"] if isinstance(t, dict) else r.usage.prompt_tokens
        extra = {"kept_fraction_mean": round(statistics.mean(r.kept_ratio for r in results), 4)} if mode == "specprefill" else {}
    total = (time.perf_counter() - t0) * 1000.0
    for r in results:
        warnings += r.warnings
    return {"total_ms": total, "ttft_ms": ttfts, "target_prefilled_tokens": prefilled, "warnings": warnings,
            "prompt_tokens": results[0].usage.prompt_tokens, "tokens": [r.tokens for r in results], **extra}


def run_group_bench(engine, lengths: Sequence[int], groups: Sequence[int], *, keep: float = 0.3, chunk: int = 32,
                    window: int = 0, max_tokens: int = 8, reps: int = 3,
                    say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Rows of (length, k): each strategy's median total, per-question TTFT (from the group's start), and
    the target's prefilled tokens; the report with provenance (bench/provenance.py)."""
    from .provenance import Start, provenance

    start = Start()
    rows, warnings = [], []
    base = RunParams(mode="specprefill", min_tokens=0, keep=keep, chunk=chunk, window=window, max_tokens=max_tokens,
                     ignore_eos=True, seed=0)
    for n in lengths:
        document = make_document(engine.target, n)
        for k in groups:
            questions = questions_for(k)
            runs: dict[str, list[dict]] = {s: [] for s in STRATEGIES}
            for rep in range(reps + 1):  # round 0: warm-up, dropped
                order = STRATEGIES[rep % 3:] + STRATEGIES[: rep % 3]
                for s in order:
                    res = _run_strategy(engine, s, document, questions, base)
                    if rep:
                        runs[s].append(res)
            row: dict[str, Any] = {"length": n, "group_size": k, "prompt_tokens": runs["group"][0]["prompt_tokens"]}
            med = statistics.median
            for s in STRATEGIES:
                rs = runs[s]
                warnings += [w for r in rs for w in r["warnings"]]
                ttft = [med(r["ttft_ms"][j] for r in rs) for j in range(k)]
                row[s] = {"total_ms": round(med(r["total_ms"] for r in rs), 2),
                          "ttft_ms": [round(x, 2) for x in ttft],
                          "ttft_mean_ms": round(statistics.mean(ttft), 2),
                          "target_prefilled_tokens": rs[0]["target_prefilled_tokens"],
                          "total_runs_ms": [round(r["total_ms"], 2) for r in rs],
                          **{key: v for key, v in rs[0].items() if key in (
                              "union_kept_fraction", "own_kept_fraction_mean", "group_prefill_ms", "fallback",
                              "kept_fraction_mean")}}
            # the group's answers equal each one's forced-union single run (tests); against the separate
            # runs they may differ (more context): counted, not asserted
            row["group_answers_equal_separate"] = sum(
                a == b for a, b in zip(runs["group"][0]["tokens"], runs["separate"][0]["tokens"]))
            rows.append(row)
            say(format_row(row))
    return {"benchmark": "group", "settings": {"lengths": list(lengths), "groups": list(groups), "keep": keep,
                                               "chunk": chunk, "window": window, "max_tokens": max_tokens, "reps": reps},
            "rows": rows,
            "note": "tiny random-weight models measure the cost structure only, not real gains",
            "provenance": provenance(engine, positions=["original"], warnings=warnings, start=start)}


def format_row(row: dict[str, Any]) -> str:
    k = row["group_size"]
    parts = [f"len {row['length']:>6} ({row['prompt_tokens']} tok) k={k:<2}"]
    for s in STRATEGIES:
        r = row[s]
        parts.append(f"{s}: total {r['total_ms']:8.1f} ms, ttft mean {r['ttft_mean_ms']:8.1f} ms, "
                     f"target prefilled {r['target_prefilled_tokens']}")
    g = row["group"]
    parts.append(f"union {g.get('union_kept_fraction', 0):.3f} vs own {g.get('own_kept_fraction_mean', 0):.3f}")
    return " | ".join(parts)


def print_report(report: dict[str, Any], echo: Callable[[str], None] = print) -> None:
    echo(f"{'length':>6} {'k':>3} | " + " | ".join(f"{s + ' total':>17} {'ttft mean':>10}" for s in STRATEGIES)
         + " | union/own kept")
    for row in report["rows"]:
        cells = " | ".join(f"{row[s]['total_ms']:14.1f} ms {row[s]['ttft_mean_ms']:7.1f} ms" for s in STRATEGIES)
        g = row["group"]
        echo(f"{row['length']:>6} {row['group_size']:>3} | {cells} | "
             f"{g.get('union_kept_fraction', 0):.3f}/{g.get('own_kept_fraction_mean', 0):.3f}")
    echo(report["note"])
