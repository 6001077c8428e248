"""Issue 44, service items 4-9, against a real `specq api` (SPECQ_AUTH=keys, no worker: jobs stay
queued) on the embedded default (SQLite) and on PostgreSQL + Redis. Each test failed before its fix.

4. quotas and lifecycles: a native batch's stored input counts against the file quota, is not kept
   for a batch that fails validation, and goes with DELETE /v1/batches/{id}/data; concurrent uploads
   cannot overrun the quota;
5. digit-like Unicode ('²', '٣') in Last-Event-ID, completion_window and a proxy's Retry-After;
6. races and text the store refuses: a job on a document deleted at the same moment, a lone surrogate
   in an OpenAI batch line's custom_id, model names (one definition: served id, `.gguf` name,
   SPECQ_SERVED_MODEL_NAME; anything else 404 model_not_found; 256 characters a 400);
7. another tenant's file or batch id as `after=` is an unknown cursor;
8. a CSV cell holding a bare CR is quoted;
9. the unfiltered job list reads a page off the (created_at, id) index.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from sqlalchemy import func, select, text

from service_helpers import (REPO, Stack, empty_store, free_port, pg_database, redis_pg_env, require_servers,
                             running, specq_cmd)
from specq.storage import db
from specq.storage.models import Batch, File, Job

FILE_QUOTA = 1_000_000
ALIASES = "my-model,Team Model v2"
DOC = "def f(x):\n    return x + 1\n"


def _env(home, port, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(SPECQ_HOME=str(home), SPECQ_API_PORT=str(port), SPECQ_AUTH="keys",
               SPECQ_MAX_FILE_STORAGE_BYTES=str(FILE_QUOTA), SPECQ_SERVED_MODEL_NAME=ALIASES, PYTHONUNBUFFERED="1",
               **extra)
    return env


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def api(request, tmp_path_factory):
    home = tmp_path_factory.mktemp(f"h44_{request.param}")
    port = free_port()
    if request.param == "sqlite":
        st_ = Stack(env=_env(home, port), port=port, logdir=home)
        db.upgrade(st_.database_url)
        st_.keys = {}
        with running(st_, ("api", "api")):
            yield st_
        return
    require_servers()
    with pg_database() as pg_url:
        st_ = Stack(env=_env(home, port, **redis_pg_env(pg_url, "specq-h44")), port=port, logdir=home)
        db.upgrade(st_.database_url)
        st_.keys = {}
        with running(st_, ("api", "api")):
            yield st_


def _key(api, tenant: str, admin: bool = False) -> str:
    if tenant not in api.keys:
        from specq.storage import keys

        with db.session(api.database_url) as s:
            api.keys[tenant] = keys.create_key(s, tenant, admin=admin)[1]
    return api.keys[tenant]


def _client(api, tenant: str, **kw) -> httpx.Client:
    return httpx.Client(base_url=api.url, timeout=60, headers={"Authorization": f"Bearer {_key(api, tenant, **kw)}"})


def _count(api, model, *where) -> int:
    with db.session(api.database_url) as s:
        return s.scalar(select(func.count()).select_from(model).where(*where))


def _jsonl(lines) -> bytes:
    return "\n".join(json.dumps(x) for x in lines).encode()


def _native_batch(c: httpx.Client, lines) -> httpx.Response:
    return c.post("/v1/batches", content=_jsonl(lines), headers={"content-type": "application/jsonl"})


# --- 4: quotas and lifecycles ---------------------------------------------------------------------------------


def test_a_native_batch_input_counts_against_the_file_quota_and_is_not_kept_when_it_fails(api):
    with _client(api, "quota-a") as c:
        up = c.post("/v1/files", files={"file": ("big.jsonl", b"x" * 700_000)}, data={"purpose": "batch"})
        assert up.status_code == 200, up.text
        lines = [{"custom_id": f"r{i}", "text": DOC + "#" * 40_000, "question": "q"} for i in range(10)]
        before = (_count(api, Batch, Batch.tenant == "quota-a"), _count(api, File, File.tenant == "quota-a"))
        r = _native_batch(c, lines)  # ~400 KB more: over the tenant's 1 MB
        assert r.status_code == 413 and "SPECQ_MAX_FILE_STORAGE_BYTES" in r.json()["error"]["message"], r.text
        assert (_count(api, Batch, Batch.tenant == "quota-a"), _count(api, File, File.tenant == "quota-a")) == before
        # a batch that fails validation stores no input file
        bad = _native_batch(c, [{"custom_id": "ok", "text": DOC}, {"custom_id": "ok", "text": DOC}])
        assert bad.status_code == 200 and bad.json()["status"] == "failed", bad.text
        assert bad.json()["input_file_id"] is None
        assert _count(api, File, File.tenant == "quota-a") == before[1]
        assert [f["id"] for f in c.get("/v1/files").json()["data"]] == [up.json()["id"]]
        # with room again the same batch is stored, its input counted
        assert c.delete(f"/v1/files/{up.json()['id']}").status_code == 200
        ok = _native_batch(c, lines)
        assert ok.status_code == 200 and ok.json()["status"] == "in_progress", ok.text
        listed = c.get("/v1/files").json()["data"]
        assert [f["id"] for f in listed] == [ok.json()["input_file_id"]] and listed[0]["bytes"] == len(_jsonl(lines))
        up2 = c.post("/v1/files", files={"file": ("more.jsonl", b"x" * 700_000)}, data={"purpose": "batch"})
        assert up2.status_code == 413, up2.text


def test_deleting_a_batchs_data_deletes_the_input_file_it_stored(api):
    with _client(api, "lifecycle-a") as c:
        r = _native_batch(c, [{"custom_id": "secret", "text": "TOP SECRET = 1\n", "question": "what is secret?"}])
        assert r.status_code == 200 and r.json()["status"] == "in_progress", r.text
        batch_id, file_id = r.json()["id"], r.json()["input_file_id"]
        assert b"TOP SECRET" in c.get(f"/v1/files/{file_id}/content").content
        assert c.post(f"/v1/batches/{batch_id}/cancel").json()["status"] == "cancelled"
        d = c.delete(f"/v1/batches/{batch_id}/data")
        assert d.status_code == 200, d.text
        assert c.get(f"/v1/files/{file_id}").status_code == 404
        assert c.get(f"/v1/files/{file_id}/content").status_code == 404
        assert file_id not in {f["id"] for f in c.get("/v1/files").json()["data"]}
        assert _count(api, File, File.id == file_id) == 0


def test_concurrent_uploads_cannot_overrun_the_file_quota(api):
    size, n = 150_000, 16
    _key(api, "race-files")
    gate = threading.Barrier(n)
    codes: list[int] = []

    def upload(i: int) -> None:
        with _client(api, "race-files") as c:
            gate.wait()
            codes.append(c.post("/v1/files", files={"file": (f"f{i}.jsonl", b"y" * size)},
                                data={"purpose": "batch"}).status_code)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(set(codes)) == [200, 413], codes
    with db.session(api.database_url) as s:
        stored = s.scalar(select(func.coalesce(func.sum(File.bytes), 0)).where(File.tenant == "race-files"))
    assert codes.count(200) == FILE_QUOTA // size and stored <= FILE_QUOTA, (codes, stored)


# --- 5: digit-like Unicode -------------------------------------------------------------------------------------


def test_digit_like_unicode_is_not_a_number(api):
    with _client(api, "digits") as c:
        job = c.post("/v1/jobs", json={"text": DOC, "question": "q"}).json()
        # headers are Latin-1 on the wire: '²' and '³' are bytes B2 and B3, and str.isdigit() of either is true
        for value in ("²".encode("latin-1"), "1³".encode("latin-1"), "٣".encode(), "1_0", "+5", "99999999999999999999"):
            with c.stream("GET", f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": value}, timeout=10) as r:
                assert r.status_code == 200, (value, r.status_code)
        for window in ("²s", "٣s", "1_0h", "+1h", "٣٠d"):
            r = c.post("/v1/batches", files={"file": ("a.py", DOC.encode())},
                       data={"question": "q", "completion_window": window})
            assert r.status_code == 400 and "completion_window" in r.json()["error"]["message"], (window, r.text)
        assert c.post("/v1/batches", files={"file": ("a.py", DOC.encode())},
                      data={"question": "q", "completion_window": "2h"}).json()["status"] == "in_progress"
        up = c.post("/v1/files", files={"file": ("in.jsonl", b'{"custom_id": "a"}\n')}, data={"purpose": "batch"})
        r = c.post("/v1/batches", json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
                                        "completion_window": "٣s"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "completion_window", r.text
    assert _count(api, Batch, Batch.tenant == "digits") == 1


class _Proxy(BaseHTTPRequestHandler):
    """A proxy that answers every GET 429 with `Retry-After: ²`."""

    def do_GET(self):
        body = b'{"error": {"message": "slow down", "type": "too_many_requests"}}'
        self.send_response(429)
        self.send_header("Retry-After", "²")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_proxys_digit_like_retry_after_is_no_traceback(api):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = dict(api.env, SPECQ_API_URL=f"http://127.0.0.1:{server.server_address[1]}",
                   SPECQ_API_KEY=_key(api, "digits"))
        r = subprocess.run(specq_cmd("jobs"), env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("error: slow down (HTTP 429") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        server.shutdown()
        server.server_close()


# --- 6: races and text the store refuses -------------------------------------------------------------------------


def test_a_job_on_a_document_deleted_at_the_same_moment_is_a_404_or_the_delete_a_409(api):
    outcomes = []
    with _client(api, "doc-race") as c:
        for i in range(40):
            doc = c.post("/v1/documents", json={"text": f"{DOC}# {i}\n"}).json()["id"]
            gate = threading.Barrier(2)
            got: dict[str, httpx.Response] = {}

            def submit():
                with _client(api, "doc-race") as c2:
                    gate.wait()
                    got["job"] = c2.post("/v1/jobs", json={"document_id": doc, "question": "q"})

            def delete():
                with _client(api, "doc-race") as c2:
                    gate.wait()
                    got["delete"] = c2.delete(f"/v1/documents/{doc}")

            threads = [threading.Thread(target=submit), threading.Thread(target=delete)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            pair = (got["job"].status_code, got["delete"].status_code)
            assert pair in ((202, 409), (404, 200)), (i, pair, got["job"].text, got["delete"].text)
            outcomes.append(pair)
    jobs_stored = _count(api, Job, Job.tenant == "doc-race")
    assert jobs_stored == outcomes.count((202, 409)), (jobs_stored, outcomes)


def test_a_lone_surrogate_custom_id_fails_its_line(api):
    with _client(api, "surrogate") as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        raw = (b'{"custom_id": "\\ud800", "method": "POST", "url": "/v1/chat/completions", "body": '
               + json.dumps(body).encode() + b"}\n")
        up = c.post("/v1/files", files={"file": ("in.jsonl", raw)}, data={"purpose": "batch"})
        assert up.status_code == 200, up.text
        r = c.post("/v1/batches", json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
                                        "completion_window": "24h"})
        assert r.status_code == 200 and r.json()["status"] == "failed", r.text
        assert r.json()["errors"]["data"][0]["param"] == "custom_id"
        # the native JSONL refuses it on its line too
        native = c.post("/v1/batches", content=b'{"custom_id": "\\udc80", "text": "x = 1"}',
                        headers={"content-type": "application/jsonl"})
        assert native.status_code == 200 and native.json()["status"] == "failed", native.text
    assert _count(api, Job, Job.tenant == "surrogate") == 0


def test_model_names_are_matched_in_one_place(api):
    with _client(api, "models") as c:
        listed = [m["id"] for m in c.get("/v1/models").json()["data"]]
        served = [m for m in listed if m not in ("my-model", "Team Model v2")]
        assert len(served) == 1 and listed[-2:] == ["my-model", "Team Model v2"], listed
        mid = served[0]
        for alias in ("my-model", "Team Model v2", f"{mid}.gguf"):
            r = c.get(f"/v1/models/{alias}")
            assert r.status_code == 200 and r.json()["id"] in (alias, mid), (alias, r.text)
        before = _count(api, Job)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for bad in (f"gpt-4o/{mid}", f"<img src=x onerror=alert(1)>/{mid}", f"/models/{mid}.gguf", mid.upper(),
                    f" {mid}", "x" * 200 + "/" + mid, "my-model/" + mid, "gpt-4o/my-model", "x" * 255):
            r = c.post("/v1/chat/completions", json={"model": bad, **chat})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", (bad, r.text)
        over = "x" * (255 - len(mid)) + "/" + mid  # 256 characters: the schema's limit is the store's (255)
        r = c.post("/v1/completions", json={"model": over, "prompt": "x", "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
        assert _count(api, Job) == before
        # batch lines: the served names are accepted and echoed as sent; a path ending in the id is not
        lines = [{"custom_id": name, "method": "POST", "url": "/v1/chat/completions", "body": {"model": name, **chat}}
                 for name in (mid, f"{mid}.gguf", "my-model", "Team Model v2")]
        up = c.post("/v1/files", files={"file": ("ok.jsonl", _jsonl(lines))}, data={"purpose": "batch"})
        r = c.post("/v1/batches", json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions"})
        assert r.status_code == 200 and r.json()["status"] == "in_progress", r.text
        with db.session(api.database_url) as s:
            stored = sorted(s.scalars(select(Job.model).where(Job.batch_id == r.json()["id"])))
        assert stored == sorted(["my-model", "Team Model v2", mid, f"{mid}.gguf"])
        bad = [{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"model": f"gpt-4o/{mid}",
                                                                                          **chat}}]
        up = c.post("/v1/files", files={"file": ("bad.jsonl", _jsonl(bad))}, data={"purpose": "batch"})
        r = c.post("/v1/batches", json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions"})
        assert r.status_code == 200 and r.json()["status"] == "failed", r.text
        assert r.json()["errors"]["data"][0]["code"] == "model_not_found"


# --- 7: cursors of other tenants -----------------------------------------------------------------------------------


def test_another_tenants_id_is_an_unknown_cursor(api):
    with _client(api, "cursor-a") as a, _client(api, "cursor-b") as b:
        def upload(c, name):
            time.sleep(0.01)
            return c.post("/v1/files", files={"file": (name, b'{"x": 1}\n')}, data={"purpose": "batch"}).json()["id"]

        def batch(c):
            time.sleep(0.01)
            return _native_batch(c, [{"custom_id": "a", "text": DOC}]).json()["id"]

        def same(path, foreign, unknown, order):
            seen = b.get(path, params={"after": foreign, **order}).json()
            fresh = b.get(path, params={"after": unknown, **order}).json()
            assert seen == fresh, (path, order, seen, fresh)
            return [x["id"] for x in seen["data"]]

        b1 = upload(b, "b1")
        a_file = upload(a, "a1")
        b2 = upload(b, "b2")
        assert same("/v1/files", a_file, "file-" + "0" * 24, {}) == [b2, b1]
        assert same("/v1/files", a_file, "file-" + "0" * 24, {"order": "asc"}) == [b1, b2]
        bb1 = batch(b)
        a_batch = batch(a)
        bb2 = batch(b)
        assert same("/v1/batches", a_batch, "batch_" + "0" * 24, {}) == [bb2, bb1]


# --- 8: CSV ----------------------------------------------------------------------------------------------------------


def test_a_csv_cell_with_a_bare_cr_is_quoted(api):
    from specq.storage import jobs, results

    answer = "x\r=1+1"
    with _client(api, "csv") as c:
        batch = _native_batch(c, [{"custom_id": "r\r=2+2", "text": DOC, "question": "q"}]).json()
        with db.session(api.database_url) as s:
            job_id = s.scalar(select(Job.id).where(Job.batch_id == batch["id"]))
            token = jobs.mark_running(s, job_id, "test-worker")
            results.save_result(s, job_id, {"text": answer, "finish_reason": "stop",
                                            "usage": {"prompt_tokens": 10, "kept_tokens": 5, "completion_tokens": 2},
                                            "timings_ms": {"decode": 1.0}, "spec": {"mode": "baseline"}}, token=token)
        deadline = time.monotonic() + 30
        while c.get(f"/v1/batches/{batch['id']}").json()["status"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        body = c.get(f"/v1/batches/{batch['id']}/results", params={"format": "csv"}).content.decode()
    rows = list(csv.reader(io.StringIO(body, newline="")))  # a reader that, like a spreadsheet, ends rows at a CR
    assert len(rows) == 2, rows
    header, row = rows
    assert row[header.index("answer")] == answer and row[header.index("custom_id")] == "r\r=2+2", row
    assert '"x\r=1+1"' in body


# --- 9: lists cost O(page) ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def test_the_job_list_reads_a_page_off_its_index(backend, tmp_path):
    from sqlalchemy import insert

    from specq.storage import jobs
    from specq.storage.models import utcnow

    with empty_store(backend, tmp_path) as url:
        db.upgrade(url)
        now = utcnow()
        with db.session(url) as s:
            rows = [{"id": f"job_{i:024x}", "tenant": f"t{i % 7}", "kind": "job", "status": "succeeded",
                     "priority": 0, "progress_done": 0, "progress_total": 0, "attempts": 1, "max_attempts": 3,
                     "created_at": now, "params": {}, "cancel_requested": False} for i in range(20_000)]
            s.execute(insert(Job), rows)
            s.commit()
            if backend == "postgresql":
                s.connection().exec_driver_sql("ANALYZE jobs")
                s.commit()
            q = jobs.list_query(limit=50)
            compiled = q.compile(dialect=s.get_bind().dialect, compile_kwargs={"literal_binds": True})
            prefix = "EXPLAIN QUERY PLAN " if backend == "sqlite" else "EXPLAIN "
            plan = "\n".join(" ".join(str(c) for c in r) for r in s.execute(text(prefix + str(compiled))))
            assert "ix_jobs_created_at_id" in plan, plan
            assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan  # no sort of the whole table
            page = jobs.list_jobs(s, limit=50)
            assert [j.id for j in page] == [f"job_{i:024x}" for i in range(19_999, 19_949, -1)]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def test_migration_0008_goes_down_and_up(backend, tmp_path):
    from alembic import command
    from sqlalchemy import inspect

    with empty_store(backend, tmp_path) as url:
        assert db.upgrade(url) == db.head_revision() and db.head_revision() >= "0008"
        assert "ix_jobs_created_at_id" in {i["name"] for i in inspect(db.get_engine(url)).get_indexes("jobs")}
        cfg = db.alembic_config(url)
        with db.get_engine(url).begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0007")
        assert "ix_jobs_created_at_id" not in {i["name"] for i in inspect(db.get_engine(url)).get_indexes("jobs")}
        assert db.upgrade(url, "0008") == "0008"
        assert "ix_jobs_created_at_id" in {i["name"] for i in inspect(db.get_engine(url)).get_indexes("jobs")}


def test_settings_read_ascii_numbers_and_check_served_names():
    from specq.settings import ServiceSettings, SettingsError

    for env in ({"SPECQ_TIME_LIMIT": "٣"}, {"SPECQ_MAX_QUEUED_JOBS": "٣"}, {"SPECQ_SPECULATOR_GPU": "٣"},
                {"SPECQ_SPECULATOR_GPU": "1", "SPECQ_GPU": "²"}, {"SPECQ_RETENTION": "٣d"},
                {"SPECQ_SERVED_MODEL_NAME": "ok,bad\x01name"}, {"SPECQ_SERVED_MODEL_NAME": "x" * 256}):
        with pytest.raises(SettingsError):
            ServiceSettings.from_env(env)
    s = ServiceSettings.from_env({"SPECQ_TIME_LIMIT": "30", "SPECQ_SPECULATOR_GPU": "1", "SPECQ_GPU": "0",
                                  "SPECQ_RETENTION": "3d", "SPECQ_SERVED_MODEL_NAME": " a , b,a "})
    assert s.time_limit == 30 and s.retention_s == 3 * 86400 and s.served_model_name == "a , b,a"  # the environment is stripped
    from specq.served_models import parse_aliases

    assert parse_aliases(s.served_model_name) == ("a", "b")
