"""specq.storage on SQLite (a temp file) and on the real PostgreSQL server (a throwaway database)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from datetime import timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import event, inspect, select, text, update
from sqlalchemy.exc import IntegrityError

from specq.contracts import Fenced
from specq.engine.result import RunResult
from specq.storage import batches, db, jobs, results, stats
from specq.storage.errors import InputTooLarge
from specq.storage.models import Base, Job, PhaseTiming, Result, utcnow

PG_ADMIN_URL = os.environ.get("SPECQ_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parents[1]
TABLES = {"jobs", "job_inputs", "results", "phase_timings", "batches"}


def _pg_admin():
    psycopg = pytest.importorskip("psycopg")
    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:  # pragma: no cover - the server runs in CI and dev boxes
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_URL}: {e}")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    """An empty database URL: a fresh SQLite file, or a fresh database on the PostgreSQL server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'specq.sqlite'}"
        db.dispose_engines()
        return
    admin = _pg_admin()
    name = f"specq_test_{secrets.token_hex(6)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = PG_ADMIN_URL.rsplit("/", 1)[0]
        yield f"{base}/{name}"
    finally:
        db.dispose_engines()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def s(url):
    """A session on an upgraded database."""
    db.upgrade(url)
    with db.session(url) as session:
        yield session


def _result(**timings) -> dict:
    r = RunResult(text="the answer", finish_reason="stop")
    r.usage.prompt_tokens, r.usage.kept_tokens, r.usage.completion_tokens = 1000, 300, 12
    r.timings_ms.update(timings)
    r.spec.mode = "specprefill"
    return r.to_dict()


# --- schema --------------------------------------------------------------------------------


def test_upgrade_from_empty_creates_all_tables(url):
    assert db.current_revision(url) is None
    rev = db.upgrade(url)
    assert rev == db.head_revision()
    names = set(inspect(db.get_engine(url)).get_table_names())
    assert TABLES <= names and {"api_keys", "alembic_version"} <= names
    assert db.upgrade(url) == rev  # idempotent


def test_api_keys_migration_goes_down_and_up(url):
    """0002 (api_keys) on top of 0001: downgrade drops only its table, upgrade brings it back."""
    from alembic import command

    assert db.upgrade(url, "0002") == "0002"
    cfg = db.alembic_config(url)
    with db.get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0001")
    names = set(inspect(db.get_engine(url)).get_table_names())
    assert "api_keys" not in names and TABLES <= names
    assert db.upgrade(url, "0002") == "0002"
    assert "api_keys" in set(inspect(db.get_engine(url)).get_table_names())


def test_migrations_match_models(url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    db.upgrade(url)
    with db.get_engine(url).connect() as conn:
        opts = {"compare_type": True, "compare_server_default": conn.dialect.name == "postgresql"}
        diff = compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata)
    assert diff == []


