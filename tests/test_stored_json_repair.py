"""Rows that earlier API versions accepted must never break a read: migration 0003 repairs them, and
the reads are defensive for any that remain. On SQLite and on PostgreSQL.

The test writes such rows as the old code did (raw SQL on a database at revision 0002: metadata
nested 300 and 3,000 levels deep, with NaN and Infinity — SQLite only, PostgreSQL's JSONB refuses
them —, 40 pairs, long keys and values, non-string values; batch params with unknown and deep keys;
job params holding the question), upgrades to the newest revision, and checks the rows are in the
shape the API now accepts. Then it writes the same rows again (an old API process still running while
the migration ran) and reads everything through a real `specq api`: every list and get answers 200
with bodies that fit the response schemas.
"""

from __future__ import annotations

import json
import os
import secrets

import httpx
import pytest
from pydantic import TypeAdapter
from sqlalchemy import text

from service_helpers import Stack, free_port, pg_database, pg_reachable, running
from specq.api import schemas as S
from specq.storage import db


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'specq.sqlite'}"
        db.dispose_engines()
        return
    reason = pg_reachable()
    if reason:
        pytest.skip(reason)
    with pg_database() as pg_url:
        yield pg_url


def _deep(n: int) -> str:
    return "[" * n + "1" + "]" * n


def _bad_rows(pg: bool) -> dict[str, tuple[str, str]]:
    """batch id -> (metadata JSON text, params JSON text), as older API versions stored them."""
    many = {f"k{i}": i if i % 3 else {"nested": [i]} for i in range(40)}
    many["x" * 100] = "v" * 2000
    rows = {
        "batch_deep300": ('{"a": %s, "name": "deep"}' % _deep(300), '{"max_tokens": 3}'),
        "batch_deep3000": ('{"a": %s}' % _deep(3000), '{"max_tokens": 3}'),
        "batch_many": (json.dumps(many), '{"bogus": {"deep": %s}, "max_tokens": 2, "pool": 13}' % _deep(50)),
        "batch_list": ("[1, 2, 3]", "[]"),
        "batch_fine": ('{"name": "fine", "team": "qa"}', '{"max_tokens": 4}'),
    }
    if not pg:
        rows["batch_nan"] = ('{"x": NaN, "y": Infinity, "z": -Infinity}', '{"keep": NaN, "max_tokens": 2}')
    return rows


def _insert(conn, pg: bool, suffix: str = "") -> list[str]:
    cast = (lambda p: f"CAST(:{p} AS jsonb)") if pg else (lambda p: f":{p}")
    ids = []
    for batch_id, (metadata, params) in _bad_rows(pg).items():
        conn.execute(text(f"INSERT INTO batches (id, tenant, status, params, metadata, request_total, request_completed, "
                          f"request_failed, created_at, failed_at) VALUES (:id, 'default', 'failed', {cast('p')}, "
                          f"{cast('m')}, 0, 0, 0, :t, :t)"),
                     {"id": batch_id + suffix, "p": params, "m": metadata, "t": "2026-11-30 12:00:00"})
        ids.append(batch_id + suffix)
    job_id = "job_" + secrets.token_hex(12)
    conn.execute(text(f"INSERT INTO jobs (id, tenant, status, progress_done, progress_total, attempts, max_attempts, "
                      f"created_at, params, cancel_requested) VALUES (:id, 'default', 'queued', 0, 0, 0, 3, :t, "
                      f"{cast('p')}, false)"),
                 {"id": job_id, "t": "2026-11-30 12:00:00", "p": json.dumps({"question": "what is x?", "max_tokens": 3})})
    conn.execute(text("INSERT INTO job_inputs (job_id, filename, text, question, size_bytes) "
                      "VALUES (:id, 'a.py', 'x = 1', 'what is x?', 5)"), {"id": job_id})
    ids.append(job_id)
    return ids


METADATA = TypeAdapter(S.Metadata)


def test_migration_repairs_old_rows_and_reads_stay_defensive(url, tmp_path):
    pg = url.startswith("postgresql")
    assert db.upgrade(url, "0002") == "0002"
    with db.get_engine(url).begin() as conn:
        *batch_ids, job_id = _insert(conn, pg)
    assert db.upgrade(url) == db.head_revision()

    with db.get_engine(url).connect() as conn:
        cast = "CAST({} AS TEXT)"
        stored = {r[0]: (r[1], r[2]) for r in conn.execute(text(
            f"SELECT id, {cast.format('metadata')}, {cast.format('params')} FROM batches"))}
        job_params = conn.execute(text(f"SELECT {cast.format('params')} FROM jobs WHERE id = :id"), {"id": job_id}).scalar()
    for batch_id in batch_ids:
        metadata, params = (json.loads(x) if x is not None else None for x in stored[batch_id])
        METADATA.validate_python(metadata)  # the shape the API accepts now: <= 16 string pairs, bounded
        assert all(isinstance(v, (str, int, float, bool)) for v in params.values()), (batch_id, params)
    assert json.loads(stored["batch_fine"][0]) == {"name": "fine", "team": "qa"}  # valid rows untouched
    deep = json.loads(stored["batch_deep300"][0])
    assert deep["name"] == "deep" and deep["a"].startswith("[[[") and len(deep["a"]) <= 512
    assert json.loads(stored["batch_deep3000"][0])["reason"] == "RecursionError"
    assert len(json.loads(stored["batch_many"][0])) == 16 and json.loads(stored["batch_many"][1]) == {
        "max_tokens": 2, "pool": 13}
    assert json.loads(stored["batch_list"][0]) == {"value": "[1, 2, 3]"}
    if not pg:
        assert json.loads(stored["batch_nan"][0]) == {"x": "NaN", "y": "Infinity", "z": "-Infinity"}
        assert json.loads(stored["batch_nan"][1]) == {"max_tokens": 2}
    assert json.loads(job_params) == {"max_tokens": 3}

    # the same rows again, after the migration: the reads must cope with them as they are
    with db.get_engine(url).begin() as conn:
        *again, job_again = _insert(conn, pg, suffix="_again")
    db.dispose_engines()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(SPECQ_HOME=str(tmp_path), SPECQ_DATABASE_URL=url, SPECQ_API_PORT=str(port), PYTHONUNBUFFERED="1")
    with running(Stack(env=env, port=port, logdir=tmp_path), ("api", "api")) as st, \
            httpx.Client(base_url=st.url, timeout=30) as c:
        page = c.get("/v1/batches", params={"limit": 100})
        assert page.status_code == 200, page.text
        listed = S.BatchList.model_validate(page.json())
        assert {b.id for b in listed.data} == set(batch_ids) | set(again)
        for batch_id in batch_ids + again:
            r = c.get(f"/v1/batches/{batch_id}")
            assert r.status_code == 200, (batch_id, r.text)
            METADATA.validate_python(r.json()["metadata"])
        assert c.get("/v1/batches", params={"name": "deep"}).status_code == 200
        for jid in (job_id, job_again):
            r = c.get(f"/v1/jobs/{jid}")
            assert r.status_code == 200 and r.json()["input"]["question"] == "what is x?", r.text
        jobs_page = c.get("/v1/jobs")
        assert jobs_page.status_code == 200
        assert all("question" not in j["params"] for j in jobs_page.json()["data"])
        assert "Traceback" not in st.log("api")
