"""`specq bench ttft`: time-to-first-token of baseline vs specprefill, side by side in one run.

For each prompt length the same document is run as baseline and as specprefill with the same engine,
so in the same numerics (the target's settings of every run are recorded in `runs`, and
`same_numerics` says whether they all agree): one warm-up of each is dropped, then `reps` rounds in
alternating order. Reported: median TTFT of each, their ratio, the median phase split of the
specprefill runs and the kept ratio. The scoring overhead is measured too: the same speculator
forward passes (window prefills + lookahead decodes) without capture or score math, so that
overhead = (score − forward passes) / forward passes.

`run_ttft_modes` (what `specq bench ttft` runs by default) repeats all of it with batch-invariant mode
on and then off (one engine each: numerics are fixed when the model loads) and quotes each mode's
specprefill against the fastest baseline of both (`ratio_vs_fastest_baseline`; the headline `ratio` is
the service's default mode's), so specprefill is never credited with a handicapped baseline. Every
report carries `provenance` (specq/bench/provenance.py).

The speculator's pass is also reported as throughput (issue 50, item 2): per length, the tokens its
`speculator_prefill` phase prefilled (each window's template head + document slice + question tail
less its last token, which the first lookahead step decodes; restored cells and the lookahead decodes
are not counted: they are not in that phase), those tokens per second of the phase's median, the FLOP/s
that makes for the speculator's shape (specq/bench/flops.py) and `fraction_of_peak`, that over the card's
F16 matmul peak measured in the same run. On a CPU (or without CUDA torch) no peak is measured and the
fraction is null; tokens/s is still reported.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..engine.options import RunParams

from . import EXAMPLES
from .flops import measured_peak, prefill_flops, read_shape
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
    #: positions [start, end) the speculator prefilled in one specprefill run (Scorer.prefill_spans)
    speculator_spans: list[tuple[int, int]] = field(default_factory=list)

    def summary(self, shape=None, peak: dict[str, Any] | None = None) -> dict[str, Any]:
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
            **self.speculator_throughput(shape, peak),
        }

    def speculator_throughput(self, shape, peak: dict[str, Any] | None) -> dict[str, Any]:
        """The speculator_prefill phase's tokens, tokens/s, TFLOP/s and fraction of the card's peak."""
        tokens = sum(e - s for s, e in self.speculator_spans)
        ms = statistics.median(self.spec_phases_ms.get("speculator_prefill") or [0.0])
        out: dict[str, Any] = {"speculator_tokens": tokens, "speculator_tokens_per_s": None, "speculator_tflops": None,
                               "fraction_of_peak": None}
        if not tokens or ms <= 0:
            return out
        out["speculator_tokens_per_s"] = round(tokens / (ms / 1000.0), 1)
        if shape is not None:
            tflops = prefill_flops(shape, self.speculator_spans) / (ms / 1000.0) / 1e12
            out["speculator_tflops"] = round(tflops, 4)
            if peak:
                out["fraction_of_peak"] = round(tflops / peak["tflops"], 4)
        return out


def hardware() -> dict[str, Any]:
    """The machine (kept for older readers of the report; `provenance.host` has more)."""
    from .provenance import host

    return host()


def _engine_numerics(res) -> dict[str, Any]:
    """The target numerics one run reports (RunResult.engine): what 'same numerics' compares."""
    e = res.engine
    return {k: getattr(e, k) for k in ("batch_invariant", "repack", "type_k", "flash_attn", "n_batch", "n_ubatch",
                                        "backend", "n_gpu_layers")}


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
    """Run the side-by-side benchmark on one engine (one numerics mode); returns the JSON-able report
    (`on_report` gets it after every length, so a long run that dies still leaves what it measured)."""
    start = _start()
    results: list[LengthResult] = []
    runs: list[dict[str, Any]] = []
    # the speculator's shape, and the card's F16 peak now, in this run (none on a CPU engine)
    shape = read_shape(engine.speculator.path)
    peak = measured_peak() if engine.info.backend != "cpu" and engine.speculator.n_gpu_layers != 0 else None
    if peak:
        say(f"card F16 peak: {peak['tflops']:.0f} TFLOP/s ({peak['method']})")
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
                runs.append({"length": n, "mode": mode, "positions": res.spec.positions, "warnings": list(res.warnings),
                             "numerics": _engine_numerics(res)})
                lr.prompt_tokens = res.usage.prompt_tokens
                if mode == "baseline":
                    lr.baseline_ttft_ms.append(res.timings_ms["ttft"])
                else:
                    lr.spec_ttft_ms.append(res.timings_ms["ttft"])
                    for k in ("score",) + PHASES:
                        lr.spec_phases_ms.setdefault(k, []).append(res.timings_ms.get(k, 0.0))
                    lr.kept_ratio = res.kept_ratio
                    lr.windows = res.spec.windows
                    lr.speculator_spans = list(engine.scorer().prefill_spans)
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
            on_report(_report(engine, results, runs, keep, scorer, lookahead, window, reps, start, shape, peak))
    return _report(engine, results, runs, keep, scorer, lookahead, window, reps, start, shape, peak)


def _start():
    from .provenance import Start

    return Start()


def same_numerics(runs: list[dict[str, Any]]) -> bool:
    """Whether every baseline and specprefill run of one mode ran the target with the same numerics."""
    return len({tuple(sorted(r["numerics"].items())) for r in runs}) <= 1


def _report(engine, results: list[LengthResult], runs: list[dict[str, Any]], keep: float, scorer: str, lookahead: int,
            window: int, reps: int, start=None, shape=None, peak: dict[str, Any] | None = None) -> dict[str, Any]:
    from .provenance import provenance

    prov = provenance(engine, positions=[r["positions"] for r in runs if r["mode"] == "specprefill"],
                      warnings=[w for r in runs for w in r["warnings"]], start=start)
    return {
        "benchmark": "ttft",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": prov["code"]["describe"],
        "provenance": prov,
        "hardware": prov["host"],
        "llama_cpp_python": prov["library"]["llama_cpp_python"],
        "engine": vars(engine.info),
        "n_ctx": engine.n_ctx,
        "batch_invariant": engine.numerics.batch_invariant,
        "same_numerics": same_numerics(runs),
        "settings": {"keep": keep, "scorer": scorer, "lookahead": lookahead, "window": window, "reps": reps},
        "speculator_throughput": _throughput_note(shape, peak),
        "rows": [r.summary(shape, peak) for r in results],
        "runs": runs,
    }


def run_ttft_modes(
    options,
    lengths: list[int],
    *,
    modes: Sequence[str] = ("on", "off"),
    default_mode: str = "",
    say: Callable[[str], None] = print,
    on_report: Callable[[dict[str, Any]], None] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """`run_ttft_bench` once per batch-invariant mode (`options.batch_invariant` set to each of
    `modes`), one engine at a time; in each, baseline and specprefill share the engine and so its
    numerics. The combined report quotes, per length, every mode's specprefill against the FASTEST
    baseline of all modes (`ratio_vs_fastest_baseline`), and headlines `default_mode` (the mode the
    service runs; default: the first)."""
    from dataclasses import replace

    from ..engine.pipeline import Engine

    from .provenance import numerics

    start = _start()
    per_mode: dict[str, dict[str, Any]] = {}
    numerics_by_mode: dict[str, Any] = {}
    for mode in modes:
        say(f"batch-invariant {mode}: loading")
        engine = Engine(replace(options, batch_invariant=mode))
        try:
            rep = run_ttft_bench(engine, lengths, say=lambda m, mode=mode: say(f"[batch-invariant {mode}] {m}"), **kw)
            numerics_by_mode[mode] = numerics(engine)
        finally:
            engine.close()
        per_mode[mode] = rep
        if on_report:
            on_report(_combine(per_mode, numerics_by_mode, default_mode or modes[0], start))
    return _combine(per_mode, numerics_by_mode, default_mode or modes[0], start)


def _throughput_note(shape, peak: dict[str, Any] | None) -> dict[str, Any]:
    """What the rows' speculator_* fields and fraction_of_peak count, and the peak they are against."""
    from dataclasses import asdict

    return {
        "tokens": "positions the speculator_prefill phase prefilled: each window's head + document slice + question "
                  "tail less its last token (restored cells and the lookahead decodes are not in that phase)",
        "flops": "specq/bench/flops.py: 2 x block matmul weights x tokens + 4 x layers x heads x head_dim x keys "
                 "attended (causal, per window); no LM head",
        "shape": asdict(shape) if shape is not None else None,
        "peak": peak,
        "fraction_of_peak": "speculator TFLOP/s / peak TFLOP/s" if peak else
                            "null: no peak measured in this run (CPU engine, or no CUDA torch)",
    }


