"""The REST API's refusals, against a real `specq api` process (no worker needed):
empty, binary, undecodable, oversized documents and bodies, unknown or bad params, malformed
requests -> 4xx with a JSON message, and nothing stored in the database or sent to the broker.
Run on the embedded default (SQLite + SQLAlchemy broker) and on PostgreSQL + Redis (`services`)."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import func, select, text

from service_helpers import Stack, free_port, pg_database, redis_pg_env, require_servers, running

MAX_INPUT = 4096
MAX_REQUEST = 16384


def _env(home, **extra):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(SPECQ_HOME=str(home), SPECQ_MAX_INPUT_BYTES=str(MAX_INPUT), SPECQ_MAX_REQUEST_BYTES=str(MAX_REQUEST),
               PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="module", params=["embedded", pytest.param("redis_pg", marks=pytest.mark.services)])
def api(request, tmp_path_factory):
    home = tmp_path_factory.mktemp(f"api_{request.param}")
    port = free_port()
    if request.param == "embedded":
        with running(Stack(env=_env(home, SPECQ_API_PORT=str(port)), port=port, logdir=home), ("api", "api")) as st:
            yield st
        return
    require_servers()
    with pg_database() as pg_url:
        st = Stack(env=_env(home, SPECQ_API_PORT=str(port), **redis_pg_env(pg_url, "specq-apitest")), port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        with running(st, ("api", "api")):
            yield st


@pytest.fixture
def client(api):
    with httpx.Client(base_url=api.url, timeout=30) as c:
        yield c


def _count_jobs(api) -> int:
    from specq.storage import db
    from specq.storage.models import Job, JobInput

    with db.session(api.database_url) as s:
        n = s.scalar(select(func.count()).select_from(Job))
        assert s.scalar(select(func.count()).select_from(JobInput)) == n
        return n


def _queued_messages(api) -> int:
    """Messages waiting in the broker for this API's queue."""
    env = api.env
    if env.get("SPECQ_BROKER_URL", "").startswith("redis"):
        import redis

        return redis.Redis.from_url(env["SPECQ_BROKER_URL"]).llen(env["SPECQ_QUEUE"])
    from sqlalchemy import create_engine

    eng = create_engine(f"sqlite:///{env['SPECQ_HOME']}/broker.sqlite")
    try:
        with eng.connect() as conn:
            if conn.execute(text("SELECT name FROM sqlite_master WHERE name = 'kombu_message'")).first() is None:
                return 0  # kombu creates its tables on the first message
            return conn.execute(text("SELECT count(*) FROM kombu_message")).scalar()
    finally:
        eng.dispose()


