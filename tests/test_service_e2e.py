"""The job service end to end, with real processes and tiny random-weight models:

* `redis_pg`: `specq api` + `specq worker` subprocesses on the real Redis and a throwaway PostgreSQL
  database (marked `services`);
* `embedded`: `specq up` alone, on the defaults (SQLite job store + SQLAlchemy broker under SPECQ_HOME).

Each stack: `specq submit --wait` prints the answer and the phase table; REST polling returns the same
result object as `specq result --json`; the timings are rows in the database; a queued job and a
running job are cancelled; a job too long for the context fails with the engine's message while the
worker goes on serving.
"""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import select

from service_helpers import (Stack, base_env, embedded_up, free_port, pg_database, redis_pg_env, require_servers, running,
                             wait_job)

QUESTION = "What does this file define?"
DOC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture(scope="module", params=[pytest.param("redis_pg", marks=pytest.mark.services), "embedded"])
def stack(request, tiny_models, tmp_path_factory):
    home = tmp_path_factory.mktemp(f"svc_{request.param}")
    port = free_port()
    if request.param == "redis_pg":
        require_servers()
        with pg_database() as pg_url:
            env = base_env(home, tiny_models, SPECQ_API_PORT=str(port), **redis_pg_env(pg_url, "specq-test"))
            st = Stack(env=env, port=port, logdir=home)
            st.cli("db", "upgrade", check=True)
            with running(st, ("api", "api"), ("worker", "worker", "--loglevel", "INFO")):
                yield st
    else:
        with embedded_up(home, tiny_models) as st:
            yield st


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        yield c


def _db_session(stack):
    from specq.storage import db

    return db.session(stack.database_url)


