"""The classes of defects of issue 13 that lived in the API and the job store, one test each, against a
real `specq api` without keys (SPECQ_AUTH=none, the mode the Host/Origin checks protect), on the
embedded default (SQLite) and on PostgreSQL + Redis:

1. nothing is stored when the response would fail (NaN or deeply nested metadata: 422 before storing);
2. stored rows cannot break reads (deep metadata is refused; old rows: tests/test_stored_json_repair.py);
3. every number is bounded (offsets, limits, `params.pool`, seeds: 422);
4. a NUL in the path or query string is a 400, on PostgreSQL too;
5. the question has its own limit, and list rows leave out the large fields;
7. without keys, a foreign `Host` or a cross-origin browser request is refused, nothing stored;
8. 1,000 slow clients do not stop a normal request from answering;
9. `params` of the wrong type is a 422; 405 carries `Allow`; HEAD works wherever GET does;
10. /healthz is liveness only; /readyz (and /health, llama-server's and vLLM's) and /v1/workers read the workers' heartbeats;
plus the data lifecycle (DELETE …/data, SPECQ_RETENTION) and, with hypothesis, that whatever the API
accepts can be listed and read back, and whatever it refuses with a 4xx leaves no row.
(CSV neutralisation: tests/test_batches_e2e.py and test_csv_cells_that_look_like_formulas below.)
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from service_helpers import Stack, api_only, clean_env, free_port, pg_database, redis_pg_env, require_servers, running
from specq.api import schemas as S
from specq.storage import db
from specq.storage.models import Batch, Job, JobInput

MAX_INPUT = 65536
RECEIPT_TIMEOUT = 4


def _env(home, port, **extra):
    return clean_env(home, port, SPECQ_MAX_INPUT_BYTES=str(MAX_INPUT), SPECQ_ALLOWED_HOSTS="specq.internal",
                     SPECQ_RECEIPT_TIMEOUT=str(RECEIPT_TIMEOUT), SPECQ_MAX_CONNECTIONS="200", **extra)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def api(request, tmp_path_factory):
    home = tmp_path_factory.mktemp(f"hardening_{request.param}")
    port = free_port()
    with api_only(request.param, home, port, lambda **extra: _env(home, port, **extra), "specq-hardening") as st_:
        yield st_


@pytest.fixture
def client(api):
    with httpx.Client(base_url=api.url, timeout=30) as c:
        yield c


def _counts(api) -> tuple[int, int, int]:
    with db.session(api.database_url) as s:
        return (s.scalar(select(func.count()).select_from(Job)), s.scalar(select(func.count()).select_from(JobInput)),
                s.scalar(select(func.count()).select_from(Batch)))


def _err(r: httpx.Response, status: int, *needles: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    message = r.json()["error"]["message"]
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def _deep(n: int) -> str:
    return "[" * n + "]" * n


DOC = "def f(x):\n    return x + 1\n"


def _batch_form(**fields):
    return {"files": {"file": ("a.py", DOC.encode())}, "data": fields}


# --- 1, 2: nothing stored when the response could not be built; no row that breaks a read ----------------


def test_metadata_that_older_versions_stored_is_refused_before_storing(api, client):
    before = _counts(api)
    for metadata, needle in [('{"x": NaN}', "metadata"), ('{"x": Infinity}', "metadata"),
                             ('{"x": %s}' % _deep(940), "not valid JSON"), ('{"x": %s}' % _deep(255), "metadata"),
                             ('{"x": {"nested": "object"}}', "metadata.x"), ("[1, 2]", "JSON object"),
                             (json.dumps({f"k{i}": "v" for i in range(17)}), "at most 16"),
                             (json.dumps({"k" * 65: "v"}), "metadata"), (json.dumps({"k": "v" * 513}), "metadata.k")]:
        r = client.post("/v1/batches", **_batch_form(metadata=metadata))
        _err(r, 422, needle)
    r = client.post("/v1/jobs", content=b'{"text": "x = 1", "params": {"keep": NaN}}',
                    headers={"content-type": "application/json"})
    assert r.status_code in (400, 422), r.text
    assert _counts(api) == before
    r = client.post("/v1/batches", **_batch_form(metadata=json.dumps({f"k{i}": "v" * 512 for i in range(16)})))
    assert r.status_code == 200 and len(r.json()["metadata"]) == 16, r.text  # the limits themselves pass
    assert client.get("/v1/batches").status_code == 200


# --- 3: numbers ----------------------------------------------------------------------------------------------


def test_every_number_is_bounded(api, client):
    before = _counts(api)
    for path in ("/v1/jobs", "/v1/batches"):
        _err(client.get(path, params={"offset": 2**63}), 422, "offset")
        _err(client.get(path, params={"offset": -1}), 422, "offset")
        _err(client.get(path, params={"limit": 10**6}), 422, "limit")
    for params, needle in [({"pool": 1_000_001}, "params.pool"), ({"pool": 10**12 + 1}, "params.pool"),
                           ({"window": 2**40}, "params.window"), ({"seed": 2**64}, "params.seed"),
                           ({"max_tokens": 10**30}, "params.max_tokens"), ({"chunk": 0}, "params.chunk"),
                           ({"n_draft": 65}, "params.n_draft"), ({"top_k": 2**31}, "params.top_k"),
                           ({"temperature": 1e308 * 10}, "params.temperature"), ({"pool": 4}, "pool must be an odd")]:
        body = json.dumps({"text": DOC, "params": params}).replace("Infinity", "1e999")
        _err(client.post("/v1/jobs", content=body, headers={"content-type": "application/json"}), 422, needle)
    assert _counts(api) == before
    # the same bound on a batch line: the line's error names it, and no job is stored
    r = client.post("/v1/batches", content=json.dumps({"custom_id": "a", "text": DOC, "params": {"pool": 1_000_001}}),
                    headers={"content-type": "application/jsonl"})
    assert r.status_code == 200 and r.json()["status"] == "failed", r.text
    assert "params.pool" in r.json()["errors"]["data"][0]["message"]
    assert _counts(api)[:2] == before[:2]
    assert client.post("/v1/jobs", json={"text": DOC, "params": {"pool": 1023, "seed": 2**63 - 1}}).status_code == 202


# --- 4: NUL in the URL ---------------------------------------------------------------------------------------


def test_nul_in_path_or_query_is_a_400(api, client):
    for url in ("/v1/jobs/job_%00x", "/v1/jobs?status=%00", "/v1/batches?name=a%00b", "/v1/batches/batch_%00/results",
                "/v1/jobs/job_x/data%00"):
        _err(client.get(url), 400, "NUL")
    _err(client.delete("/v1/jobs/job_%00"), 400, "NUL")


# --- 5: sizes ------------------------------------------------------------------------------------------------


def test_question_has_its_own_limit_and_lists_leave_out_large_fields(api, client):
    before = _counts(api)
    _err(client.post("/v1/jobs", json={"text": DOC, "question": "q" * 12_000_000}), 413, "SPECQ_MAX_REQUEST_BYTES")
    _err(client.post("/v1/jobs", json={"text": DOC, "question": "q" * 70_000}), 422, "question")
    _err(client.post("/v1/jobs", json={"text": DOC, "question": "é" * 40_000}), 422, "over the limit of 65536 bytes")
    _err(client.post("/v1/jobs", json={"text": DOC, "params": {"system": "s" * 70_000}}), 422, "params.system")
    _err(client.post("/v1/jobs", files={"file": ("a.py", DOC.encode())}, data={"question": "q" * 70_000}), 422, "question")
    assert _counts(api) == before
    question, system = "Q" * 60_000, "S" * 60_000
    r = client.post("/v1/jobs", json={"text": DOC, "question": question, "params": {"system": system}})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    row = next(j for j in client.get("/v1/jobs", params={"limit": 500}).json()["data"] if j["id"] == job_id)
    assert "question" not in row["params"] and "system" not in row["params"] and "input" not in row
    full = client.get(f"/v1/jobs/{job_id}").json()
    assert full["input"]["question"] == question and full["params"]["system"] == system
    with db.session(api.database_url) as s:  # the question is stored once
        assert "question" not in s.get(Job, job_id).params


# --- 7: Host and Origin without keys -------------------------------------------------------------------------


def test_foreign_host_and_cross_origin_requests_are_refused_without_keys(api, client):
    before = _counts(api)
    port = api.port
    body = {"text": DOC, "question": "q"}
    _err(client.post("/v1/jobs", json=body, headers={"Host": f"evil.example:{port}"}), 400, "evil.example", "SPECQ_ALLOWED_HOSTS")
    _err(client.get("/v1/jobs", headers={"Host": "evil.example"}), 400, "not allowed")
    _err(client.post("/v1/jobs", json=body, headers={"Origin": "http://evil.example"}), 403, "cross-origin")
    _err(client.post("/v1/jobs", json=body, headers={"Origin": "null"}), 403, "cross-origin")
    _err(client.post("/v1/jobs", json=body, headers={"Origin": f"http://localhost:{port}"}), 403)  # another origin
    assert _counts(api) == before
    # a page specq serves (same origin), an allowed name, loopback names: accepted
    r = client.post("/v1/jobs", json=body, headers={"Origin": f"http://127.0.0.1:{port}"})
    assert r.status_code == 202, r.text
    for host in (f"localhost:{port}", "127.0.0.1", f"[::1]:{port}", "specq.internal", f"SPECQ.internal:{port}"):
        assert client.get("/v1/jobs", headers={"Host": host}).status_code == 200, host
    r = client.get("/v1/jobs", headers={"Host": "specq.internal", "Origin": "http://specq.internal:3000"})
    assert r.status_code == 200  # an origin on a SPECQ_ALLOWED_HOSTS name
    # probes answer whatever the Host
    assert client.get("/healthz", headers={"Host": "10.0.0.7:8178"}).status_code == 200


# --- 8: slow clients ------------------------------------------------------------------------------------------


def test_a_thousand_slow_clients_do_not_lock_out_a_normal_request(api):
    """1,000 clients that send their headers a byte every half second (SPECQ_MAX_CONNECTIONS=200 in this
    stack): a normal request still answers, and every slow client is disconnected by the receipt
    deadline (or to make room) instead of being held open."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        if hard != resource.RLIM_INFINITY and hard < 1200:
            pytest.skip(f"needs 1,200 file descriptors (ulimit -n is {soft}, hard {hard})")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200 if hard == resource.RLIM_INFINITY else min(hard, 4096), hard))

    async def slow(closed: list, stop: asyncio.Event):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
        except OSError:
            closed.append(0.0)  # refused outright counts as not held open
            return
        t0 = time.monotonic()
        writer.write(b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        try:
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(reader.read(4096), timeout=0.5)
                    if not data or data.startswith(b"HTTP/1.1 408") or data.startswith(b"HTTP/1.1 503"):
                        closed.append(time.monotonic() - t0)
                        return
                except asyncio.TimeoutError:
                    writer.write(b"a")
                    await writer.drain()
        except (ConnectionError, OSError):
            closed.append(time.monotonic() - t0)
        finally:
            writer.close()

    async def scenario():
        closed: list[float] = []
        stop = asyncio.Event()
        tasks = [asyncio.create_task(slow(closed, stop)) for _ in range(1000)]
        await asyncio.sleep(1.0)  # all connected and dribbling
        async with httpx.AsyncClient(base_url=api.url, timeout=10) as c:
            t0 = time.monotonic()
            r = await c.get("/v1/jobs", params={"limit": 1})
            normal_s = time.monotonic() - t0
        await asyncio.sleep(RECEIPT_TIMEOUT + 4)
        stop.set()
        await asyncio.gather(*tasks)
        return r, normal_s, closed

    r, normal_s, closed = asyncio.run(scenario())
    print(f"normal request answered in {normal_s * 1000:.0f} ms with 1,000 slow clients; {len(closed)} slow clients "
          f"disconnected by the server")
    assert r.status_code == 200
    assert len(closed) == 1000  # none was held open past the deadline
    assert max(closed) <= RECEIPT_TIMEOUT + 3, max(closed)


# --- 9: loose parsing, 405, HEAD ---------------------------------------------------------------------------------


def test_wrong_typed_params_405_allow_and_head(api, client):
    before = _counts(api)
    for value in ([], False, 0, "", [1], "{}", 1.5):
        _err(client.post("/v1/jobs", json={"text": DOC, "params": value}), 422, "params")
    _err(client.post("/v1/jobs", files={"file": ("a.py", DOC.encode())}, data={"params": "[]"}), 422, "params")
    _err(client.post("/v1/jobs", files={"file": ("a.py", DOC.encode())}, data={"params": ""}), 422, "params")
    assert _counts(api) == before
    for method, url, allow in [("PUT", "/v1/jobs", "GET, HEAD, POST"), ("PATCH", "/v1/jobs/job_x", "DELETE, GET, HEAD"),
                               ("GET", "/v1/batches/batch_x/cancel", "POST"), ("POST", "/healthz", "GET, HEAD"),
                               ("POST", "/v1/jobs/job_x/data", "DELETE")]:
        r = client.request(method, url)
        _err(r, 405, "not allowed")
        assert r.headers["allow"] == allow, (method, url, r.headers.get("allow"))
    for url in ("/healthz", "/readyz", "/v1/jobs", "/v1/batches", "/v1/workers", "/openapi.json"):
        get, head = client.get(url), client.head(url)
        assert head.status_code == get.status_code == 200 and head.content == b"", url
        assert head.headers["content-type"] == get.headers["content-type"], url
    assert client.head("/v1/jobs/job_nope").status_code == 404
    assert client.head("/v1/batches/batch_x/cancel").status_code == 405


# --- 10: health, readiness, workers ----------------------------------------------------------------------------


def test_healthz_readyz_and_workers_from_heartbeats(api, client):
    from specq import monitor
    from specq.settings import ServiceSettings

    assert set(client.get("/healthz").json()) == {"status", "version", "instance"}
    settings = ServiceSettings.from_env(api.env)
    old = {"name": "old-worker:1", "queue": settings.queue, "jobs_done": 3, "current_job": "job_abc", "host": "h",
           "pid": 1, "gpu": "0", "target": "qwen", "backend": "CUDA"}  # what workers wrote before `ready`
    new = {"name": "new-worker:2", "queue": settings.queue, "ready": True, "slots": 4, "current_jobs": ["job_1", "job_2"],
           "busy": 2, "device": "cuda:1", "model": "qwen-7b", "backend": "CUDA", "jobs_done": "not a number"}
    loading = {"name": "loading-worker:3", "queue": settings.queue, "ready": False, "slots": None}
    old_env = {k: os.environ.get(k) for k in ("SPECQ_HOME",)}
    os.environ["SPECQ_HOME"] = api.env["SPECQ_HOME"]
    try:
        for rec in (old, new, loading):
            monitor.write_heartbeat(settings, rec)
        ready = client.get("/readyz").json()
        assert ready["status"] == "ready" and ready["workers_ready"] == 2, ready
        assert ready["workers_not_ready"] == ["loading-worker:3: loading"], ready  # it gave no reason
        workers = {w["name"]: w for w in client.get("/v1/workers").json()["data"]}
        assert workers["loading-worker:3"]["not_ready"] is None and workers["new-worker:2"]["not_ready"] is None
        assert workers["old-worker:1"]["ready"] and workers["old-worker:1"]["slots"] == 1
        assert workers["old-worker:1"]["current_jobs"] == ["job_abc"] and workers["old-worker:1"]["device"] == "0"
        assert workers["new-worker:2"]["busy"] == 2 and workers["new-worker:2"]["slots"] == 4
        assert workers["new-worker:2"]["model"] == "qwen-7b" and workers["new-worker:2"]["jobs_done"] == 0
        assert not workers["loading-worker:3"]["ready"] and workers["loading-worker:3"]["slots"] == 1
        assert all(0 <= w["heartbeat_age_s"] < 30 for w in workers.values())
        metrics = client.get("/metrics")  # reads the same records, as defensively
        assert metrics.status_code == 200 and 'specq_worker_busy{queue="%s",worker="new-worker:2"} 2.0' % settings.queue \
            in metrics.text, metrics.text[-2000:]
    finally:
        for rec in (old, new, loading):
            monitor.remove_heartbeat(settings, rec["name"])
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.services
def test_readyz_says_unavailable_when_the_store_goes_away_and_healthz_does_not(tmp_path):
    require_servers()
    port = free_port()
    with pg_database() as pg_url:
        st_ = Stack(env=_env(tmp_path, port, **redis_pg_env(pg_url, "specq-readyz")), port=port, logdir=tmp_path)
        st_.cli("db", "upgrade", check=True)
        with running(st_, ("api", "api")), httpx.Client(base_url=st_.url, timeout=30) as c:
            assert c.get("/readyz").json()["status"] == "ready"
            assert c.get("/health").status_code == 200 and c.get("/health").json()["status"] == "ok"
            import psycopg

            from service_helpers import PG_ADMIN_URL

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE "{pg_url.rsplit("/", 1)[1]}" WITH (FORCE)')
            r = c.get("/readyz")
            assert r.status_code == 503 and r.headers["retry-after"] == "10", r.text
            assert r.json()["database"].startswith("unreachable") and r.json()["status"] == "unavailable"
            assert c.get("/healthz").status_code == 200
            # /health, as llama-server and vLLM serve it, follows readiness: 503 naming what is not ready
            r = c.get("/health")
            assert r.status_code == 503 and r.headers["retry-after"] == "10", r.text
            assert r.json()["error"]["type"] == "unavailable_error" and "database unreachable" in r.json()["error"]["message"]
            # a route that needs the store says so with 503 + Retry-After (clients retry), not a 500
            for method, path, body in (("GET", "/v1/jobs", None), ("POST", "/v1/jobs", {"text": DOC, "question": "q"})):
                r = c.request(method, path, json=body)
                assert r.status_code == 503 and r.headers["retry-after"] == "10", (path, r.status_code, r.text)
                assert r.json()["error"]["type"] == "unavailable" and "job store" in r.json()["error"]["message"]


# --- data lifecycle --------------------------------------------------------------------------------------------


def test_delete_a_finished_jobs_and_batchs_data(api, client):
    job_id = client.post("/v1/jobs", json={"text": DOC, "question": "q"}).json()["id"]
    _err(client.delete(f"/v1/jobs/{job_id}/data"), 409, "cancel it first")
    assert client.delete(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    r = client.delete(f"/v1/jobs/{job_id}/data")
    assert r.status_code == 200 and r.json() == {"id": job_id, "object": "job.deleted", "deleted": True, "jobs_deleted": 1}
    _err(client.get(f"/v1/jobs/{job_id}"), 404)
    _err(client.delete(f"/v1/jobs/{job_id}/data"), 404)
    with db.session(api.database_url) as s:
        assert s.get(Job, job_id) is None and s.get(JobInput, job_id) is None

    lines = "\n".join(json.dumps({"custom_id": f"r{i}", "text": DOC}) for i in range(3))
    batch = client.post("/v1/batches", content=lines, headers={"content-type": "application/jsonl"}).json()
    _err(client.delete(f"/v1/batches/{batch['id']}/data"), 409, "cancel it first")
    with db.session(api.database_url) as s:
        member = s.scalars(select(Job.id).where(Job.batch_id == batch["id"])).first()
    _err(client.delete(f"/v1/jobs/{member}/data"), 409, "belongs to batch")
    assert client.post(f"/v1/batches/{batch['id']}/cancel").json()["status"] == "cancelled"
    r = client.delete(f"/v1/batches/{batch['id']}/data")
    assert r.status_code == 200 and r.json()["jobs_deleted"] == 3, r.text
    _err(client.get(f"/v1/batches/{batch['id']}"), 404)
    with db.session(api.database_url) as s:
        assert s.scalar(select(func.count()).select_from(Job).where(Job.batch_id == batch["id"])) == 0


def test_retention_deletes_finished_jobs_and_batches(tmp_path):
    port = free_port()
    st_ = Stack(env=_env(tmp_path, port, SPECQ_RETENTION="2s"), port=port, logdir=tmp_path)
    with running(st_, ("api", "api")), httpx.Client(base_url=st_.url, timeout=30) as c:
        finished = c.post("/v1/jobs", json={"text": DOC}).json()["id"]
        c.delete(f"/v1/jobs/{finished}")
        waiting = c.post("/v1/jobs", json={"text": DOC}).json()["id"]  # queued: kept, whatever its age
        batch = c.post("/v1/batches", content=json.dumps({"custom_id": "a", "text": DOC}),
                       headers={"content-type": "application/jsonl"}).json()["id"]
        c.post(f"/v1/batches/{batch}/cancel")
        deadline = time.monotonic() + 20
        while c.get(f"/v1/jobs/{finished}").status_code != 404 or c.get(f"/v1/batches/{batch}").status_code != 404:
            assert time.monotonic() < deadline, "retention did not delete the finished job and batch"
            time.sleep(0.3)
        assert c.get(f"/v1/jobs/{waiting}").json()["status"] == "queued"


# --- CSV -----------------------------------------------------------------------------------------------------


def test_csv_cells_that_look_like_formulas():
    from specq.api.batches import csv_row

    result = {"text": "=HYPERLINK(\"http://evil\",\"x\")", "finish_reason": "stop",
              "usage": {"prompt_tokens": 10, "kept_tokens": 5, "completion_tokens": -3}, "spec": {"mode": "@SUM(A1)"}}
    row = csv_row("job_1", "+cmd|' /C calc'!A0", "succeeded", "\tname.py", -1.5, result, [])
    assert row[0] == "'+cmd|' /C calc'!A0" and row[3] == "'\tname.py" and row[4] == "'=HYPERLINK(\"http://evil\",\"x\")"
    assert row[10] == "'@SUM(A1)"
    assert row[8] == -3 and row[-1] == -1.5  # numbers stay numbers
    assert csv_row("j", "-2", "succeeded", "\rx", None, {"text": "plain"}, [])[:5] == ["'-2", "j", "succeeded", "'\rx", "plain"]


# --- hypothesis: whatever is accepted reads back; whatever is refused leaves nothing ---------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
ANY_TEXT = st.one_of(TEXT, st.sampled_from(["", " ", "\x00", "\ud800", "x" * 300, "=1+1", "é" * 10]))
PARAM_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), ANY_TEXT,
                         st.lists(st.integers(), max_size=2))
