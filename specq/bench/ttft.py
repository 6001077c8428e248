"""`specq bench ttft`: time-to-first-token of baseline vs specprefill, side by side in one run.

For each prompt length the same document is run in both modes with the same engine (same context
parameters, recorded in the output): one warm-up of each mode is dropped, then `reps` rounds in
alternating order. Reported: median TTFT per mode, their ratio, the median phase split of the
specprefill runs and the kept ratio. The scoring overhead is measured too: the same speculator
forward passes (window prefills + lookahead decodes) without capture or score math, so that
overhead = (score − forward passes) / forward passes.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..engine.options import RunParams

from . import EXAMPLES
QUESTION = "Which company did the Python core development team move to in May 2000?"
PHASES = ("speculator_prefill", "lookahead", "score_math", "select", "sparse_prefill")


def make_document(model, n_tokens: int) -> str:
    """A document of about `n_tokens` tokens (the examples, repeated), ending on a paragraph."""
    parts = [(EXAMPLES / "python-license.txt").read_text(), (EXAMPLES / "textwrap.py").read_text()]
    unit = "\n\n".join(parts)
    per_unit = max(1, len(model.tokenize(unit)))
    text = "\n\n".join([unit] * (n_tokens // per_unit + 1))
    # cut by characters in proportion, then trim to the token budget
    approx = int(len(text) * n_tokens / len(model.tokenize(text)))
    text = text[:approx]
    while len(model.tokenize(text)) > n_tokens:
        text = text[: int(len(text) * 0.995)]
    return text


@dataclass
class LengthResult:
    length: int
    prompt_tokens: int
    baseline_ttft_ms: list[float] = field(default_factory=list)
    spec_ttft_ms: list[float] = field(default_factory=list)
    spec_phases_ms: dict[str, list[float]] = field(default_factory=dict)
    kept_ratio: float = 0.0
    windows: int = 0
    forward_only_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        med = statistics.median
        b, s = med(self.baseline_ttft_ms), med(self.spec_ttft_ms)
        phases = {k: round(med(v), 2) for k, v in self.spec_phases_ms.items() if v}
        score = med(self.spec_phases_ms.get("score", [0.0]) or [0.0])
        fwd = med(self.forward_only_ms) if self.forward_only_ms else 0.0
        return {
            "length": self.length,
            "prompt_tokens": self.prompt_tokens,
            "baseline_ttft_ms": round(b, 2),
            "specprefill_ttft_ms": round(s, 2),
            "ratio": round(b / s, 3) if s else 0.0,
            "kept_ratio": round(self.kept_ratio, 4),
            "windows": self.windows,
            "specprefill_phases_ms": phases,
            "scoring_forward_only_ms": round(fwd, 2),
            "scoring_overhead": round((score - fwd) / fwd, 4) if fwd else None,
            "baseline_runs_ms": [round(x, 2) for x in self.baseline_ttft_ms],
            "specprefill_runs_ms": [round(x, 2) for x in self.spec_ttft_ms],
        }


def hardware() -> dict[str, str]:
    info = {"machine": platform.machine(), "cpu": platform.processor() or "", "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        if gpu.returncode == 0 and gpu.stdout.strip():
            info["gpu"] = gpu.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    import os

    info["cores"] = str(os.cpu_count())
    return info


def run_ttft_bench(
    engine,
    lengths: list[int],
    *,
    keep: float = 0.3,
    scorer: str = "windowed",
    lookahead: int = 8,
    window: int = 0,
    reps: int = 3,
    say: Callable[[str], None] = print,
    on_report: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the side-by-side benchmark; returns the JSON-able report (`on_report` gets it after
    every length, so a long run that dies still leaves what it measured)."""
    results: list[LengthResult] = []
    for n in lengths:
        doc = make_document(engine.target, n)
        base = RunParams(question=QUESTION, mode="baseline", max_tokens=1)
        spec = RunParams(question=QUESTION, mode="specprefill", keep=keep, scorer=scorer, lookahead=lookahead,
                         window=window, min_tokens=0, max_tokens=1)
        lr = LengthResult(length=n, prompt_tokens=0)
        say(f"length {n}: warm-up")
        engine.run(doc, base)
        engine.run(doc, spec)
        for r in range(reps):
            order = [("baseline", base), ("specprefill", spec)]
            if r % 2:
                order.reverse()
            for mode, params in order:
                res = engine.run(doc, params)
                lr.prompt_tokens = res.usage.prompt_tokens
                if mode == "baseline":
                    lr.baseline_ttft_ms.append(res.timings_ms["ttft"])
                else:
                    lr.spec_ttft_ms.append(res.timings_ms["ttft"])
                    for k in ("score",) + PHASES:
                        lr.spec_phases_ms.setdefault(k, []).append(res.timings_ms.get(k, 0.0))
                    lr.kept_ratio = res.kept_ratio
                    lr.windows = res.spec.windows
            # the same speculator forward passes without capture or score math
            prompt = engine.tokenize_prompt(doc, spec)
            t0 = time.perf_counter()
            engine.scorer().score(prompt, scorer=scorer, lookahead=lookahead, window=window, capture=False)
            lr.forward_only_ms.append((time.perf_counter() - t0) * 1000.0)
            ph = {k: v[-1] for k, v in lr.spec_phases_ms.items()}
            say(f"length {n}: round {r + 1}/{reps} baseline {lr.baseline_ttft_ms[-1]:.0f} ms, specprefill "
                f"{lr.spec_ttft_ms[-1]:.0f} ms (" + ", ".join(f"{k} {v:.0f}" for k, v in ph.items()) + ")")
        results.append(lr)
        if on_report:
            on_report(_report(engine, results, keep, scorer, lookahead, window, reps))
    return _report(engine, results, keep, scorer, lookahead, window, reps)