def _err(r: httpx.Response, status: int, *needles: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    message = body["error"]["message"]
    assert isinstance(message, str) and message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


DOC = "print('hello')\n" * 10


def test_refusals_store_nothing(api, client):
    before_jobs, before_msgs = _count_jobs(api), _queued_messages(api)
    post = lambda **kw: client.post("/v1/jobs", **kw)  # noqa: E731

    # empty, blank, binary-looking, undecodable documents
    _err(post(json={"text": "", "question": "q"}), 422, "text is empty")
    _err(post(json={"text": "  \n\t ", "question": "q"}), 422, "text is empty")
    _err(post(json={"text": "\x01\x02\x03\x04" * 50}), 422, "looks binary")
    _err(post(files={"file": ("empty.txt", b"")}), 422, "empty.txt is empty")
    _err(post(files={"file": ("a.bin", b"ELF\x00\x01\x02" * 30)}), 422, "a.bin looks binary", "NUL")
    _err(post(files={"file": ("latin1.txt", "caf\xe9 cr\xe8me\n".encode("latin-1"))}), 422, "not UTF-8")

    # oversized: the document limit (413 with both sizes), and the whole-body limit
    big = "x" * (MAX_INPUT + 1)
    _err(post(json={"text": big}), 413, f"document is {MAX_INPUT + 1} bytes", f"limit of {MAX_INPUT} bytes",
         "SPECQ_MAX_INPUT_BYTES")
    _err(post(files={"file": ("big.txt", big.encode())}), 413, f"limit of {MAX_INPUT} bytes")
    _err(post(content=json.dumps({"text": "y" * (MAX_REQUEST + 10)}), headers={"content-type": "application/json"}),
         413, "request body", "SPECQ_MAX_REQUEST_BYTES")

    def chunked():  # no Content-Length: the limit is counted while reading
        for _ in range(MAX_REQUEST // 1000 + 2):
            yield b"z" * 1000

    _err(post(content=chunked(), headers={"content-type": "application/json"}), 413, "request body")

    # unknown and bad params
    _err(post(json={"text": DOC, "params": {"bogus": 1, "max_tokes": 5}}), 422, "params.bogus: unknown field",
         "params.max_tokes: unknown field", "known params: chunk")
    _err(post(json={"text": DOC, "params": {"keep": 2.0}}), 422, "params.keep: Input should be less than or equal to 1")
    _err(post(json={"text": DOC, "params": {"keep": 0}}), 422, "params.keep: Input should be greater than 0")
    _err(post(json={"text": DOC, "params": {"keep": "0.3"}}), 422, "params.keep")  # optional (null = unset), never a string
    _err(post(json={"text": DOC, "params": {"max_tokens": "many"}}), 422, "params.max_tokens: Input should be a valid integer")
    _err(post(json={"text": DOC, "params": {"mode": "turbo"}}), 422, "params.mode: Input should be 'auto', 'baseline' or 'specprefill'")
    _err(post(json={"text": DOC, "params": {"pool": 4}}), 422, "params: pool must be an odd number")
    for not_an_object in ([1, 2], [], False, 0, ""):  # none of them means "no params"
        _err(post(json={"text": DOC, "params": not_an_object}), 422, "params: Input should be an object")
    _err(post(files={"file": ("a.py", DOC.encode())}, data={"params": '{"bogus": true}'}), 422, "params.bogus: unknown field")
    _err(post(files={"file": ("a.py", DOC.encode())}, data={"params": "{not json"}), 422, "params is not valid JSON")
    _err(post(files={"file": ("a.py", DOC.encode())}, data={"max_tokens": "5"}), 422, "unknown form field(s): max_tokens")

    # malformed requests
    _err(post(json={"question": "no text"}), 422, "text: required")
    _err(post(json={"text": DOC, "prompt": "x"}), 422, "prompt: unknown field")
    _err(post(content=b"{nope", headers={"content-type": "application/json"}), 400, "not valid JSON")
    _err(post(content=b"[1]", headers={"content-type": "application/json"}), 400, "must be a JSON object")
    _err(post(content=DOC.encode(), headers={"content-type": "text/plain"}), 415, "application/json")
    _err(post(data={"question": "no file"}), 422, "file is required")

    # nothing reached the database or the broker
    assert _count_jobs(api) == before_jobs
    assert _queued_messages(api) == before_msgs

    # and a good request does (so the counts above could have moved)
    r = post(json={"text": DOC, "question": "what does it print?", "params": {"max_tokens": 3}})
    assert r.status_code == 202, r.text
    assert _count_jobs(api) == before_jobs + 1
    assert _queued_messages(api) == before_msgs + 1
    job = client.get(f"/v1/jobs/{r.json()['id']}").json()
    assert job["status"] == "queued" and job["params"]["max_tokens"] == 3
    assert job["input"]["question"] == "what does it print?" and job["result"] is None
    assert "question" not in job["params"]  # stored once, in the job's input


def test_lookups_and_listing_errors(api, client):
    _err(client.get("/v1/jobs/job_doesnotexist"), 404, "no job job_doesnotexist")
    _err(client.delete("/v1/jobs/job_doesnotexist"), 404, "no job")
    _err(client.get("/v1/jobs", params={"status": "done"}), 422, "unknown status done")
    _err(client.get("/v1/jobs", params={"limit": 0}), 422, "limit")
    _err(client.get("/v1/nothing"), 404)
    r = client.put("/v1/jobs/job_x")
    _err(r, 405)
    assert r.headers["allow"] == "DELETE, GET, HEAD"
    page = client.get("/v1/jobs", params={"status": "queued", "limit": 1000}).json()
    assert page["limit"] == 500 and all(j["status"] == "queued" for j in page["data"])


def test_healthz_and_openapi(api, client):
    health = client.get("/healthz").json()
    assert health == {"status": "ok", "version": client.get("/readyz").json()["version"], "instance": health["instance"]}
    assert health["instance"] and client.get("/healthz").json()["instance"] == health["instance"]  # one per process
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["database"] == "ok" and ready["broker"] == "ok", ready
    assert ready["migrations"] == "ok" and ready["workers_ready"] == 0  # no worker in this stack
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(body)
    assert {"get", "delete"} <= set(spec["paths"]["/v1/jobs/{job_id}"])


def test_api_keys_on_the_embedded_default(tmp_path):
    """SPECQ_AUTH=keys on SQLite too: a key from `specq keys create`, sent by the CLI from SPECQ_API_KEY
    (per-tenant isolation on PostgreSQL: tests/test_security.py)."""
    port = free_port()
    st = Stack(env=_env(tmp_path, SPECQ_API_PORT=str(port), SPECQ_AUTH="keys"), port=port, logdir=tmp_path)
    key = st.cli("keys", "create", "--tenant", "me", check=True).stdout.strip()
    st.start("api", "api")
    try:
        st.wait_healthy()  # /healthz needs no key
        with httpx.Client(base_url=st.url) as c:
            _err(c.get("/v1/jobs"), 401, "missing API key")
            _err(c.get("/v1/jobs", headers={"Authorization": "Bearer nope"}), 401, "unknown or revoked API key")
            assert c.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        # the CLI sends SPECQ_API_KEY (the API process has its environment already)
        r = st.cli("jobs")
        assert r.returncode == 1 and "missing API key" in r.stderr
        st.env["SPECQ_API_KEY"] = key
        assert st.cli("jobs").returncode == 0
    finally:
        st.stop()


def test_api_process_never_loads_llama_cpp():
    """The API enqueues by task name: importing and building it loads neither the worker nor llama.cpp."""
    import subprocess
    import sys

    from service_helpers import REPO

    code = ("import sys; from specq.api.app import create_app; from specq.broker import make_celery; create_app(); "
            "bad = [m for m in sys.modules if m.startswith(('llama_cpp', 'specq.worker', 'specq.engine.pipeline', "
            "'specq.engine.llama.binding', 'numpy'))]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
