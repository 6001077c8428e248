"""Alembic environment for specq.

The database URL comes from (first match): a connection handed in by `specq.storage.db.upgrade`
(`config.attributes["connection"]`), `config.attributes["specq_url"]`, `-x url=...` on the alembic
command line, `sqlalchemy.url` in alembic.ini, and finally `specq.storage.db.database_url()`
(SPECQ_DATABASE_URL or $SPECQ_HOME/specq.sqlite).
"""

from __future__ import annotations

import sys
from logging.config import fileConfig
from pathlib import Path

from alembic import context

# make `import specq` work when alembic runs from a source checkout without an install
_repo = str(Path(__file__).resolve().parents[1])
if _repo not in sys.path:
    sys.path.insert(0, _repo)

from specq.storage import db  # noqa: E402
from specq.storage.models import Base  # noqa: E402

config = context.config
target_metadata = Base.metadata

if config.config_file_name is not None and "connection" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url():
    url = config.attributes.get("specq_url") or context.get_x_argument(as_dictionary=True).get("url")
    url = url or config.get_main_option("sqlalchemy.url") or None
    return db.normalize_url(url)


def _configure(**kwargs) -> None:
    context.configure(
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite cannot ALTER most things: later migrations use batch mode (copy-and-move) there
        render_as_batch=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    _configure(url=_url().render_as_string(hide_password=False), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = db.get_engine(_url())
    with engine.connect() as connection:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
