"""`specq keys create | list | revoke`: API keys, stored hashed in the job database."""

from __future__ import annotations

import typer

from .app import app
from .common import fail, service_ready_db
from .output import Column, print_list, print_table, safe, stdout_is_terminal, when


keys_app = typer.Typer(
    help="API keys, stored hashed in the job database (SPECQ_DATABASE_URL). The API checks them when it "
         "runs with SPECQ_AUTH=keys; each key sees only its tenant's jobs and batches, admin keys see all.",
    no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Option(..., "--tenant", help="The tenant the key acts for (letters, digits, . _ -)."),
    admin: bool = typer.Option(False, "--admin", help="May read every tenant's jobs and batches, and /metrics."),
    name: str = typer.Option(None, "--name", help="A note shown by `specq keys list`."),
) -> None:
    """Make a key and print it once (only its hash is kept): clients send it as `Authorization: Bearer KEY`,
    the CLI reads it from SPECQ_API_KEY."""
    from ..storage import db, keys

    service_ready_db(upgrade=db.is_sqlite())
    try:
        with db.session() as s:
            row, secret = keys.create_key(s, tenant, admin=admin, name=name)
    except ValueError as e:
        raise fail(str(e)) from None
    typer.echo(secret)
    typer.echo(f"{row.id}: {'admin ' if admin else ''}key of tenant {tenant}, shown once (only its hash is stored); "
               "the CLI sends it from SPECQ_API_KEY", err=True)


@keys_app.command("list")
def keys_list(
    tenant: str = typer.Option(None, "--tenant", help="Only this tenant's keys."),
    revoked: bool = typer.Option(False, "--revoked", help="Also show revoked keys."),
    as_json: bool = typer.Option(False, "--json", help="Print {object: list, data: [key objects]} as JSON."),
) -> None:
    """The keys: id, tenant, admin, the key's first characters, name, created, revoked.

    Piped (stdout not a terminal): one tab-separated line per key in that order, no header, ids and
    prefixes whole (`specq keys list | cut -f1` gives ids `specq keys revoke` takes).
    """
    from ..storage import db, keys

    service_ready_db(upgrade=db.is_sqlite())
    with db.session() as s:
        rows = [r.to_dict() for r in keys.list_keys(s, tenant=tenant, include_revoked=revoked)]
    if as_json:
        print_list(rows)
        return
    more = "…" if stdout_is_terminal() else ""
    print_table(["id", "tenant", "admin", "key", Column("name", fold=True), "created", "revoked"],
                [(d["id"], d["tenant"], "yes" if d["admin"] else "", d["prefix"] + more, d["name"] or "",
                  when(d["created_at"]), when(d["revoked_at"])) for d in rows])


@keys_app.command("revoke")
def keys_revoke(ref: str = typer.Argument(..., help="The key's id (key_…) or its first characters as listed.")) -> None:
    """Revoke a key: the API refuses it (401) from its next request on."""
    from ..storage import db, keys

    service_ready_db(upgrade=db.is_sqlite())
    try:
        with db.session() as s:
            row = keys.revoke_key(s, ref.rstrip("…"))
    except ValueError as e:
        raise fail(str(e)) from None
    if row is None:
        raise fail(f"no key {ref}")
    typer.echo(safe(f"{row.id} ({row.prefix}…, tenant {row.tenant}) revoked at {row.to_dict()['revoked_at']}"))

