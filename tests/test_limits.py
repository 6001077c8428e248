"""Every limit, just under and just over, against real `specq api` / `specq worker` processes on the
local Redis and a throwaway PostgreSQL database (tiny random-weight models). Under the limit the
request passes; over it, a 4xx with a message naming the setting (or, for what only the worker can
see, a `failed` job with the engine's message), and nothing stored.

| limit | setting | over it |
|---|---|---|
| document bytes (JSON and multipart) | SPECQ_MAX_INPUT_BYTES | 413 |
| request body bytes | SPECQ_MAX_REQUEST_BYTES | 413 |
| batch upload bytes | SPECQ_MAX_BATCH_BYTES | 413 |
| batch lines / files | SPECQ_MAX_BATCH_REQUESTS | 422 |
| unfinished jobs per tenant (also under concurrent submits) | SPECQ_MAX_QUEUED_JOBS | 429 |
| prompt + max_tokens vs the worker's context | SPECQ_N_CTX | job `failed` |
| job wall time | SPECQ_TIME_LIMIT | job `failed` |
| Redis visibility timeout above the hard time limit | SPECQ_VISIBILITY_TIMEOUT | refuses to start |
"""

from __future__ import annotations

import contextlib

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import func, select

from service_helpers import (REPO, Stack, base_env, free_port, pg_database, redis_pg_env, require_servers, running,
                             specq_cmd, wait_job)

pytestmark = pytest.mark.services

MAX_INPUT = 4096
MAX_REQUEST = 6000
MAX_BATCH_BYTES = 20000
MAX_BATCH_REQUESTS = 5
MAX_QUEUED = 6


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """An API (keys on) with small limits and no worker: accepted jobs stay queued."""
    require_servers()
    import os

    home = tmp_path_factory.mktemp("limits")
    port = free_port()
    with pg_database() as pg_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
        env.update(SPECQ_HOME=str(home), SPECQ_API_PORT=str(port), SPECQ_AUTH="keys",
                   SPECQ_MAX_INPUT_BYTES=str(MAX_INPUT), SPECQ_MAX_REQUEST_BYTES=str(MAX_REQUEST),
                   SPECQ_MAX_BATCH_BYTES=str(MAX_BATCH_BYTES), SPECQ_MAX_BATCH_REQUESTS=str(MAX_BATCH_REQUESTS),
                   SPECQ_MAX_QUEUED_JOBS=str(MAX_QUEUED), PYTHONUNBUFFERED="1", **redis_pg_env(pg_url, "specq-limits"))
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        with running(st, ("api", "api")):
            yield st
        import redis

        redis.Redis.from_url(env["SPECQ_BROKER_URL"]).delete(env["SPECQ_QUEUE"])


def tenant_client(api, tenant: str) -> httpx.Client:
    """A client with a fresh key of `tenant` (each test its own tenant: the queued-jobs limit is per tenant)."""
    from specq.storage import db, keys

    with db.session(api.database_url) as s:
        _, secret = keys.create_key(s, tenant)
    return httpx.Client(base_url=api.url, timeout=30, headers={"Authorization": f"Bearer {secret}"})


def _counts(api) -> tuple[int, int]:
    from specq.storage import db
    from specq.storage.models import Batch, Job

    with db.session(api.database_url) as s:
        return s.scalar(select(func.count()).select_from(Job)), s.scalar(select(func.count()).select_from(Batch))


