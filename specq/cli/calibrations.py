"""`specq calibrations [--json] | show ID | cancel ID`: calibrations run through the service (POST /v1/calibrations,
submitted with `specq calibrate --service`; docs/quality.md "Calibrate through the service")."""

from __future__ import annotations

import typer

from .app import app
from .common import api_call
from .output import Column, print_json, print_table, when

calibrations_app = typer.Typer(
    help="Calibrations the service's own workers run (submit one with `specq calibrate --service`; admin key). "
         "Without a sub-command: list them.",
    invoke_without_command=True)
app.add_typer(calibrations_app, name="calibrations")


def _keeps(cal: dict) -> str:
    return ",".join(f"{k:g}" for k in cal["settings"].get("keep", []))


def _rows_written(cal: dict) -> int:
    return sum(len(ids) for ids in (cal.get("rows_written") or {}).values())


@calibrations_app.callback()
def calibrations_list(
    ctx: typer.Context,
    limit: int = typer.Option(20, help="How many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print the API's list object (GET /v1/calibrations) as JSON."),
) -> None:
    """Calibrations, newest first: status, progress (units done of total), keep, rows written.

    Piped (stdout not a terminal): one tab-separated line per calibration, no header:
    id, status, done, total, keep, rows, created (UTC)."""
    if ctx.invoked_subcommand is not None:
        return
    page = api_call(lambda c: c.request("GET", "/v1/calibrations", params={"limit": limit}, expect=("data",)))
    if as_json:
        print_json(page)
        return
    print_table(["id", "status", Column("done", right=True), Column("total", right=True), "keep",
                 Column("rows", right=True), "created"],
                [(c["id"], c["status"], c["progress"]["done"], c["progress"]["total"], _keeps(c), _rows_written(c),
                  when(c["created_at"])) for c in page["data"]])


@calibrations_app.command("show")
def calibrations_show(
    cal_id: str = typer.Argument(..., help="A calibration id (cal_…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the calibration with its rows (GET /v1/calibrations/{id})."),
) -> None:
    """One calibration: status, progress, settings and the evidence rows written for it (one per metric, per
    length and keep, once all of that length's units are done)."""
    cal = api_call(lambda c: c.request("GET", f"/v1/calibrations/{cal_id}", expect=("id", "status")))
    if as_json:
        print_json(cal)
        return
    p, st = cal["progress"], cal["settings"]
    typer.echo(f"{cal['id']}: {cal['status']}, {p['done']} of {p['total']} units done"
               + (f", {p['skipped']} skipped (n={st.get('n')})" if p.get("skipped") else "")
               + (f", {p['failed']} failed" if p.get("failed") else ""))
    typer.echo(f"keep {_keeps(cal)}, lengths {','.join(str(x) for x in st.get('lengths', []))}, task {st.get('task')}, "
               f"max_tokens {st.get('max_tokens')}; created {when(cal['created_at'])}")
    if cal.get("error"):
        typer.echo(f"error: {cal['error']}")
    rows = cal.get("rows") or []
    if rows:
        print_table(["id", "length", "keep", "metric", "n", "documents", "bound", "passes"],
                    [(r["id"], r["length"], f"{r['key']['keep']:g}", r["metric"], r["n"], len(r["documents"]),
                      f"{r['bound']:.3f}", "yes" if r["passes"] else "no") for r in rows])
    else:
        typer.echo("no rows written yet (a length's rows are written once all of its units are done)")


@calibrations_app.command("cancel")
def calibrations_cancel(cal_id: str = typer.Argument(..., help="A calibration id (cal_…).")) -> None:
    """Cancel a calibration: its queued units are cancelled, running ones stopped; rows already written stay."""
    cal = api_call(lambda c: c.request("DELETE", f"/v1/calibrations/{cal_id}", expect=("id", "status")))
    typer.echo(f"{cal['id']}: {cal['status']} ({cal['progress']['done']} of {cal['progress']['total']} units done)")
