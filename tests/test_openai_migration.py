"""Migration 0004 (the OpenAI surface) as an upgrade of a store with data in it, on SQLite and
PostgreSQL: existing jobs become native jobs of the right priority (batch requests 1, others 0) with no
recorded queue (claimable from any queue), batches get null file ids, and 0004 goes down and up again."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from service_helpers import empty_store
from specq.storage import claims, db, jobs
from specq.storage.models import Batch


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path, monkeypatch):
    with empty_store(request.param, tmp_path) as u:
        monkeypatch.setenv("SPECQ_DATABASE_URL", u)
        yield u


def _rows_at_0003(conn) -> None:
    t = "2026-11-30 12:00:00"
    conn.execute(text("INSERT INTO batches (id, tenant, status, params, request_total, request_completed, request_failed, "
                      "created_at, in_progress_at) VALUES ('batch_old', 'default', 'in_progress', '{}', 1, 0, 0, :t, :t)"),
                 {"t": t})
    for job_id, batch in (("job_inbatch", "batch_old"), ("job_alone", None)):
        conn.execute(text("INSERT INTO jobs (id, tenant, batch_id, custom_id, status, progress_done, progress_total, "
                          "attempts, max_attempts, created_at, params, cancel_requested) VALUES (:id, 'default', :b, :c, "
                          "'queued', 0, 0, 0, 3, :t, '{}', false)"), {"id": job_id, "b": batch, "c": "r1" if batch else None,
                                                                      "t": t})
        conn.execute(text("INSERT INTO job_inputs (job_id, filename, text, question, size_bytes) "
                          "VALUES (:id, 'a.py', 'x = 1', 'what?', 5)"), {"id": job_id})


def test_0004_upgrades_a_store_with_data(url):
    from alembic import command

    assert db.upgrade(url, "0003") == "0003"
    with db.get_engine(url).begin() as conn:
        _rows_at_0003(conn)
    assert db.upgrade(url) == db.head_revision()
    with db.get_engine(url).connect() as conn:
        got = {r.id: r for r in conn.execute(text("SELECT id, kind, priority, queue, not_before, model FROM jobs"))}
    assert got["job_inbatch"].kind == got["job_alone"].kind == "job"
    assert (got["job_inbatch"].priority, got["job_alone"].priority) == (1, 0)
    assert all(r.queue is None and r.not_before is None and r.model is None for r in got.values())
    with db.session(url) as s:
        batch = s.get(Batch, "batch_old")
        assert batch.input_file_id is None and batch.output_file_id is None and batch.expire_requested is False
        d = batch.to_dict()
        assert isinstance(d["created_at"], int) and d["output_file_id"] is None
        assert jobs.get_input(s, "job_alone").messages is None
        # rows from before queues were recorded are claimed from any queue, interactive first
        assert claims.claim_next(s, "job_inbatch", "w:1", queue="specq").job_id == "job_alone"
        assert claims.claim_next(s, "job_inbatch", "w:1", queue="other").job_id == "job_inbatch"

    cfg = db.alembic_config(url)
    with db.get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0003")
    with db.get_engine(url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 2
    assert db.upgrade(url) == db.head_revision()
