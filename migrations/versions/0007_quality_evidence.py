"""quality_evidence: mode auto's evidence rows written through POST /v1/evidence (issue 47)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06

One row per measurement: the EvidenceKey's fields as columns (engine/policy/evidence_key.py), metric, arm,
length, document token range, n, per-document counts (JSON), the bound's method and value, pass,
in_sample (+ why), source, provenance (JSON), created_at, a disabled reason, and `revision` (grows with
every write: workers reload the rows when its maximum changes). The shipped rows are not stored here
(specq/engine/policy/evidence_rows.json). Downgrade drops the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    s = sa.String
    op.create_table(
        "quality_evidence",
        sa.Column("id", s(length=40), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("target_sha256", s(length=64), nullable=False),
        sa.Column("speculator_sha256", s(length=64), nullable=False),
        sa.Column("backend", s(length=16), nullable=False),
        sa.Column("prompt_shape", s(length=16), nullable=False),
        sa.Column("task", s(length=64), nullable=True),
        sa.Column("positions", s(length=16), nullable=False),
        sa.Column("score_math", s(length=16), nullable=False),
        sa.Column("scorer", s(length=16), nullable=False),
        sa.Column("window", sa.Integer(), nullable=False),
        sa.Column("chunk_rule", s(length=16), nullable=False),
        sa.Column("keep", sa.Float(), nullable=False),
        sa.Column("max_keep", sa.Integer(), nullable=False),
        sa.Column("chunk", sa.Integer(), nullable=False),
        sa.Column("lookahead", sa.Integer(), nullable=False),
        sa.Column("pool", sa.Integer(), nullable=False),
        sa.Column("selection", s(length=16), nullable=False),
        sa.Column("pipelined", sa.Boolean(), nullable=False),
        sa.Column("protect_tail", sa.Integer(), nullable=False),
        sa.Column("target", s(length=255), nullable=False),
        sa.Column("speculator", s(length=255), nullable=False),
        sa.Column("metric", s(length=32), nullable=False),
        sa.Column("arm", s(length=16), nullable=False),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("doc_tokens_min", sa.Integer(), nullable=False),
        sa.Column("doc_tokens_max", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("documents", JSON, nullable=False),
        sa.Column("bound_method", s(length=64), nullable=False),
        sa.Column("bound", sa.Float(), nullable=False),
        sa.Column("passes", sa.Boolean(), nullable=False),
        sa.Column("in_sample", sa.Boolean(), nullable=False),
        sa.Column("in_sample_why", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("provenance", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("disabled", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quality_evidence")),
    )
    op.create_index(op.f("ix_quality_evidence_revision"), "quality_evidence", ["revision"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_quality_evidence_revision"), table_name="quality_evidence")
    op.drop_table("quality_evidence")
