"""shadow_checks: mode-auto specprefill jobs answered in baseline too, and whether the answers agreed (issue 48 item 4)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06

One row per shadow check (engine/policy/shadow.py, worker/shadow.py): the job, its EvidenceKey (sha256 of
the compared fields, and the fields as JSON), the outcome (agree | disagree | cancelled) and the baseline
run's wall time. Workers read the per-key counts to disable evidence rows whose agreement falls below the
bar; /metrics and GET /v1/evidence show them. Downgrade drops the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "shadow_checks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("key", JSON, nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("shadow_ms", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shadow_checks")),
    )
    op.create_index(op.f("ix_shadow_checks_key_id"), "shadow_checks", ["key_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_shadow_checks_key_id"), table_name="shadow_checks")
    op.drop_table("shadow_checks")
