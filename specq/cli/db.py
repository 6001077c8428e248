"""`specq db upgrade`: the job database's schema."""

from __future__ import annotations

import typer

from .app import app
from .common import fail


db_app = typer.Typer(help="The job database (SPECQ_DATABASE_URL, default $SPECQ_HOME/specq.sqlite).", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(
    url: str = typer.Option(None, "--url", help="Database URL (default: SPECQ_DATABASE_URL or $SPECQ_HOME/specq.sqlite)."),
    revision: str = typer.Option("head", "--revision", help="Alembic revision to upgrade to."),
) -> None:
    """Create or migrate the database schema to the newest revision (Alembic); print the URL and revision."""
    from sqlalchemy.exc import SQLAlchemyError

    from ..storage import db

    try:
        shown = db.masked_url(url)
    except Exception as e:  # noqa: BLE001 - a malformed URL: say so in one line
        raise fail(f"bad database URL: {type(e).__name__}") from None
    try:
        rev = db.upgrade(url, revision)
    except (SQLAlchemyError, RuntimeError) as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        password = db.normalize_url(url).password
        if password:
            reason = reason.replace(str(password), "***")
        raise fail(f"upgrading {shown} failed: {reason}") from None
    typer.echo(f"database: {shown}")
    typer.echo(f"revision: {rev} (head: {db.head_revision()})")