def _combine(per_mode: dict[str, dict[str, Any]], numerics_by_mode: dict[str, Any], default_mode: str,
             start) -> dict[str, Any]:
    first = next(iter(per_mode.values()))
    rows = []
    for i, row in enumerate(first["rows"]):
        by_mode = {m: rep["rows"][i] for m, rep in per_mode.items() if i < len(rep["rows"])}
        fastest_mode = min(by_mode, key=lambda m: by_mode[m]["baseline_ttft_ms"])
        fastest = by_mode[fastest_mode]["baseline_ttft_ms"]
        modes = {}
        for m, r in by_mode.items():
            modes[m] = {**r, "ratio_vs_fastest_baseline": round(fastest / r["specprefill_ttft_ms"], 3)
                        if r["specprefill_ttft_ms"] else 0.0}
        head = modes.get(default_mode) or modes[fastest_mode]
        rows.append({
            "length": row["length"],
            "prompt_tokens": row["prompt_tokens"],
            "fastest_baseline_ms": fastest,
            "fastest_baseline_mode": fastest_mode,
            "headline_mode": default_mode if default_mode in modes else fastest_mode,
            # the headline: the service's mode's specprefill against the fastest baseline measured
            "baseline_ttft_ms": fastest,
            "specprefill_ttft_ms": head["specprefill_ttft_ms"],
            "ratio": head["ratio_vs_fastest_baseline"],
            "kept_ratio": head["kept_ratio"],
            "windows": head["windows"],
            "specprefill_phases_ms": head["specprefill_phases_ms"],
            "scoring_overhead": head.get("scoring_overhead"),
            **{k: head.get(k) for k in ("speculator_tokens", "speculator_tokens_per_s", "speculator_tflops",
                                         "fraction_of_peak")},
            "modes": modes,
        })
    from .provenance import provenance

    prov = provenance(None, numerics_by_mode=numerics_by_mode, start=start,
                      positions=[p for rep in per_mode.values() for p in rep["provenance"]["positions"]],
                      warnings=[w for rep in per_mode.values() for w in rep["provenance"]["warnings"]])
    prov["library"] = first["provenance"]["library"]  # probed with an engine loaded
    return {
        "benchmark": "ttft",
        "date": first["date"],
        "commit": prov["code"]["describe"],
        "provenance": prov,
        "hardware": prov["host"],
        "llama_cpp_python": prov["library"]["llama_cpp_python"],
        "engine": first["engine"],
        "n_ctx": first["n_ctx"],
        "batch_invariant_modes": list(per_mode),
        "same_numerics": {m: rep["same_numerics"] for m, rep in per_mode.items()},
        "settings": first["settings"],
        "speculator_throughput": per_mode.get(default_mode, first).get("speculator_throughput"),
        "rows": rows,
        "per_mode": per_mode,
    }


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    for mode, rep in (report.get("per_mode") or {}).items():
        print_report({**rep, "title": f"batch-invariant {mode}: baseline and specprefill in the same numerics"})
    if "per_mode" in report:
        t = Table(title="specprefill against the fastest baseline of all modes")
        for col in ("prompt tokens", "fastest baseline ms", "(mode)", *[f"specprefill ms ({m})" for m in report["per_mode"]],
                    *[f"ratio ({m})" for m in report["per_mode"]]):
            t.add_column(col, justify="right")
        for r in report["rows"]:
            ms = r["modes"]
            t.add_row(f"{r['prompt_tokens']:,}", f"{r['fastest_baseline_ms']:,.0f}", r["fastest_baseline_mode"],
                      *[f"{ms[m]['specprefill_ttft_ms']:,.0f}" for m in report["per_mode"]],
                      *[f"{ms[m]['ratio_vs_fastest_baseline']:.2f}×" for m in report["per_mode"]])
        Console(width=200).print(t)
        return
    t = Table(title=report.get("title") or f"TTFT, baseline vs specprefill ({report['engine'].get('backend')}, keep {report['settings']['keep']})")
    for col in ("prompt tokens", "baseline ms", "specprefill ms", "ratio", "kept", "windows", "spec prefill", "lookahead",
                "score math", "select", "sparse prefill", "overhead", "spec tokens", "spec tok/s", "spec TFLOP/s", "of peak"):
        t.add_column(col, justify="right")
    for r in report["rows"]:
        p = r["specprefill_phases_ms"]
        ov = r.get("scoring_overhead")
        t.add_row(
            f"{r['prompt_tokens']:,}", f"{r['baseline_ttft_ms']:,.0f}", f"{r['specprefill_ttft_ms']:,.0f}", f"{r['ratio']:.2f}×",
            f"{r['kept_ratio']:.0%}", str(r["windows"]),
            *(f"{p.get(k, 0):,.0f}" for k in PHASES),
            "-" if ov is None else f"{ov:+.0%}",
            *_throughput_cells(r),
        )
    Console(width=200).print(t)


def _throughput_cells(r: dict[str, Any]) -> list[str]:
    tps, tf, frac = r.get("speculator_tokens_per_s"), r.get("speculator_tflops"), r.get("fraction_of_peak")
    return [f"{r['speculator_tokens']:,}" if r.get("speculator_tokens") is not None else "-",
            "-" if tps is None else f"{tps:,.0f}", "-" if tf is None else f"{tf:.3g}",
            "-" if frac is None else f"{frac:.1%}"]


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
