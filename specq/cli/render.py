"""How a run result object looks in a terminal: the answer, then a phase table (shared by
`specq run`, `specq submit --wait` and `specq result`). Every string of the result is shown through
`output.safe`/`output.cell`: a model's answer may hold escape sequences or rich markup."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .output import cell, num

#: phases in display order; sub-phases of `score` are indented
_ORDER = ["tokenize", "score", "speculator_prefill", "lookahead", "score_math", "select", "cache_restore",
          "sparse_prefill", "ttft", "decode", "total"]
_SUB = {"speculator_prefill", "lookahead", "score_math"}
#: what a phase did, for people (the `timings_ms` keys stay as docs/result.md defines them: the table shows
#: both); `sparse_prefill` is the target's prefill in every mode, sparse only where specprefill ran
LABELS = {"score": "scoring", "speculator_prefill": "speculator prefill", "score_math": "score math",
          "cache_restore": "cache restore", "sparse_prefill": "prefill", "ttft": "TTFT"}


def phase_label(name: str, result: dict[str, Any] | None = None) -> str:
    """A phase's display label; for the target's prefill, by the mode that ran (`result`)."""
    if name == "sparse_prefill" and ((result or {}).get("spec") or {}).get("mode") == "specprefill":
        return "sparse prefill"
    return LABELS.get(name, name)


def phase_table(result: dict[str, Any]) -> Table:
    timings = result.get("timings_ms") or {}
    table = Table(title="phases", box=None, pad_edge=False, title_justify="left")
    table.add_column("phase")
    table.add_column("ms", justify="right")
    table.add_column("key", style="dim")
    names = [p for p in _ORDER if p in timings] + sorted(p for p in timings if p not in _ORDER)
    for name in names:
        label = phase_label(name, result)
        table.add_row(cell(f"  {label}" if name in _SUB else label), cell(num(timings[name])),
                      cell(name if label != name else ""))
    return table


def ran_line(result: dict[str, Any]) -> str:
    """`ran specprefill: auto: …` — the mode that ran and why (spec.reason), and what the target's
    prompt cache supplied."""
    s, u = result.get("spec") or {}, result.get("usage") or {}
    line = f"ran {s.get('mode')}" + (f": {s.get('reason')}" if s.get("reason") else "")
    target = (s.get("cache") or {}).get("target")
    if isinstance(target, dict) and target.get("hit"):
        line += (f" · prompt cache: {target.get('reused_tokens')} of {u.get('prompt_tokens')} prompt tokens restored, "
                 f"{target.get('prefilled_tokens')} prefilled")
    return line


def summary_line(result: dict[str, Any]) -> str:
    u, s, e, d = (result.get(k) or {} for k in ("usage", "spec", "engine", "draft"))
    prompt, kept = u.get("prompt_tokens") or 0, u.get("kept_tokens") or 0
    ratio = f"{kept / prompt:.0%}" if isinstance(prompt, int) and isinstance(kept, int) and prompt else "-"
    parts = [
        f"positions {s.get('positions')}",
        f"kept {kept}/{prompt} tokens ({ratio})",
        f"{u.get('completion_tokens', 0)} tokens out ({result.get('finish_reason')})",
        f"backend {e.get('backend')}",
    ]
    if s.get("mode") == "specprefill":
        parts.insert(1, f"scorer {s.get('scorer')} ({s.get('windows')} windows)")
    if d.get("method", "none") != "none":
        parts.append(f"draft {d.get('method')} accept {num(d.get('accept_rate'), '.0%')}")
    return " · ".join(parts)


def print_result(result: dict[str, Any], console: Console | None = None, *, text: bool = True) -> None:
    """The answer (unless `text` is False: it was printed as it was decoded), a summary and the phases."""
    console = console or Console()
    if text:
        console.print(cell(result.get("text", ""), lines=True), soft_wrap=True)  # the terminal wraps it, not rich
    console.print()
    console.print(cell(ran_line(result)))
    console.print(cell(summary_line(result), style="dim"))
    for w in result.get("warnings", []) or []:
        console.print(cell(f"warning: {w}", style="yellow"))
    console.print(phase_table(result))


def print_results_table(text: str) -> None:
    """A batch's results JSONL (GET /v1/batches/{id}/results) as a table: custom_id, answer, prompt,
    kept, ttft, decode, total (`specq results`, `specq submit … --wait` on a terminal)."""
    import json

    import typer

    from .output import Column, print_table

    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            typer.echo("error: the API's results are not JSONL: is it a specq API?", err=True)
            raise typer.Exit(1) from None
        r = row.get("result") if isinstance(row, dict) else None
        r = r if isinstance(r, dict) else {}
        t, u = r.get("timings_ms") or {}, r.get("usage") or {}
        answer = " ".join(str(r.get("text") or "").split())
        rows.append((row.get("custom_id") if isinstance(row, dict) else "", answer[:200], u.get("prompt_tokens"),
                     u.get("kept_tokens"), num(t.get("ttft")), num(t.get("decode")), num(t.get("total"))))
    print_table(["custom_id", Column("answer", fold=True, max_width=60), Column("prompt", right=True),
                 Column("kept", right=True), Column("ttft ms", right=True), Column("decode ms", right=True),
                 Column("total ms", right=True)], rows)