def test_submit_wait_prints_answer_and_rest_gives_same_object(stack, client, tmp_path):
    doc = tmp_path / "math_utils.py"
    doc.write_text(DOC)
    r = stack.cli("submit", str(doc), "-q", QUESTION, "--max-tokens", "8", "--seed", "1", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr + stack.log("worker") + stack.log("up")
    assert "phases" in r.stdout and "sparse_prefill" in r.stdout and "total" in r.stdout

    page = client.get("/v1/jobs", params={"status": "succeeded", "limit": 1}).json()
    job_id = page["data"][0]["id"]
    job = wait_job(client, job_id)
    assert job["status"] == "succeeded" and job["error"] is None
    assert job["input"] == {"filename": "math_utils.py", "size_bytes": len(DOC.encode()), "question": QUESTION,
                            "document_id": None}
    assert job["params"]["max_tokens"] == 8 and job["attempts"] == 1
    assert job["queue_wait_ms"] is not None and job["queue_wait_ms"] >= 0
    result = job["result"]
    assert result["usage"]["completion_tokens"] <= 8
    assert result["text"].strip() == "" or result["text"].strip().splitlines()[0] in r.stdout

    # `specq result --json` is the same object the REST API returns
    rj = stack.cli("result", job_id, "--json", check=True)
    assert json.loads(rj.stdout) == result
    # `specq status` shows it succeeded
    assert "succeeded" in stack.cli("status", job_id, check=True).stdout

    # the timings are rows (job_id, phase, ms), one per timings_ms key
    from specq.storage.models import PhaseTiming

    with _db_session(stack) as s:
        rows = {p: ms for p, ms in s.execute(select(PhaseTiming.phase, PhaseTiming.ms).where(PhaseTiming.job_id == job_id))}
    assert rows.keys() == result["timings_ms"].keys()
    assert {"tokenize", "sparse_prefill", "decode", "total"} <= rows.keys()
    for phase, ms in rows.items():
        assert ms == pytest.approx(result["timings_ms"][phase], abs=1e-3)


def test_submit_json_and_poll(stack, client):
    r = client.post("/v1/jobs", json={"text": DOC, "question": QUESTION, "params": {"max_tokens": 4, "seed": 2}})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["status"] == "queued" and body["id"].startswith("job_")
    assert r.headers["location"] == f"/v1/jobs/{body['id']}"
    job = wait_job(client, body["id"])
    assert job["status"] == "succeeded", job
    assert set(job["result"]) >= {"text", "finish_reason", "usage", "timings_ms", "spec", "engine", "draft"}
    assert job["result"]["engine"]["target"] == "target.gguf"


def test_too_long_fails_with_message_and_worker_keeps_serving(stack, client):
    # byte-level vocabulary: ~1 token per byte, far over the worker's 4096-token context
    long_doc = "x = 1\n" * 1000
    r = client.post("/v1/jobs", json={"text": long_doc, "question": "?", "params": {"max_tokens": 4}})
    assert r.status_code == 202
    failed = wait_job(client, r.json()["id"])
    assert failed["status"] == "failed"
    assert "exceeds the target's context of 4096 tokens" in failed["error"]
    assert failed["attempts"] == 1  # bad input is never retried
    assert failed["result"] is None

    # the CLI says the same, in one line, exit 1
    res = stack.cli("result", failed["id"])
    assert res.returncode == 1 and "exceeds the target's context" in res.stderr and "Traceback" not in res.stderr

    ok = client.post("/v1/jobs", json={"text": DOC, "question": QUESTION, "params": {"max_tokens": 4}}).json()
    assert wait_job(client, ok["id"])["status"] == "succeeded"


def test_cancel_queued_and_running(stack, client):
    from specq.storage.models import PhaseTiming, Result

    # a long job keeps the (single) worker busy ...
    blocker = client.post("/v1/jobs", json={"text": DOC, "question": QUESTION,
                                            "params": {"max_tokens": 3500, "seed": 3}}).json()
    wait_job(client, blocker["id"], until=lambda j: j["status"] == "running" and (j["progress"]["phase"] == "decode"))
    # ... so the next one stays queued: cancelling it is immediate
    victim = client.post("/v1/jobs", json={"text": DOC, "question": QUESTION, "params": {"max_tokens": 4}}).json()
    r = client.delete(f"/v1/jobs/{victim['id']}")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    # cancelling the running one stops it at its next token
    r = client.delete(f"/v1/jobs/{blocker['id']}")
    assert r.status_code == 200 and r.json()["cancel_requested"] is True
    stopped = wait_job(client, blocker["id"], timeout=30)
    assert stopped["status"] == "cancelled", stopped
    assert stopped["progress"]["done"] < 3500  # stopped before its max_tokens

    # the worker takes the cancelled job's message, does nothing, and serves the next job
    nxt = client.post("/v1/jobs", json={"text": DOC, "question": QUESTION, "params": {"max_tokens": 4}}).json()
    assert wait_job(client, nxt["id"])["status"] == "succeeded"
    v = client.get(f"/v1/jobs/{victim['id']}").json()
    assert v["status"] == "cancelled" and v["started_at"] is None and v["result"] is None
    with _db_session(stack) as s:
        for jid in (victim["id"], blocker["id"]):
            assert s.scalar(select(Result.job_id).where(Result.job_id == jid)) is None
            assert s.scalars(select(PhaseTiming).where(PhaseTiming.job_id == jid)).all() == []
    # a finished job cannot be cancelled
    r = client.delete(f"/v1/jobs/{nxt['id']}")
    assert r.status_code == 409 and "already succeeded" in r.json()["error"]["message"]
    res = stack.cli("cancel", victim["id"], check=True)
    assert "cancelled" in res.stdout


def test_listing_and_cli_jobs(stack, client):
    page = client.get("/v1/jobs", params={"status": "cancelled,failed"}).json()
    assert page["object"] == "list" and all(j["status"] in ("cancelled", "failed") for j in page["data"])
    r = stack.cli("jobs", "--limit", "5", check=True)
    assert "job_" in r.stdout


def test_cli_without_api_says_start_it():
    import subprocess
    import sys

    from service_helpers import REPO, free_port

    url = f"http://127.0.0.1:{free_port()}"
    r = subprocess.run([sys.executable, "-m", "specq", "status", "job_x"], env={"SPECQ_API_URL": url, "PATH": "/usr/bin"},
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: no specq API at {url}: start it with `specq up` (or set SPECQ_API_URL)"
