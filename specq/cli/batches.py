"""`specq batches | results | stats | cancel-batch`: batches over HTTP."""

from __future__ import annotations

import typer

from .app import app
from .common import api_call, fail


@app.command("batches")
def batches_cmd(
    status: str = typer.Option(None, help="Only these statuses (comma-separated): in_progress, completed, failed, cancelled, …"),
    limit: int = typer.Option(20, help="How many, newest first."),
) -> None:
    """Recent batches with their status and request counts."""
    from rich.console import Console
    from rich.table import Table

    page = api_call(lambda c: c.batches(status=status, limit=limit))
    table = Table(box=None, pad_edge=False)
    for col in ("id", "name", "status", "done", "failed", "total", "created (UTC)"):
        table.add_column(col, no_wrap=True)
    for b in page["data"]:
        c = b["request_counts"]
        table.add_row(b["id"], str((b.get("metadata") or {}).get("name") or ""), b["status"], str(c["completed"]),
                      str(c["failed"]), str(c["total"]), _utc(b.get("created_at")))
    Console().print(table)


def _utc(unix: int | None) -> str:
    """A batch's Unix-second timestamp as `YYYY-MM-DD HH:MM:SS` (UTC)."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(unix, timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if unix else ""


@app.command("results")
def results_cmd(
    batch: str = typer.Argument(..., help="A batch id (batch_…) or the name given with `submit --batch NAME`."),
    fmt: str = typer.Option("table", "--format", "-f", help="jsonl (run result objects), csv (usage and phase timings as columns) or table."),
    errors: bool = typer.Option(False, "--errors", help="The failed and cancelled requests instead (JSONL)."),
) -> None:
    """The answers of a batch's finished requests, one per request in submission order."""
    if fmt not in ("jsonl", "csv", "table"):
        raise fail(f"--format must be jsonl, csv or table, not {fmt!r}")

    def go(c):
        b = c.resolve_batch(batch)
        if errors:
            return b, c.batch_export(b["id"], "errors"), None
        return b, c.batch_export(b["id"], "results", "csv" if fmt == "csv" else "jsonl"), None

    b, text, _ = api_call(go)
    if errors or fmt in ("jsonl", "csv"):
        typer.echo(text, nl=False)
    else:
        _print_results_table(text)
    c = b["request_counts"]
    if b["status"] not in ("completed", "failed", "cancelled", "expired"):
        typer.echo(f"batch {b['id']} is {b['status']}: {c['completed']}/{c['total']} completed so far", err=True)
    elif c["failed"] and not errors:
        typer.echo(f"{c['failed']} request(s) failed or were cancelled: `specq results {b['id']} --errors`", err=True)


def _print_results_table(text: str) -> None:
    import json

    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col, kw in (("custom_id", {"no_wrap": True}), ("answer", {"overflow": "fold", "max_width": 60}),
                    ("prompt", {"justify": "right"}), ("kept", {"justify": "right"}), ("ttft ms", {"justify": "right"}),
                    ("decode ms", {"justify": "right"}), ("total ms", {"justify": "right"})):
        table.add_column(col, **kw)
    for line in text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        r = row["result"]
        t, u = r.get("timings_ms") or {}, r.get("usage") or {}
        answer = " ".join((r.get("text") or "").split())
        table.add_row(str(row["custom_id"]), answer[:200], str(u.get("prompt_tokens")), str(u.get("kept_tokens")),
                      f"{t.get('ttft', 0):,.1f}", f"{t.get('decode', 0):,.1f}", f"{t.get('total', 0):,.1f}")
    Console().print(table)


@app.command("stats")
def stats_cmd(
    batch: str = typer.Argument(..., help="A batch id (batch_…) or the name given with `submit --batch NAME`."),
    as_json: bool = typer.Option(False, "--json", help="Print the stats object as JSON."),
) -> None:
    """Per-phase p50/p95 of a batch's finished requests, mean kept ratio and throughput (computed in SQL)."""
    import json

    from rich.console import Console
    from rich.table import Table

    st = api_call(lambda c: c.batch_stats(c.resolve_batch(batch)["id"]))
    if as_json:
        typer.echo(json.dumps(st, indent=2))
        return
    c = st["request_counts"]
    typer.echo(f"{st['batch_id']}  {st['status']}  {c['completed']}/{c['total']} completed, {c['failed']} failed")
    if st.get("kept_ratio_mean") is not None:
        typer.echo(f"  kept ratio (mean)   {st['kept_ratio_mean']:.3f}   prompt tokens (mean) {st['prompt_tokens_mean']:.1f}")
    if st.get("wall_s"):
        typer.echo(f"  wall                {st['wall_s']:.1f} s   throughput {st['jobs_per_s']:.2f} jobs/s")
    table = Table(box=None, pad_edge=False)
    for col in ("phase", "count", "p50 ms", "p95 ms", "mean ms", "max ms"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for phase, p in st["phases"].items():
        table.add_row(phase, str(p["count"]), f"{p['p50']:,.1f}", f"{p['p95']:,.1f}", f"{p['mean']:,.1f}", f"{p['max']:,.1f}")
    Console().print(table)


@app.command("cancel-batch")
def cancel_batch_cmd(batch: str = typer.Argument(..., help="A batch id (batch_…) or name.")) -> None:
    """Cancel a batch: queued requests at once, running ones at their next step; finished results stay."""
    b = api_call(lambda c: c.cancel_batch(c.resolve_batch(batch)["id"]))
    c = b["request_counts"]
    typer.echo(f"{b['id']}: {b['status']} ({c['completed']} completed results kept)")