def _err(r: httpx.Response, status: int, *needles: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    message = r.json()["error"]["message"]
    for needle in needles:
        assert needle in message, (needle, message)


def test_document_bytes(api):
    with tenant_client(api, "docs") as c:
        exact = "x" * (MAX_INPUT - 2) + "é"  # bytes are counted, not characters: "é" is 2 bytes
        assert len(exact.encode()) == MAX_INPUT
        assert c.post("/v1/jobs", json={"text": exact}).status_code == 202
        before = _counts(api)
        _err(c.post("/v1/jobs", json={"text": exact + "y"}), 413, f"document is {MAX_INPUT + 1} bytes",
             f"limit of {MAX_INPUT} bytes (SPECQ_MAX_INPUT_BYTES)")
        assert c.post("/v1/jobs", files={"file": ("a.txt", exact.encode())}).status_code == 202
        _err(c.post("/v1/jobs", files={"file": ("a.txt", exact.encode() + b"y")}), 413,
             f"limit of {MAX_INPUT} bytes (SPECQ_MAX_INPUT_BYTES)")
        assert _counts(api)[0] == before[0] + 1  # only the passing upload was stored


def test_request_body_bytes(api):
    with tenant_client(api, "bodies") as c:
        def body(size: int) -> bytes:  # a valid small job padded with JSON whitespace to `size` bytes
            core = json.dumps({"text": "def f(): pass\n", "params": {"max_tokens": 2}})
            return (core[:-1] + " " * (size - len(core)) + "}").encode()

        assert len(body(MAX_REQUEST)) == MAX_REQUEST
        r = c.post("/v1/jobs", content=body(MAX_REQUEST), headers={"content-type": "application/json"})
        assert r.status_code == 202, r.text
        _err(c.post("/v1/jobs", content=body(MAX_REQUEST + 1), headers={"content-type": "application/json"}), 413,
             f"limit of {MAX_REQUEST} bytes (SPECQ_MAX_REQUEST_BYTES)")


def test_batch_upload_bytes(api):
    with tenant_client(api, "batchbytes") as c:
        def upload(size: int) -> bytes:  # one request, padded with blank lines (which are skipped)
            line = json.dumps({"custom_id": "only", "text": "x = 1\n"}) + "\n"
            return (line + "\n" * (size - len(line))).encode()

        jsonl = {"content-type": "application/jsonl"}
        r = c.post("/v1/batches", content=upload(MAX_BATCH_BYTES), headers=jsonl)
        assert r.status_code == 200 and r.json()["status"] == "in_progress", r.text
        before = _counts(api)
        _err(c.post("/v1/batches", content=upload(MAX_BATCH_BYTES + 1), headers=jsonl), 413,
             f"limit of {MAX_BATCH_BYTES} bytes (SPECQ_MAX_BATCH_BYTES)")
        assert _counts(api) == before


def test_batch_lines_and_files(api):
    jsonl = {"content-type": "application/jsonl"}

    def lines(n: int) -> str:
        return "\n".join(json.dumps({"custom_id": f"r{i}", "text": f"v = {i}\n"}) for i in range(n))

    with tenant_client(api, "lines") as c:
        r = c.post("/v1/batches", content=lines(MAX_BATCH_REQUESTS), headers=jsonl)
        assert r.status_code == 200 and r.json()["request_counts"]["total"] == MAX_BATCH_REQUESTS, r.text
    with tenant_client(api, "lines2") as c:
        before = _counts(api)
        _err(c.post("/v1/batches", content=lines(MAX_BATCH_REQUESTS + 1), headers=jsonl), 422,
             f"more than {MAX_BATCH_REQUESTS} requests (SPECQ_MAX_BATCH_REQUESTS)")
        files = [("file", (f"f{i}.py", f"w = {i}\n".encode())) for i in range(MAX_BATCH_REQUESTS + 1)]
        _err(c.post("/v1/batches", files=files), 422, f"{MAX_BATCH_REQUESTS + 1} files, over the limit of "
             f"{MAX_BATCH_REQUESTS} per batch (SPECQ_MAX_BATCH_REQUESTS)")
        assert _counts(api) == before  # neither a batch nor a job was stored
        r = c.post("/v1/batches", files=files[:MAX_BATCH_REQUESTS])
        assert r.status_code == 200 and r.json()["request_counts"]["total"] == MAX_BATCH_REQUESTS, r.text


def test_queued_jobs_per_tenant(api):
    doc = {"text": "q = 1\n", "params": {"max_tokens": 1}}
    with tenant_client(api, "busy") as busy, tenant_client(api, "calm") as calm:
        ids = []
        for _ in range(MAX_QUEUED):
            r = busy.post("/v1/jobs", json=doc)
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        before = _counts(api)
        r = busy.post("/v1/jobs", json=doc)
        _err(r, 429, f"tenant busy has {MAX_QUEUED} queued or running jobs", f"limit of {MAX_QUEUED} (SPECQ_MAX_QUEUED_JOBS)")
        assert r.headers["retry-after"] == "30"  # when to try again
        line = json.dumps({"custom_id": "one", "text": "b = 1\n"})
        _err(busy.post("/v1/batches", content=line, headers={"content-type": "application/jsonl"}), 429,
             "SPECQ_MAX_QUEUED_JOBS")
        assert _counts(api) == before  # no job, no batch
        assert calm.post("/v1/jobs", json=doc).status_code == 202  # other tenants are not affected
        # a finished (here: cancelled) job frees its place
        assert busy.delete(f"/v1/jobs/{ids[0]}").json()["status"] == "cancelled"
        r = busy.post("/v1/batches", content=line, headers={"content-type": "application/jsonl"})
        assert r.status_code == 200 and r.json()["status"] == "in_progress", r.text
        _err(busy.post("/v1/jobs", json=doc), 429, "SPECQ_MAX_QUEUED_JOBS")


def test_queued_jobs_limit_holds_under_concurrent_submits(api):
    with tenant_client(api, "racer") as c:
        with ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(lambda _: c.post("/v1/jobs", json={"text": "r = 1\n"}).status_code, range(16)))
        assert sorted(codes) == [202] * MAX_QUEUED + [429] * (16 - MAX_QUEUED)
        assert c.get("/v1/jobs").json()["total"] == MAX_QUEUED


# --- limits only the worker can check ------------------------------------------------------------------


def _prompt_tokens(tiny_models, n_ctx: int, text: str, max_tokens: int) -> int | None:
    """The prompt's token count, or None when the engine refuses it for the context (as the worker would)."""
    from specq.contracts import InputError
    from specq.engine.options import EngineOptions, RunParams
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=n_ctx, n_threads=2))
    try:
        return eng.tokenize_prompt(text, RunParams(max_tokens=max_tokens)).n
    except InputError:
        return None
    finally:
        eng.close()