def test_url_helpers(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECQ_DATABASE_URL", raising=False)
    monkeypatch.setenv("SPECQ_HOME", str(tmp_path / "home"))
    assert db.database_url() == f"sqlite:///{tmp_path / 'home' / 'specq.sqlite'}"
    monkeypatch.setenv("SPECQ_DATABASE_URL", "postgresql://u:secret@h:5432/d")
    assert db.normalize_url().drivername == "postgresql+psycopg"
    assert "secret" not in db.masked_url() and "***" in db.masked_url()
    assert db.normalize_url("postgres://u@h/d").drivername == "postgresql+psycopg"


def test_sqlite_pragmas(tmp_path):
    url = f"sqlite:///{tmp_path / 'sub' / 'x.sqlite'}"  # parent folder is created
    try:
        with db.get_engine(url).connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == db.SQLITE_BUSY_TIMEOUT_MS
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        db.dispose_engines()


def test_upgrade_from_another_cwd_and_cli(tmp_path):
    """`specq db upgrade` finds migrations/ through the package, not the cwd."""
    dbfile = tmp_path / "cli.sqlite"
    env = {**os.environ, "SPECQ_DATABASE_URL": f"sqlite:///{dbfile}", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "specq.cli", "db", "upgrade"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"revision: {db.head_revision()}" in out.stdout and str(dbfile) in out.stdout
    from typer.testing import CliRunner

    from specq.cli import app

    # the password never shows, even when the connection fails
    res = CliRunner().invoke(app, ["db", "upgrade", "--url", "postgresql://postgres:hunter2@127.0.0.1:1/x"])
    assert res.exit_code == 1 and "hunter2" not in res.output and "***" in res.output


# --- jobs ----------------------------------------------------------------------------------


def test_lifecycle_create_claim_progress_save(s):
    job = jobs.create_job(s, text="doc " * 100, params={"question": "q?", "mode": "specprefill"}, filename="a.txt")
    assert job.id.startswith("job_") and job.status == "queued" and job.tenant == "default"
    assert job.created_at.tzinfo is not None
    inp = jobs.get_input(s, job.id)
    assert inp.question == "q?" and inp.size_bytes == 400 and inp.filename == "a.txt"

    tok = jobs.mark_running(s, job.id, "host:1")
    assert isinstance(tok, str) and len(tok) == 16
    j = jobs.get_job(s, job.id)
    assert j.status == "running" and j.attempts == 1 and j.worker == "host:1" and j.attempt_token == tok
    assert j.started_at.tzinfo == timezone.utc and j.queue_wait_ms is not None and j.queue_wait_ms >= 0
    assert jobs.mark_running(s, job.id, "host:2") is None  # already claimed (fresh heartbeat)

    assert jobs.update_progress(s, job.id, "score", 3, 10, token=tok) is True
    j = jobs.get_job(s, job.id)
    assert (j.progress_phase, j.progress_done, j.progress_total) == ("score", 3, 10)
    assert j.heartbeat_at >= j.started_at

    d = _result(tokenize=1.5, score=20.0, decode=100.25, custom_phase=7.0)
    assert results.save_result(s, job.id, d, token=tok) is True
    j = jobs.get_job(s, job.id)
    assert j.status == "succeeded" and j.finished_at is not None and j.error is None
    timings = dict(s.execute(select(PhaseTiming.phase, PhaseTiming.ms).where(PhaseTiming.job_id == job.id)).all())
    s.commit()
    assert timings == d["timings_ms"] and timings["custom_phase"] == 7.0
    got = results.get_result(s, job.id)
    assert got == d  # round trip in RunResult.to_dict() shape
    assert list(got["timings_ms"])[:7] == ["tokenize", "score", "select", "sparse_prefill", "ttft", "decode", "total"]

    # idempotent: this attempt's second save (a write repeated after a lost acknowledgement) does
    # nothing; any other attempt's is refused
    assert results.save_result(s, job.id, _result(decode=1.0), token=tok) is False
    with pytest.raises(Fenced):
        results.save_result(s, job.id, _result(decode=1.0), token="0" * 16)
    assert s.scalar(select(Result.job_id).where(Result.job_id == job.id)) == job.id
    n = s.execute(select(Result).where(Result.job_id == job.id)).all()
    assert len(n) == 1 and results.get_result(s, job.id)["timings_ms"]["decode"] == 100.25
    # a succeeded job is never claimed again, failed or requeued
    assert jobs.mark_running(s, job.id, "host:3", stale_after_s=0) is None
    assert jobs.mark_failed(s, job.id, "late") is False
    with pytest.raises(Fenced):
        jobs.mark_failed(s, job.id, "late", token=tok)
    with pytest.raises(Fenced):
        jobs.requeue(s, job.id, token=tok)
    assert jobs.get_job(s, job.id).status == "succeeded"


def test_save_result_is_one_transaction(s, url):
    job = jobs.create_job(s, text="doc")
    tok = jobs.mark_running(s, job.id, "w")
    engine = db.get_engine(url)

    def boom(conn, cursor, statement, params, context, executemany):
        if "INSERT INTO phase_timings" in statement:
            raise RuntimeError("disk full")

    event.listen(engine, "before_cursor_execute", boom)
    try:
        with pytest.raises(RuntimeError):
            results.save_result(s, job.id, _result(), token=tok)
    finally:
        event.remove(engine, "before_cursor_execute", boom)
    # nothing of it stayed: no result row, job still running, no timings
    assert results.get_result(s, job.id) is None
    assert results.get_timings(s, job.id) == {}
    assert jobs.get_job(s, job.id).status == "running"
    assert results.save_result(s, job.id, _result(), token=tok) is True


def test_save_result_race_loses_cleanly(url, s):
    """Two sessions save the same job: exactly one wins, one result row."""
    job = jobs.create_job(s, text="doc")
    tok = jobs.mark_running(s, job.id, "w")
    with db.session(url) as other:
        assert results.save_result(other, job.id, _result(decode=1.0), token=tok) is True
    assert results.save_result(s, job.id, _result(decode=2.0), token=tok) is False
    assert s.execute(select(text("count(*)")).select_from(Result)).scalar() == 1
    s.commit()


def test_claim_only_runnable_and_redelivery(s):
    job = jobs.create_job(s, text="doc", max_attempts=2)
    assert jobs.mark_running(s, "job_missing", "w") is None
    t1 = jobs.mark_running(s, job.id, "w1")
    assert t1
    first_wait = jobs.get_job(s, job.id).queue_wait_ms
    # the worker died: an old heartbeat lets a redelivered task claim it again
    s.execute(update(Job).where(Job.id == job.id).values(heartbeat_at=utcnow() - timedelta(hours=1)))
    s.commit()
    assert jobs.mark_running(s, job.id, "w2", stale_after_s=None) is None
    t2 = jobs.mark_running(s, job.id, "w2")
    assert t2 and t2 != t1
    j = jobs.get_job(s, job.id)
    assert j.attempts == 2 and j.worker == "w2" and j.queue_wait_ms == first_wait
    with pytest.raises(Fenced):  # the first claim's holder is fenced from now on
        jobs.heartbeat(s, job.id, token=t1)
    # attempts used up: neither a stale re-claim nor a requeue
    s.execute(update(Job).where(Job.id == job.id).values(heartbeat_at=utcnow() - timedelta(hours=1)))
    s.commit()
    assert jobs.mark_running(s, job.id, "w3") is None
    assert jobs.requeue(s, job.id, "boom", token=t2) is False
    assert jobs.mark_failed(s, job.id, "boom " * 2000, token=t2) is True
    j = jobs.get_job(s, job.id)
    assert j.status == "failed" and len(j.error) <= jobs.MAX_ERROR_CHARS and j.finished_at is not None
    assert jobs.mark_failed(s, job.id, "again", token=t2) is False  # repeated: already done
    assert jobs.mark_running(s, job.id, "w4") is None


def test_requeue_for_retry(s):
    job = jobs.create_job(s, text="doc", max_attempts=3)
    tok = jobs.mark_running(s, job.id, "w")
    jobs.update_progress(s, job.id, "decode", 5, 9, token=tok)
    assert jobs.requeue(s, job.id, "DecodeError: -3", token=tok) is True
    j = jobs.get_job(s, job.id)
    assert j.status == "queued" and j.attempts == 1 and j.progress_phase is None and j.worker is None
    assert j.error == "DecodeError: -3"
    assert jobs.requeue(s, job.id, "DecodeError: -3", token=tok) is True  # repeated: already done
    with pytest.raises(Fenced):  # not running
        jobs.update_progress(s, job.id, "decode", 1, 1, token=tok)
    assert jobs.mark_running(s, job.id, "w") and jobs.get_job(s, job.id).attempts == 2


def test_cancel_queued_and_running(s):
    queued = jobs.create_job(s, text="doc")
    j = jobs.request_cancel(s, queued.id)
    assert j.status == "cancelled" and j.finished_at is not None
    assert jobs.is_cancel_requested(s, queued.id) is True
    assert jobs.mark_running(s, queued.id, "w") is None
    with pytest.raises(Fenced):
        results.save_result(s, queued.id, _result(), token="0" * 16)

    running = jobs.create_job(s, text="doc")
    tok = jobs.mark_running(s, running.id, "w")
    assert jobs.is_cancel_requested(s, running.id) is False
    j = jobs.request_cancel(s, running.id)
    assert j.status == "running" and j.cancel_requested is True
    assert jobs.is_cancel_requested(s, running.id) is True
    assert jobs.requeue(s, running.id, token=tok) is False  # a cancelled job is not retried
    assert jobs.mark_cancelled(s, running.id, token=tok) is True
    assert jobs.get_job(s, running.id).status == "cancelled"

    assert jobs.request_cancel(s, "job_nope") is None
    assert jobs.is_cancel_requested(s, "job_nope") is True


def test_tenant_filter_and_listing(s):
    a1 = jobs.create_job(s, text="a1", tenant="acme")
    a2 = jobs.create_job(s, text="a2", tenant="acme")
    b1 = jobs.create_job(s, text="b1", tenant="bolt")
    d1 = jobs.create_job(s, text="d1")
    assert jobs.get_job(s, a1.id, tenant="acme").id == a1.id
    assert jobs.get_job(s, a1.id, tenant="bolt") is None
    assert jobs.get_input(s, a1.id, tenant="bolt") is None
    assert jobs.request_cancel(s, a1.id, tenant="bolt") is None
    assert jobs.get_job(s, a1.id).status == "queued"
    assert [j.id for j in jobs.list_jobs(s, tenant="acme")] == [a2.id, a1.id]  # newest first
    assert [j.id for j in jobs.list_jobs(s, tenant="acme", limit=1, offset=1)] == [a1.id]
    assert {j.id for j in jobs.list_jobs(s)} == {a1.id, a2.id, b1.id, d1.id}
    assert jobs.mark_running(s, b1.id, "w")
    assert [j.id for j in jobs.list_jobs(s, status="running")] == [b1.id]
    assert {j.id for j in jobs.list_jobs(s, status=["queued"], tenant="default")} == {d1.id}
    assert jobs.count_jobs(s, status="queued") == 3 and jobs.count_jobs(s, tenant="bolt") == 1
    assert jobs.get_job(s, d1.id).to_dict()["tenant"] == "default"


def test_input_limit(s, monkeypatch):
    monkeypatch.setenv("SPECQ_MAX_INPUT_BYTES", "10")
    with pytest.raises(InputTooLarge, match="over the limit of 10 bytes"):
        jobs.create_job(s, text="é" * 6)  # 12 bytes
    assert jobs.create_job(s, text="é" * 5).status == "queued"
    assert jobs.create_job(s, text="x" * 50, limit_bytes=100).status == "queued"
    assert jobs.count_jobs(s) == 2


@pytest.mark.parametrize("url", ["postgresql"], indirect=True)
def test_a_batch_cancel_never_deadlocks_with_claims(url, s):
    """A worker's claim writes its job row twice in one transaction (jobs.mark_running: the claim, then
    queue_wait_ms), and PostgreSQL checks a row's foreign key again when the row was written earlier in
    the same transaction: FOR KEY SHARE on the job's batch row. A cancel holding the batch row and
    waiting for that job must not block the check: with FOR UPDATE on the batch the two deadlocked and
    the cancel's request got a 500 (storage/batches.py, "The batch row's lock"). The interleaving is
    forced: the claim's first write, the cancel blocked behind it, the claim's second write."""
    import threading
    import time

    b = batches.create_batch(s, tenant="t", endpoint="/v1/chat/completions")
    ids = [jobs.create_job(s, text=f"doc {i}", tenant="t", batch_id=b.id, custom_id=f"r{i}").id for i in range(3)]
    assert batches.set_batch_status(s, b.id, "in_progress")
    outcome: dict = {}
    with db.session(url) as claim, db.session(url) as canceller, _pg_admin() as admin:
        claim.execute(update(Job).where(Job.id == ids[0]).values(status="running", worker="w"))  # the row is locked

        def cancel():
            try:
                outcome["batch"] = batches.cancel_batch(canceller, b.id).status
            except Exception as e:  # noqa: BLE001 - the assertion below shows it
                outcome["error"] = e

        t = threading.Thread(target=cancel)
        t.start()
        deadline = time.monotonic() + 20
        while not admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                                (url.rsplit("/", 1)[1],)).fetchone()[0]:
            assert time.monotonic() < deadline and t.is_alive(), outcome  # the cancel waits for the claimed row
            time.sleep(0.05)
        claim.execute(update(Job).where(Job.id == ids[0]).values(queue_wait_ms=1.0))  # the FK check runs here
        claim.commit()
        t.join(30)
    assert not t.is_alive() and "error" not in outcome, outcome
    assert outcome["batch"] == "cancelling"  # the claimed job still runs; the queued ones are cancelled
    assert [jobs.get_job(s, i).status for i in ids] == ["running", "cancelled", "cancelled"]
    assert jobs.get_job(s, ids[0]).cancel_requested


def test_batches_and_phase_stats(s):
    b = batches.create_batch(s, tenant="acme", endpoint="/v1/jobs", metadata={"run": "nightly"})
    assert b.id.startswith("batch_") and b.status == "validating"
    ids = []
    values = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]
    for i, v in enumerate(values):
        job = jobs.create_job(s, text=f"doc {i}", tenant="acme", batch_id=b.id, custom_id=f"req-{i}")
        ids.append(job.id)
        tok = jobs.mark_running(s, job.id, "w")
        assert results.save_result(s, job.id, _result(decode=v, score=1.0), token=tok)
    with pytest.raises(IntegrityError):
        jobs.create_job(s, text="dup", tenant="acme", batch_id=b.id, custom_id="req-0")
    with pytest.raises(IntegrityError):
        jobs.create_job(s, text="orphan", batch_id="batch_missing")
    other = jobs.create_job(s, text="other", tenant="acme")
    tok = jobs.mark_running(s, other.id, "w")
    results.save_result(s, other.id, _result(decode=1_000_000.0), token=tok)

    st = stats.phase_stats(s, batch_id=b.id)
    assert st["decode"]["count"] == 10
    assert st["decode"]["p50"] == pytest.approx(55.0)  # percentile_cont: halfway between 50 and 60
    assert st["decode"]["p95"] == pytest.approx(95.5)  # rank 8.55 -> 90 + 0.55 * 10
    assert st["decode"]["mean"] == pytest.approx(55.0)
    assert (st["decode"]["min"], st["decode"]["max"]) == (10.0, 100.0)
    assert st["score"]["p50"] == pytest.approx(1.0) and st["total"]["count"] == 10
    st = stats.phase_stats(s, ids[:3], phases=["decode"])
    assert list(st) == ["decode"] and st["decode"]["p50"] == pytest.approx(20.0)
    assert st["decode"]["p95"] == pytest.approx(29.0)
    assert stats.phase_stats(s, []) == {}
    assert stats.phase_stats(s, tenant="acme")["decode"]["count"] == 11
    assert stats.phase_stats(s, batch_id=b.id, tenant="bolt") == {}
    assert stats.percentile_cont([5.0], 0.95) == 5.0

    assert jobs.count_jobs(s, batch_id=b.id) == 10
    jobs.mark_failed(s, ids[0], "x")  # already succeeded: no change
    assert batches.refresh_request_counts(s, b.id) == {"total": 10, "completed": 10, "failed": 0}
    assert batches.set_batch_status(s, b.id, "completed") is False  # not from validating
    assert batches.set_batch_status(s, b.id, "in_progress") is True
    assert batches.set_batch_status(s, b.id, "finalizing") is True
    assert batches.set_batch_status(s, b.id, "completed") is True
    got = batches.get_batch(s, b.id, tenant="acme")
    d = got.to_dict()
    assert d["status"] == "completed" and d["request_counts"]["completed"] == 10
    assert d["metadata"] == {"run": "nightly"} and d["in_progress_at"] and d["completed_at"]
    assert batches.get_batch(s, b.id, tenant="bolt") is None
    assert [x.id for x in batches.list_batches(s, tenant="acme")] == [b.id]


def test_concurrent_claims_each_job_once(url, s):
    """Four workers race for the same jobs: every job is claimed exactly once, no lock errors."""
    import threading

    ids = [jobs.create_job(s, text=f"doc {i}").id for i in range(12)]
    wins: list[tuple[str, str]] = []
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with db.session(url) as ws:
                for job_id in ids:
                    tok = jobs.mark_running(ws, job_id, name)
                    if tok:
                        jobs.update_progress(ws, job_id, "decode", 1, 1, token=tok)
                        assert results.save_result(ws, job_id, _result(decode=1.0), token=tok)
                        wins.append((job_id, name))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(j for j, _ in wins) == sorted(ids)
    assert jobs.count_jobs(s, status="succeeded") == 12
    assert all(j.attempts == 1 for j in jobs.list_jobs(s))
