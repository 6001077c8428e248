"""Where the database is, how to connect to it, and how to bring its schema up to date.

The URL is `SPECQ_DATABASE_URL` or, by default, a SQLite file `$SPECQ_HOME/specq.sqlite`.
`postgresql://` (and `postgres://`) URLs are mapped to the psycopg 3 driver.

SQLite files are opened in WAL mode with a busy timeout, and write transactions begin with
`BEGIN IMMEDIATE` (see `write_transaction`), so an API process and a worker process can share one
file without "database is locked" errors on read-then-write transactions.

Migrations live in the top-level `migrations/` folder of the repository (next to the `specq/`
package, found through the package's parent directory, which works from any cwd and with
`pip install -e .`). `SPECQ_MIGRATIONS_DIR` overrides that location (e.g. for a wheel install, where
the folder is not part of the package).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from ..config import specq_home

#: SQLite busy timeout: how long a writer waits for another process's write lock
SQLITE_BUSY_TIMEOUT_MS = 30_000

_lock = threading.Lock()
_engines: dict[tuple[int, str], Engine] = {}
_factories: dict[tuple[int, str], sessionmaker[Session]] = {}


def database_url() -> str:
    """`SPECQ_DATABASE_URL`, or the SQLite file `$SPECQ_HOME/specq.sqlite`."""
    url = os.environ.get("SPECQ_DATABASE_URL", "").strip()
    if url:
        return url
    return f"sqlite:///{specq_home() / 'specq.sqlite'}"


def normalize_url(url: str | URL | None = None) -> URL:
    """Parse `url` (default `database_url()`), mapping postgres URLs to the psycopg 3 driver."""
    u = make_url(str(url) if isinstance(url, str) else url) if url is not None else make_url(database_url())
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u


def masked_url(url: str | URL | None = None) -> str:
    """The URL as a string with its password replaced by `***`."""
    return normalize_url(url).render_as_string(hide_password=True)


def is_sqlite(url: str | URL | None = None) -> bool:
    return normalize_url(url).get_backend_name() == "sqlite"


def _key(url: URL) -> tuple[int, str]:
    # keyed by pid: an engine inherited over fork (Celery prefork) must not share its pool
    return (os.getpid(), url.render_as_string(hide_password=False))


def get_engine(url: str | URL | None = None) -> Engine:
    """A cached engine for `url` (default `database_url()`), one per URL and process."""
    u = normalize_url(url)
    key = _key(u)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _make_engine(u)
            _engines[key] = engine
        return engine


def _make_engine(u: URL) -> Engine:
    from .sanitize import safe_loads  # stored JSON that cannot be decoded must not fail a whole query

    if u.get_backend_name() != "sqlite":
        return create_engine(u, pool_pre_ping=True, json_deserializer=safe_loads)
    database = u.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(u, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, json_deserializer=safe_loads)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # pragma: no cover - exercised through every test
        # let SQLAlchemy (not pysqlite) emit BEGIN, so that write transactions can be IMMEDIATE
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        try:
            if database not in ("", ":memory:"):
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        if conn.get_execution_options().get("specq_write"):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")

    return engine


def session_factory(url: str | URL | None = None) -> sessionmaker[Session]:
    """The cached sessionmaker for `url` (expire_on_commit=False: returned rows stay readable)."""
    u = normalize_url(url)
    key = _key(u)
    engine = get_engine(u)
    with _lock:
        factory = _factories.get(key)
        if factory is None:
            factory = sessionmaker(bind=engine, expire_on_commit=False)
            _factories[key] = factory
        return factory


@contextmanager
def session(url: str | URL | None = None) -> Iterator[Session]:
    """`with session() as s:` — a Session for `url`, closed (and rolled back if uncommitted) at the end."""
    s = session_factory(url)()
    try:
        yield s
    finally:
        s.close()


def write_transaction(s: Session) -> None:
    """Start `s`'s transaction as a write transaction (SQLite: BEGIN IMMEDIATE) if none is open.

    Storage functions that read before they write call this first, so two processes sharing one
    SQLite file queue on the busy timeout instead of failing with SQLITE_BUSY.
    """
    if not s.in_transaction():
        s.connection(execution_options={"specq_write": True})


def dispose_engines() -> None:
    """Close every cached engine's connections (tests; before dropping a database)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _factories.clear()


# --- migrations -------------------------------------------------------------------------------


def migrations_dir() -> Path:
    """The Alembic script folder: `SPECQ_MIGRATIONS_DIR`, else `<repo>/migrations` next to `specq/`."""
    override = os.environ.get("SPECQ_MIGRATIONS_DIR", "").strip()
    path = Path(override) if override else Path(__file__).resolve().parents[2] / "migrations"
    if not (path / "env.py").is_file():
        raise RuntimeError(
            f"Alembic migrations not found at {path} (expected env.py there). specq finds them in the "
            "top-level migrations/ folder next to the specq package (a source checkout or `pip install -e .`); "
            "set SPECQ_MIGRATIONS_DIR to point elsewhere."
        )
    return path


def alembic_config(url: str | URL | None = None):
    """An Alembic Config for `url` that works from any cwd (no alembic.ini needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["specq_url"] = normalize_url(url)
    return cfg


def upgrade(url: str | URL | None = None, revision: str = "head") -> str | None:
    """Run Alembic migrations on `url` (default `database_url()`) up to `revision`; return the new revision."""
    from alembic import command

    cfg = alembic_config(url)
    engine = get_engine(url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    return current_revision(url)


def current_revision(url: str | URL | None = None) -> str | None:
    """The database's Alembic revision (None for an empty database)."""
    from alembic.runtime.migration import MigrationContext

    with get_engine(url).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    """The newest revision among the migration scripts."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(migrations_dir())).get_current_head()
