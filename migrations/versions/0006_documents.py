"""documents: stored once, asked about by many jobs

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

* documents: id, tenant, sha256 of the text (unique per tenant: the same text of one tenant is one
  document), filename, text, size_bytes, created_at;
* job_inputs.document_id: the document a job asks about (its `text` is then empty); SET NULL when the
  document is deleted after the job finished.

Downgrade drops both (jobs that referenced a document keep an empty text).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "documents",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_documents")),
        sa.UniqueConstraint("tenant", "sha256", name=op.f("uq_documents_tenant_sha256")),
    )
    op.create_index(op.f("ix_documents_tenant_created_at"), "documents", ["tenant", "created_at"], unique=False)
    if op.get_bind().dialect.name == "sqlite":
        # SQLite adds no constraint to an existing table: job_inputs is recreated (batch mode), which is
        # safe for it (unlike `jobs`, see 0004): no table references job_inputs, nothing cascades
        with op.batch_alter_table("job_inputs") as batch:
            batch.add_column(sa.Column("document_id", sa.String(length=40), nullable=True))
            batch.create_foreign_key(op.f("fk_job_inputs_document_id_documents"), "documents", ["document_id"], ["id"],
                                     ondelete="SET NULL")
    else:
        op.add_column("job_inputs", sa.Column("document_id", sa.String(length=40), nullable=True))
        op.create_foreign_key(op.f("fk_job_inputs_document_id_documents"), "job_inputs", "documents",
                              ["document_id"], ["id"], ondelete="SET NULL")
    op.create_index(op.f("ix_job_inputs_document_id"), "job_inputs", ["document_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_job_inputs_document_id"), table_name="job_inputs")
    if op.get_bind().dialect.name == "sqlite":  # SQLite refuses DROP COLUMN of a foreign key's column
        with op.batch_alter_table("job_inputs") as batch:  # nothing references job_inputs: safe to recreate
            batch.drop_column("document_id")
    else:
        op.drop_constraint(op.f("fk_job_inputs_document_id_documents"), "job_inputs", type_="foreignkey")
        op.drop_column("job_inputs", "document_id")
    op.drop_index(op.f("ix_documents_tenant_created_at"), table_name="documents")
    op.drop_table("documents")
