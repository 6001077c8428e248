"""calibrations: evidence measured through the service on the deployment's own workers (issue 48 item 3)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

`calibrations` (one per POST /v1/calibrations: settings, whether its lengths are planned, the evidence rows
written per (length, keep)) and `calibration_units` (one per question and keep: its job, line, reference answer,
length and outcome). Each unit runs as a job of the new kind `calibration` (PostgreSQL's check on jobs.kind
gains it; SQLite has no such check, migration 0004). Downgrade drops both tables and the jobs of that kind.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "calibrations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("settings", JSON, nullable=False),
        sa.Column("planned", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("written", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibrations")),
    )
    op.create_index(op.f("ix_calibrations_created_at"), "calibrations", ["created_at"], unique=False)
    op.create_table(
        "calibration_units",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("calibration_id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("keep", sa.Float(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("length", sa.Integer(), nullable=True),
        sa.Column("skipped", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("record", JSON, nullable=True),
        sa.ForeignKeyConstraint(["calibration_id"], ["calibrations.id"],
                                name=op.f("fk_calibration_units_calibration_id_calibrations"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibration_units")),
        sa.UniqueConstraint("job_id", name=op.f("uq_calibration_units_job_id")),
    )
    op.create_index(op.f("ix_calibration_units_calibration_id_keep_length"), "calibration_units",
                    ["calibration_id", "keep", "length"], unique=False)
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("kind", "jobs", type_="check")
        op.create_check_constraint("kind", "jobs", "kind IN ('job', 'chat', 'completion', 'calibration')")


def downgrade() -> None:
    op.execute("DELETE FROM jobs WHERE kind = 'calibration'")
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("kind", "jobs", type_="check")
        op.create_check_constraint("kind", "jobs", "kind IN ('job', 'chat', 'completion')")
    op.drop_index(op.f("ix_calibration_units_calibration_id_keep_length"), table_name="calibration_units")
    op.drop_table("calibration_units")
    op.drop_index(op.f("ix_calibrations_created_at"), table_name="calibrations")
    op.drop_table("calibrations")