PARAMS = st.one_of(st.dictionaries(st.sampled_from(["max_tokens", "pool", "keep", "mode", "seed", "system", "window",
                                                    "bogus", "temperature"]), PARAM_VALUES, max_size=4),
                   st.sampled_from([[], False, 0, "", None]))
JOB = st.fixed_dictionaries({"text": st.one_of(st.just(DOC), ANY_TEXT)},
                            optional={"question": ANY_TEXT, "params": PARAMS, "filename": ANY_TEXT})
METADATA = st.one_of(st.none(), st.dictionaries(ANY_TEXT, st.one_of(ANY_TEXT, st.integers()), max_size=18))


def _fuzz(n):
    return settings(max_examples=n, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _reads_back(client, created: dict, kind: str) -> None:
    if kind == "job":
        r = client.get(f"/v1/jobs/{created['id']}")
        assert r.status_code == 200, r.text
        S.JobOut.model_validate(r.json())
        page = client.get("/v1/jobs", params={"limit": 500})
        assert page.status_code == 200 and created["id"] in {j.id for j in S.JobList.model_validate(page.json()).data}
    else:
        r = client.get(f"/v1/batches/{created['id']}")
        assert r.status_code == 200, r.text
        S.BatchOut.model_validate(r.json())
        page = client.get("/v1/batches", params={"limit": 500})
        assert page.status_code == 200 and created["id"] in {b.id for b in S.BatchList.model_validate(page.json()).data}
        for sub in ("results", "errors", "stats"):
            assert client.get(f"/v1/batches/{created['id']}/{sub}").status_code == 200
        assert client.get(f"/v1/batches/{created['id']}/results", params={"format": "csv"}).status_code == 200


@_fuzz(60)
@given(JOB)
def test_any_accepted_job_reads_back_and_any_refusal_leaves_nothing(api, client, body):
    before = _counts(api)
    r = client.post("/v1/jobs", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert _counts(api) == before
        return
    assert r.status_code == 202 and _counts(api)[:2] == (before[0] + 1, before[1] + 1)
    _reads_back(client, r.json(), "job")


@_fuzz(40)
@given(st.lists(JOB.map(lambda j: {"custom_id": "c", **j}), min_size=1, max_size=3), METADATA,
       st.sampled_from(["jsonl", "form"]))
def test_any_accepted_batch_reads_back_and_any_refusal_leaves_nothing(api, client, lines, metadata, how):
    for i, line in enumerate(lines):
        line["custom_id"] = f"c{i}"
    before = _counts(api)
    body = "\n".join(json.dumps(x) for x in lines)
    if how == "jsonl" or metadata is None:
        r = client.post("/v1/batches", content=body, headers={"content-type": "application/jsonl"})
    else:
        r = client.post("/v1/batches", files={"input": ("in.jsonl", body.encode())},
                        data={"metadata": json.dumps(metadata)})
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert _counts(api) == before
        return
    created = r.json()
    assert r.status_code == 200 and created["status"] in ("in_progress", "failed"), r.text
    jobs_added = _counts(api)[0] - before[0]
    assert jobs_added == (len(lines) if created["status"] == "in_progress" else 0)
    _reads_back(client, created, "batch")