def _report(engine, results: list[LengthResult], keep: float, scorer: str, lookahead: int, window: int, reps: int) -> dict[str, Any]:
    import llama_cpp

    return {
        "benchmark": "ttft",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": _git_commit(),
        "hardware": hardware(),
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
        "engine": vars(engine.info),
        "n_ctx": engine.n_ctx,
        "settings": {"keep": keep, "scorer": scorer, "lookahead": lookahead, "window": window, "reps": reps},
        "rows": [r.summary() for r in results],
    }


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, cwd=EXAMPLES.parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"TTFT, baseline vs specprefill ({report['engine'].get('backend')}, keep {report['settings']['keep']})")
    for col in ("prompt tokens", "baseline ms", "specprefill ms", "ratio", "kept", "windows", "spec prefill", "lookahead", "score math", "select", "sparse prefill", "overhead"):
        t.add_column(col, justify="right")
    for r in report["rows"]:
        p = r["specprefill_phases_ms"]
        ov = r.get("scoring_overhead")
        t.add_row(
            f"{r['prompt_tokens']:,}", f"{r['baseline_ttft_ms']:,.0f}", f"{r['specprefill_ttft_ms']:,.0f}", f"{r['ratio']:.2f}×",
            f"{r['kept_ratio']:.0%}", str(r["windows"]),
            *(f"{p.get(k, 0):,.0f}" for k in PHASES),
            "-" if ov is None else f"{ov:+.0%}",
        )
    Console(width=200).print(t)


def write_outputs(report: dict[str, Any], json_path: Path | None, png_path: Path | None) -> None:
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
    if png_path:
        plot(report, png_path)


def plot(report: dict[str, Any], path: Path) -> None:
    """TTFT vs length for both modes, and stacked phase bars of specprefill beside baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    xs = [r["prompt_tokens"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    a.plot(xs, [r["baseline_ttft_ms"] / 1000 for r in rows], "o-", label="baseline (full prefill)")
    a.plot(xs, [r["specprefill_ttft_ms"] / 1000 for r in rows], "s-", label=f"specprefill (keep {report['settings']['keep']})")
    for x, r in zip(xs, rows):
        a.annotate(f"{r['ratio']:.2f}×", (x, r["specprefill_ttft_ms"] / 1000), textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8)
    a.set_xlabel("prompt tokens")
    a.set_ylabel("TTFT (s)")
    a.set_title("time to first token")
    a.legend()
    a.grid(alpha=0.3)
    idx = range(len(rows))
    bottom = [0.0] * len(rows)
    for k in PHASES:
        vals = [r["specprefill_phases_ms"].get(k, 0) / 1000 for r in rows]
        b.bar([i + 0.2 for i in idx], vals, 0.4, bottom=bottom, label=k)
        bottom = [x + y for x, y in zip(bottom, vals)]
    b.bar([i - 0.2 for i in idx], [r["baseline_ttft_ms"] / 1000 for r in rows], 0.4, color="grey", label="baseline")
    b.set_xticks(list(idx), [f"{x:,}" for x in xs])
    b.set_xlabel("prompt tokens")
    b.set_ylabel("seconds")
    b.set_title("phase split (right bar: specprefill)")
    b.legend(fontsize=8)
    hw = report["hardware"]
    fig.suptitle(f"{report['engine'].get('target')} ← {report['engine'].get('speculator')} · {hw.get('gpu') or hw.get('cpu')} · {report['date']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
