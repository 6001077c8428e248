"""jobs: an index on (created_at, id), the order of GET /v1/jobs

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06

The unfiltered job list (no keys, or an admin key; the /ui polls it) orders every job by
(created_at, id), newest first. Without an index in that order each page scanned and sorted the
whole history; with it a page reads its rows off the index (storage.jobs.list_query).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f("ix_jobs_created_at_id"), "jobs", ["created_at", "id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_created_at_id"), table_name="jobs")
