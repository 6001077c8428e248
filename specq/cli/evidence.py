"""`specq evidence [--json] | build`: mode auto's quality evidence (engine/policy/evidence.py, docs/quality.md
"Evidence rows")."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app
from .common import fail, service_ready_db
from .output import Column, print_list, print_table

evidence_app = typer.Typer(
    help="Mode auto's quality evidence: where specprefill was measured to keep baseline's answers, per exact "
         "settings (docs/quality.md, Evidence rows). Without a sub-command: list the rows.",
    invoke_without_command=True)
app.add_typer(evidence_app, name="evidence")


def _rows(shipped_only: bool) -> list[dict]:
    from ..engine.policy.evidence import listing, shipped_rows

    if shipped_only:
        return listing(shipped_rows(), [])[1]
    from ..engine.policy import shadow
    from ..storage import db, evidence as store, shadow as shadow_store

    service_ready_db(upgrade=db.is_sqlite())
    with db.session() as s:
        stored = store.list_rows(s)
        checks = shadow.parse_keys(shadow_store.by_key(s))
    return shadow.annotate(listing(shipped_rows(), stored)[1], checks)


def _shadow_cells(r: dict) -> tuple[str, str]:
    """(checks, agreement with its lower bound) of a row's shadow checks; "-" where it has none."""
    sh = r.get("shadow") or {}
    if not sh.get("n"):
        return ("-" if not sh.get("cancelled") else f"0 ({sh['cancelled']} cancelled)"), "-"
    n = f"{sh['n']}" + (f" ({sh['cancelled']} cancelled)" if sh.get("cancelled") else "")
    return n, f"{sh['agreement']:.2f} (>= {sh['bound']:.2f})"


@evidence_app.callback()
def evidence_list(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print {object: list, data: [rows]} as JSON: full keys, "
                                                        "per-document counts, bounds, provenance."),
    shipped: bool = typer.Option(False, "--shipped", help="Only the rows shipped in the package (no database)."),
) -> None:
    """The evidence rows: shipped ones and the job store's (SPECQ_DATABASE_URL), as workers read them; a row
    that passes is where `mode auto` may run specprefill. `shadow` and `agreement`: its shadow checks
    (SPECQ_SHADOW_RATE) and how often their baseline answers equalled specprefill's (>= its 90% lower bound)."""
    if ctx.invoked_subcommand is not None:
        return
    rows = _rows(shipped)
    if as_json:
        print_list(rows)
        return
    print_table(["origin", "in use", "arm", "metric", "length", "keep", "chunk rule", "scorer", "window", "n", "documents",
                 "value", "bound", "passes", "shadow", "agreement", Column("why not", fold=True), Column("source", fold=True)],
                [(r["origin"], "yes" if r["in_use"] else "no", r["arm"], r["metric"], r["length"],
                  f"{r['key']['keep']:g}" + (" certified" if r.get("certified") else ""),
                  r["key"]["chunk_rule"], r["key"]["scorer"], r["key"]["window"] or "one pass",
                  r["n"], len(r["documents"]), "-" if r["value"] is None else f"{r['value']:.3f}", f"{r['bound']:.3f}",
                  "yes" if r["passes"] else "no", *_shadow_cells(r), r["fails"], r["source"]) for r in rows])


@evidence_app.command("build")
def evidence_build(
    out: Path = typer.Option(None, "--out", help="Write here instead of specq/engine/policy/evidence_rows.json."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when the shipped file differs."),
) -> None:
    """Recompute the shipped rows from the journals in bench/results (specq/bench/evidence_build.py): every
    key field, filled from the defaults at the run's commit where an older journal lacks it (each row's
    provenance.filled says which), document-clustered bounds."""
    import json

    from ..bench import evidence_build as eb
    from ..engine.policy.evidence import SHIPPED_PATH

    try:
        data = eb.build()
    except (OSError, ValueError, KeyError) as e:
        raise fail(f"evidence build: {e}") from None
    text = json.dumps(data, indent=1) + "\n"
    if check:
        same = SHIPPED_PATH.exists() and json.loads(SHIPPED_PATH.read_text()) == json.loads(text)
        typer.echo(f"{SHIPPED_PATH}: {'up to date' if same else 'differs from the journals'}", err=True)
        raise typer.Exit(0 if same else 1)
    target = out or SHIPPED_PATH
    target.write_text(text, encoding="utf-8")
    for r in data["rows"]:
        filled = ", ".join(sorted(r["provenance"]["filled"])) or "none"
        typer.echo(f"{r['source']}: {r['key']['task']} {r['arm']} {r['length']}, bound {r['bound']:.3f}"
                   f"{' (in-sample)' if r['in_sample'] else ''}; fields filled from defaults: {filled}")
    typer.echo(f"wrote {len(data['rows'])} rows to {target}", err=True)
