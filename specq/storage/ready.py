"""Is the job store ready for the service? (schema at the migrations' head)"""

from __future__ import annotations

from . import db


class SchemaNotReady(RuntimeError):
    """The database schema is not at the revision this code expects; the message says what to run."""


def ensure_schema(url: str | None = None, *, upgrade_sqlite: bool = True) -> str | None:
    """Check the schema is at head. A SQLite database (the single-machine default) is upgraded in
    place when `upgrade_sqlite`; any other database must be upgraded with `specq db upgrade` first
    (one migration step per deployment, not one per process). Returns the revision."""
    head = db.head_revision()
    try:
        current = db.current_revision(url)
    except Exception as e:
        raise SchemaNotReady(f"cannot reach the database at {db.masked_url(url)}: {str(e).splitlines()[0]}") from None
    if current == head:
        return current
    if upgrade_sqlite and db.is_sqlite(url):
        return db.upgrade(url)
    raise SchemaNotReady(
        f"the database at {db.masked_url(url)} is at schema revision {current or '(empty)'}, this specq needs "
        f"{head}: run `specq db upgrade` (with the same SPECQ_DATABASE_URL)"
    )


__all__ = ["ensure_schema", "SchemaNotReady"]
