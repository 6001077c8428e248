"""the OpenAI surface: chat/completion jobs, claim order, event deltas, files, batch files

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

* jobs: `kind` (job, chat, completion), `model` (the name an OpenAI request gave), `priority`
  (0 interactive, 1 batch requests: existing batch jobs get 1), `queue` (the broker queue it was sent
  to; NULL for existing rows: claimable from any queue), `not_before` (retry backoff), and the index
  claims use (status, queue, priority, tenant, created_at);
* job_inputs.messages: a chat job's messages;
* job_deltas: answer text of running jobs for event streams on the embedded default;
* claim_turns: when each tenant was last served from each queue (fair claims);
* files + file_chunks: the Files API and batches' output/error files;
* batches: input_file_id, output_file_id, error_file_id, expire_requested.

Batch metadata was already limited to 16 string pairs by 0003. Downgrade drops all of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(sa.dialects.postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    # plain ADD COLUMN (no batch mode): SQLite recreating `jobs` would cascade-delete job_inputs,
    # results and timings through their foreign keys
    op.add_column("jobs", sa.Column("kind", sa.String(length=16), server_default="job", nullable=False))
    op.add_column("jobs", sa.Column("model", sa.String(length=255), nullable=True))
    op.add_column("jobs", sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False))
    op.add_column("jobs", sa.Column("queue", sa.String(length=64), nullable=True))
    op.add_column("jobs", sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))
    if op.get_bind().dialect.name != "sqlite":  # SQLite cannot add a CHECK to an existing table
        op.create_check_constraint("kind", "jobs", "kind IN ('job', 'chat', 'completion')")
    op.execute("UPDATE jobs SET priority = 1 WHERE batch_id IS NOT NULL")
    op.create_index(op.f("ix_jobs_status_queue_priority_tenant_created_at"), "jobs",
                    ["status", "queue", "priority", "tenant", "created_at"], unique=False)
    op.add_column("job_inputs", sa.Column("messages", JSON, nullable=True))
    op.add_column("batches", sa.Column("input_file_id", sa.String(length=40), nullable=True))
    op.add_column("batches", sa.Column("output_file_id", sa.String(length=40), nullable=True))
    op.add_column("batches", sa.Column("error_file_id", sa.String(length=40), nullable=True))
    op.add_column("batches", sa.Column("expire_requested", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_table(
        "job_deltas",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("offset", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("final", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_deltas_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "attempt", "seq", name=op.f("pk_job_deltas")),
    )
    op.create_table(
        "claim_turns",
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("last_claim_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("queue", "tenant", name=op.f("pk_claim_turns")),
    )
    op.create_table(
        "files",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("batch_id", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"], name=op.f("fk_files_batch_id_batches"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
    )
    op.create_index(op.f("ix_files_tenant_created_at"), "files", ["tenant", "created_at"], unique=False)
    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.String(length=40), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["file_id"], ["files.id"], name=op.f("fk_file_chunks_file_id_files"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("file_id", "seq", name=op.f("pk_file_chunks")),
    )


def downgrade() -> None:
    op.drop_table("file_chunks")
    op.drop_index(op.f("ix_files_tenant_created_at"), table_name="files")
    op.drop_table("files")
    op.drop_table("claim_turns")
    op.drop_table("job_deltas")
    # plain DROP COLUMN (SQLite >= 3.35), for the same reason as in upgrade
    for name in ("expire_requested", "error_file_id", "output_file_id", "input_file_id"):
        op.drop_column("batches", name)
    op.drop_column("job_inputs", "messages")
    op.drop_index(op.f("ix_jobs_status_queue_priority_tenant_created_at"), table_name="jobs")
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("kind", "jobs", type_="check")
    for name in ("not_before", "queue", "priority", "model", "kind"):
        op.drop_column("jobs", name)
