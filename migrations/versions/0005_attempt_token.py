"""fencing: jobs.attempt_token

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

Each claim of a job (and each reconciler transition of a stale one) writes a new random token; every
write a worker makes about its job (heartbeat, progress, result, failure, retry, cancel, streamed
text) is conditional on (job id, its token, status running), so a worker whose claim was taken over
writes nothing (specq.storage.jobs, "Fencing"). Existing rows get NULL: a job left `running` by a
worker from before this revision matches no token, so that worker's writes are refused and the
reconciler requeues the job once its heartbeat is stale.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # plain ADD/DROP COLUMN (no batch mode): SQLite recreating `jobs` would cascade-delete its children
    op.add_column("jobs", sa.Column("attempt_token", sa.String(length=32), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "attempt_token")
