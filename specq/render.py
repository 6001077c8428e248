"""How a run result object looks in a terminal: the answer, then a phase table (shared by
`specq run`, `specq submit --wait` and `specq result`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

#: phases in display order; sub-phases of `score` are indented
_ORDER = ["tokenize", "score", "speculator_prefill", "lookahead", "score_math", "select", "sparse_prefill", "ttft", "decode", "total"]
_SUB = {"speculator_prefill", "lookahead", "score_math"}


def phase_table(result: dict[str, Any]) -> Table:
    timings = result.get("timings_ms", {})
    table = Table(title="phases", box=None, pad_edge=False, title_justify="left")
    table.add_column("phase")
    table.add_column("ms", justify="right")
    names = [p for p in _ORDER if p in timings] + sorted(p for p in timings if p not in _ORDER)
    for name in names:
        label = f"  {name}" if name in _SUB else name
        table.add_row(label, f"{timings[name]:,.1f}")
    return table


def summary_line(result: dict[str, Any]) -> str:
    u, s, e, d = result.get("usage", {}), result.get("spec", {}), result.get("engine", {}), result.get("draft", {})
    prompt, kept = u.get("prompt_tokens", 0), u.get("kept_tokens", 0)
    ratio = f"{kept / prompt:.0%}" if prompt else "-"
    parts = [
        f"mode {s.get('mode')}",
        f"positions {s.get('positions')}",
        f"kept {kept}/{prompt} tokens ({ratio})",
        f"{u.get('completion_tokens', 0)} tokens out ({result.get('finish_reason')})",
        f"backend {e.get('backend')}",
    ]
    if s.get("mode") == "specprefill":
        parts.insert(1, f"scorer {s.get('scorer')} ({s.get('windows')} windows)")
    if d.get("method", "none") != "none":
        parts.append(f"draft {d.get('method')} accept {d.get('accept_rate', 0):.0%}")
    return " · ".join(parts)


def print_result(result: dict[str, Any], console: Console | None = None, *, text: bool = True) -> None:
    """The answer (unless `text` is False: it was printed as it was decoded), a summary and the phases."""
    console = console or Console()
    if text:
        console.print(result.get("text", ""), markup=False, highlight=False)
    console.print()
    console.print(summary_line(result), style="dim", markup=False)
    for w in result.get("warnings", []) or []:
        console.print(f"warning: {w}", style="yellow", markup=False)
    console.print(phase_table(result))