@pytest.mark.parametrize("over", [False, True], ids=["just-under", "just-over"])
def test_prompt_tokens_vs_context(tiny_models, context_stack, over):
    n_ctx, max_tokens = 1024, 4
    # the byte vocabulary of the tiny models: one token per ASCII character, plus the chat template
    template = _prompt_tokens(tiny_models, n_ctx, "a", max_tokens) - 1
    fits = "a" * (n_ctx - max_tokens - template)
    assert _prompt_tokens(tiny_models, n_ctx, fits, max_tokens) + max_tokens == n_ctx
    assert _prompt_tokens(tiny_models, n_ctx, fits + "a", max_tokens) is None
    with httpx.Client(base_url=context_stack.url, timeout=30) as c:
        r = c.post("/v1/jobs", json={"text": fits + "a" if over else fits, "params": {"max_tokens": max_tokens}})
        assert r.status_code == 202, r.text
        job = wait_job(c, r.json()["id"])
    if over:
        assert job["status"] == "failed" and job["attempts"] == 1, job
        assert job["error"] == (f"prompt is too long: {n_ctx - max_tokens + 1} tokens; with max_tokens {max_tokens} it "
                                f"exceeds the target's context of {n_ctx} tokens (the model's maximum context length "
                                "here)")
    else:
        assert job["status"] == "succeeded", job
        assert job["result"]["usage"]["prompt_tokens"] == n_ctx - max_tokens


@contextlib.contextmanager
def _stack(tiny_models, tmp_path_factory, name: str, **settings: str):
    """API + worker on PostgreSQL/Redis with the given SPECQ_* settings."""
    require_servers()
    home = tmp_path_factory.mktemp(name)
    port = free_port()
    with pg_database() as pg_url:
        env = base_env(home, tiny_models, SPECQ_API_PORT=str(port), **settings, **redis_pg_env(pg_url, f"specq-{name}"))
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        with running(st, ("api", "api"), ("worker", "worker")):
            yield st


@pytest.fixture(scope="module")
def context_stack(tiny_models, tmp_path_factory):
    with _stack(tiny_models, tmp_path_factory, "ctx", SPECQ_N_CTX="1024") as st:
        yield st


@pytest.fixture(scope="module")
def time_limit_stack(tiny_models, tmp_path_factory):
    with _stack(tiny_models, tmp_path_factory, "tl", SPECQ_TIME_LIMIT="4", SPECQ_N_CTX="32768") as st:
        yield st


def test_job_time_limit(time_limit_stack):
    """SPECQ_TIME_LIMIT=4: a one-token job (milliseconds; 1 s was too tight on a loaded machine)
    succeeds; a 30,000-token decode (tens of seconds on the tiny models) fails with the limit's
    message, once, without a retry, soon after the limit."""
    with httpx.Client(base_url=time_limit_stack.url, timeout=30) as c:
        quick = c.post("/v1/jobs", json={"text": "x = 1\n", "params": {"max_tokens": 1}}).json()["id"]
        slow = c.post("/v1/jobs", json={"text": "x = 1\n", "params": {"max_tokens": 30000}}).json()["id"]
        done = wait_job(c, quick)
        assert done["status"] == "succeeded", done["error"]
        job = wait_job(c, slow, timeout=120)
    assert job["status"] == "failed" and job["attempts"] == 1, job
    assert job["error"] == "job exceeded the time limit of 4s (SPECQ_TIME_LIMIT)"


def test_visibility_timeout_must_exceed_the_hard_time_limit(tmp_path):
    """Redis must not hand a running job to a second worker: SPECQ_VISIBILITY_TIMEOUT has to be above
    SPECQ_TIME_LIMIT + 60 s (when a stuck prefork child is killed); the default is time limit + 600 s."""
    from specq.broker import make_celery
    from specq.settings import ServiceSettings, SettingsError

    env = {"SPECQ_BROKER_URL": "redis://127.0.0.1:6379/13", "SPECQ_TIME_LIMIT": "100"}
    ok = ServiceSettings.from_env(dict(env, SPECQ_VISIBILITY_TIMEOUT="161"))
    assert make_celery(ok).conf.broker_transport_options["visibility_timeout"] == 161
    default = ServiceSettings.from_env(env)
    assert make_celery(default).conf.broker_transport_options["visibility_timeout"] == 700
    with pytest.raises(SettingsError, match=r"SPECQ_VISIBILITY_TIMEOUT \(160s\) must be longer than SPECQ_TIME_LIMIT"):
        ServiceSettings.from_env(dict(env, SPECQ_VISIBILITY_TIMEOUT="160"))
    # and the worker refuses to start with it, in one line, before loading anything
    import os

    proc_env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    proc_env.update(env, SPECQ_VISIBILITY_TIMEOUT="160", SPECQ_HOME=str(tmp_path))
    r = subprocess.run(specq_cmd("worker"), env=proc_env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "SPECQ_VISIBILITY_TIMEOUT (160s) must be longer" in r.stderr, r.stderr
