"""`specq batches | batch | results | stats | cancel-batch`: batches over HTTP."""

from __future__ import annotations

import typer

from .app import app
from .common import api_call, fail
from .render import print_results_table
from .output import Column, echo_data, num, print_json, print_table, safe, stdout_is_terminal

#: a batch's timestamps in the order a batch lives them
_TIMES = ("created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
          "cancelled_at", "expires_at")


def _name(batch: dict) -> str:
    meta = batch.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


def _when(value) -> str:
    """A batch timestamp (Unix seconds, as OpenAI's Batch objects have them) as `YYYY-MM-DD HH:MM:SS` UTC;
    an ISO string (older servers) is shown as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        from datetime import datetime, timezone

        return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return str(value or "").replace("T", " ")[:19]


@app.command("batches")
def batches_cmd(
    status: str = typer.Option(None, help="Only these statuses (comma-separated): in_progress, completed, failed, cancelled, …"),
    limit: int = typer.Option(20, help="How many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print the API's list object as JSON (what GET /v1/batches answers)."),
) -> None:
    """Recent batches with their status and request counts.

    Piped (stdout not a terminal): one tab-separated line per batch, no header, ids whole:
    id, name, status, done, failed, total, created (UTC).
    """
    page = api_call(lambda c: c.batches(status=status, limit=limit))
    if as_json:
        print_json(page)
        return
    rows = []
    for b in page["data"]:
        c = b["request_counts"]
        rows.append((b["id"], _name(b), b["status"], c["completed"], c["failed"], c["total"], _when(b.get("created_at"))))
    print_table(["id", Column("name", fold=True), "status", Column("done", right=True), Column("failed", right=True),
                 Column("total", right=True), "created (UTC)"], rows)


@app.command("batch")
def batch_cmd(
    batch: str = typer.Argument(..., help="A batch id (batch_…) or the name given with `submit --batch NAME`."),
    as_json: bool = typer.Option(False, "--json", help="Print the batch object as JSON."),
) -> None:
    """One batch: status, request counts, timestamps, validation errors, and where its results are."""
    b, url = api_call(lambda c: (c.resolve_batch(batch), c.url))
    if as_json:
        print_json(b)
        return
    c = b["request_counts"]
    lines = [f"{b['id']}  {b['status']}"]
    if _name(b):
        lines.append(f"  name        {_name(b)}")
    lines.append(f"  requests    {c['total']} total, {c['completed']} completed, {c['failed']} failed or cancelled")
    for key in _TIMES:
        if b.get(key):
            lines.append(f"  {key[:-3].replace('_', ' '):<11} {_when(b[key])} UTC")
    if b.get("input_filename"):
        lines.append(f"  input       {b['input_filename']}")
    for key in ("input_file_id", "output_file_id", "error_file_id"):
        if b.get(key):
            lines.append(f"  {key[:-8].replace('_', ' ') + ' file':<11} {b[key]}   GET {url}/v1/files/{b[key]}/content")
    errors = (b.get("errors") or {}).get("data") if isinstance(b.get("errors"), dict) else None
    if errors:
        first = errors[0].get("message") if isinstance(errors[0], dict) else errors[0]
        lines.append(f"  errors      {len(errors)} (first: {first})")
    lines.append(f"  results     specq results {b['id']} [--format csv]   GET {url}/v1/batches/{b['id']}/results")
    if c["failed"]:
        lines.append(f"  failures    specq results {b['id']} --errors   GET {url}/v1/batches/{b['id']}/errors")
    lines.append(f"  stats       specq stats {b['id']}   GET {url}/v1/batches/{b['id']}/stats")
    typer.echo("\n".join(safe(line) for line in lines))



@app.command("results")
def results_cmd(
    batch: str = typer.Argument(..., help="A batch id (batch_…) or the name given with `submit --batch NAME`."),
    fmt: str = typer.Option("table", "--format", "-f", help="jsonl (run result objects), csv (usage and phase timings as columns) or table."),
    errors: bool = typer.Option(False, "--errors", help="The failed and cancelled requests instead (JSONL)."),
) -> None:
    """The answers of a batch's finished requests, one per request in submission order.

    jsonl and csv are the API's bytes, unchanged when piped or redirected (control characters are
    shown escaped only on a terminal). The table, piped, is one tab-separated line per request, no
    header: custom_id, answer, prompt, kept, ttft ms, decode ms, total ms.
    """
    if fmt not in ("jsonl", "csv", "table"):
        raise fail(f"--format must be jsonl, csv or table, not {fmt!r}")

    def go(c):
        b = c.resolve_batch(batch)
        if errors:
            return b, c.batch_export(b["id"], "errors")
        return b, c.batch_export(b["id"], "results", "csv" if fmt == "csv" else "jsonl")

    b, text = api_call(go)
    if errors or fmt in ("jsonl", "csv"):
        echo_data(text)
    else:
        print_results_table(text)
    c = b["request_counts"]
    if b["status"] not in ("completed", "failed", "cancelled", "expired"):
        typer.echo(f"batch {b['id']} is {b['status']}: {c['completed']}/{c['total']} completed so far", err=True)
    elif c["failed"] and not errors:
        typer.echo(f"{c['failed']} request(s) failed or were cancelled: `specq results {b['id']} --errors`", err=True)


@app.command("stats")
def stats_cmd(
    batch: str = typer.Argument(..., help="A batch id (batch_…) or the name given with `submit --batch NAME`."),
    as_json: bool = typer.Option(False, "--json", help="Print the stats object as JSON."),
) -> None:
    """Per-phase p50/p95 of a batch's finished requests, mean kept ratio and throughput (computed in SQL).

    Phases are listed in the order a job runs them (tokenize … decode, then total). Piped, the phase
    table is tab-separated lines under a header line (phase, count, p50 ms, p95 ms, mean ms, max ms)
    and the summary above it goes to stderr, so stdout is the table alone.
    """
    st = api_call(lambda c: c.batch_stats(c.resolve_batch(batch)["id"]))
    if as_json:
        print_json(st)
        return
    terminal = stdout_is_terminal()

    def say(line: str) -> None:
        typer.echo(line, err=not terminal)

    c = st["request_counts"]
    say(safe(f"{st['batch_id']}  {st['status']}  {c['completed']}/{c['total']} completed, {c['failed']} failed"))
    if st.get("kept_ratio_mean") is not None:
        say(f"  kept ratio (mean)   {num(st['kept_ratio_mean'], '.3f')}   "
            f"prompt tokens (mean) {num(st.get('prompt_tokens_mean'), '.1f')}")
    if st.get("wall_s"):
        say(f"  wall                {num(st['wall_s'], '.1f')} s   throughput {num(st.get('jobs_per_s'), '.2f')} jobs/s")
    phases = st.get("phases") or {}
    rows = [(phase, p.get("count"), num(p.get("p50")), num(p.get("p95")), num(p.get("mean")), num(p.get("max")))
            for phase, p in sorted(phases.items(), key=lambda kv: phase_rank(kv[0]))]
    headers = ["phase", "count", "p50 ms", "p95 ms", "mean ms", "max ms"]
    if not terminal:
        typer.echo("\t".join(headers))
    print_table([headers[0]] + [Column(h, right=True) for h in headers[1:]], rows, terminal=terminal)


#: the phases in the order a job runs them (docs/result.md), `total` last; others go before `total`
PHASE_ORDER = ("queue_wait", "tokenize", "cache_restore", "score", "speculator_prefill", "lookahead", "score_math",
               "select", "group_prefill", "sparse_prefill", "ttft", "decode", "total")


def phase_rank(phase: str) -> tuple[float, str]:
    if phase in PHASE_ORDER:
        return float(PHASE_ORDER.index(phase)), ""
    return PHASE_ORDER.index("total") - 0.5, phase


@app.command("cancel-batch")
def cancel_batch_cmd(
    batch: str = typer.Argument(..., help="A batch id (batch_…) or name."),
    as_json: bool = typer.Option(False, "--json", help="Print the batch object as JSON (what POST /v1/batches/{id}/cancel answers)."),
) -> None:
    """Cancel a batch: queued requests at once, running ones at their next step; finished results stay."""
    b = api_call(lambda c: c.cancel_batch(c.resolve_batch(batch)["id"]))
    if as_json:
        print_json(b)
        return
    c = b["request_counts"]
    typer.echo(safe(f"{b['id']}: {b['status']} ({c['completed']} completed results kept)"))
