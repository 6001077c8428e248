"""jobs, job_inputs, results, phase_timings, batches

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written from an autogenerate draft; tests/test_storage.py checks it still matches specq.storage.models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine:
    """JSON everywhere, JSONB on PostgreSQL (models.JSONType)."""
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _ts() -> sa.types.TypeEngine:
    """models.UTCDateTime is DateTime(timezone=True) underneath."""
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=64), server_default="default", nullable=False),
        sa.Column("status", sa.String(length=16), server_default="validating", nullable=False),
        sa.Column("endpoint", sa.String(length=128), nullable=True),
        sa.Column("completion_window", sa.String(length=32), nullable=True),
        sa.Column("input_filename", sa.String(length=255), nullable=True),
        sa.Column("params", _json(), nullable=False),
        sa.Column("metadata", _json(), nullable=True),
        sa.Column("errors", _json(), nullable=True),
        sa.Column("request_total", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("request_completed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("request_failed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("in_progress_at", _ts(), nullable=True),
        sa.Column("finalizing_at", _ts(), nullable=True),
        sa.Column("completed_at", _ts(), nullable=True),
        sa.Column("failed_at", _ts(), nullable=True),
        sa.Column("expired_at", _ts(), nullable=True),
        sa.Column("cancelling_at", _ts(), nullable=True),
        sa.Column("cancelled_at", _ts(), nullable=True),
        sa.Column("expires_at", _ts(), nullable=True),
        sa.CheckConstraint(
            "status IN ('validating', 'in_progress', 'finalizing', 'completed', 'failed', 'expired', "
            "'cancelling', 'cancelled')",
            name=op.f("ck_batches_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
    )
    op.create_index(op.f("ix_batches_tenant_created_at"), "batches", ["tenant", "created_at"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=64), server_default="default", nullable=False),
        sa.Column("batch_id", sa.String(length=40), nullable=True),
        sa.Column("custom_id", sa.String(length=255), nullable=True),
        sa.Column("status", sa.String(length=16), server_default="queued", nullable=False),
        sa.Column("progress_phase", sa.String(length=64), nullable=True),
        sa.Column("progress_done", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("progress_total", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default=sa.text("3"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("started_at", _ts(), nullable=True),
        sa.Column("finished_at", _ts(), nullable=True),
        sa.Column("queue_wait_ms", sa.Float(), nullable=True),
        sa.Column("params", _json(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("heartbeat_at", _ts(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name=op.f("ck_jobs_status")
        ),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name=op.f("fk_jobs_batch_id_batches"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("batch_id", "custom_id", name=op.f("uq_jobs_batch_id_custom_id")),
    )
    op.create_index(op.f("ix_jobs_batch_id_status"), "jobs", ["batch_id", "status"], unique=False)
    op.create_index(op.f("ix_jobs_status_created_at"), "jobs", ["status", "created_at"], unique=False)
    op.create_index(op.f("ix_jobs_tenant_created_at"), "jobs", ["tenant", "created_at"], unique=False)

    op.create_table(
        "job_inputs",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("question", sa.Text(), server_default="", nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_inputs_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_inputs")),
    )

    op.create_table(
        "phase_timings",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("phase", sa.String(length=64), nullable=False),
        sa.Column("ms", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_phase_timings_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "phase", name=op.f("pk_phase_timings")),
    )
    op.create_index(op.f("ix_phase_timings_phase"), "phase_timings", ["phase"], unique=False)

    op.create_table(
        "results",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("finish_reason", sa.String(length=32), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("kept_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("spec", _json(), nullable=False),
        sa.Column("engine", _json(), nullable=False),
        sa.Column("draft", _json(), nullable=False),
        sa.Column("extra", _json(), nullable=False),
        sa.Column("created_at", _ts(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_results_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_results")),
    )


def downgrade() -> None:
    op.drop_table("results")
    op.drop_index(op.f("ix_phase_timings_phase"), table_name="phase_timings")
    op.drop_table("phase_timings")
    op.drop_table("job_inputs")
    op.drop_index(op.f("ix_jobs_tenant_created_at"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_status_created_at"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_batch_id_status"), table_name="jobs")
    op.drop_table("jobs")
    op.drop_index(op.f("ix_batches_tenant_created_at"), table_name="batches")
    op.drop_table("batches")
