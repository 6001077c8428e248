"""quality_evidence.certified: rows that certify a keep chosen on other documents (issue 48 item 2)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06

`specq calibrate --keep a,b,…` splits each length band's documents by content hash into a choosing half and a
certifying half: the smallest keep whose rows pass on the choosing half is measured on the certifying half, and
those rows are `certified` (the choosing half's are `in_sample`). A job that sets no keep runs the keep of its
band's certified rows (engine/policy/evidence.certified_keep). Existing rows get false (none was certified).
Downgrade drops the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # plain ADD/DROP COLUMN (no batch mode), as 0005 does
    op.add_column("quality_evidence", sa.Column("certified", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("quality_evidence", "certified")
