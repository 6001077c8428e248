"""API keys and tenant isolation, end to end: a real `specq api` (SPECQ_AUTH=keys) + `specq worker` on
the local Redis and a throwaway PostgreSQL database, tiny random-weight models. Nothing is mocked.

* `specq keys create | list | revoke`: the key is printed once, only its sha256 is stored, a revoked
  key answers 401 from its next request on;
* no key, a malformed header or an unknown key: 401 with a JSON error; /healthz needs no key;
* tenant B gets exactly the 404 of a nonexistent id for every tenant-A id on every endpoint (job,
  job cancel, batch, results, errors, stats, batch cancel), and nothing of A's changes; B's listings
  never show A's rows; an admin key sees both tenants; /metrics is admin only;
* the CLI sends SPECQ_API_KEY.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from sqlalchemy import select

from service_helpers import Stack, base_env, free_port, pg_database, redis_pg_env, require_servers, running, wait_job

pytestmark = pytest.mark.services

KEY_RE = re.compile(r"^sk-specq-[A-Za-z0-9_-]{43}$")


def create_key(st: Stack, tenant: str, *extra: str) -> str:
    r = st.cli("keys", "create", "--tenant", tenant, *extra, check=True)
    key = r.stdout.strip()
    assert KEY_RE.match(key), r.stdout
    return key


@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    require_servers()
    home = tmp_path_factory.mktemp("security")
    port = free_port()
    with pg_database() as pg_url:
        env = base_env(home, tiny_models, SPECQ_API_PORT=str(port), SPECQ_AUTH="keys",
                       **redis_pg_env(pg_url, "specq-sectest"))
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        st.keys = {"a": create_key(st, "team-a"), "b": create_key(st, "team-b"),
                   "admin": create_key(st, "ops", "--admin", "--name", "on call")}
        with running(st, ("api", "api"), ("worker", "worker", "--loglevel", "INFO")):
            yield st


def _client(stack, who: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {stack.keys[who]}"} if who else {}
    return httpx.Client(base_url=stack.url, timeout=30, headers=headers)


@pytest.fixture(scope="module")
def tenant_a(stack):
    """Tenant A's ids: a succeeded job, and a completed batch with one succeeded and one failed request."""
    with _client(stack, "a") as a:
        r = a.post("/v1/jobs", json={"text": "def secret():\n    return 42\n", "question": "What is returned?",
                                     "params": {"max_tokens": 3}})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        lines = [{"custom_id": "ok", "text": "x = 1\n", "question": "What is x?", "params": {"max_tokens": 2}},
                 # prompt + max_tokens over the worker's 4096-token context: fails in the worker
                 {"custom_id": "too-long", "text": "y = 2\n", "params": {"max_tokens": 5000}}]
        r = a.post("/v1/batches", content="\n".join(json.dumps(x) for x in lines),
                   headers={"content-type": "application/jsonl"})
        assert r.status_code == 200 and r.json()["status"] == "in_progress", r.text
        batch_id = r.json()["id"]
        wait_job(a, job_id)
        deadline = time.monotonic() + 120
        while a.get(f"/v1/batches/{batch_id}").json()["status"] != "completed":
            assert time.monotonic() < deadline, "tenant A's batch did not complete"
            time.sleep(0.2)
        results = a.get(f"/v1/batches/{batch_id}/results")
        errors = a.get(f"/v1/batches/{batch_id}/errors")
        assert results.status_code == 200 and '"custom_id": "ok"' in results.text
        assert errors.status_code == 200 and "too-long" in errors.text
    return {"job": job_id, "batch": batch_id}


def _endpoints(job_id: str, batch_id: str) -> list[tuple[str, str]]:
    return [("GET", f"/v1/jobs/{job_id}"), ("GET", f"/v1/jobs/{job_id}/document"), ("DELETE", f"/v1/jobs/{job_id}"),
            ("GET", f"/v1/batches/{batch_id}"), ("GET", f"/v1/batches/{batch_id}/results"),
            ("GET", f"/v1/batches/{batch_id}/results?format=csv"), ("GET", f"/v1/batches/{batch_id}/errors"),
            ("GET", f"/v1/batches/{batch_id}/stats"), ("POST", f"/v1/batches/{batch_id}/cancel")]


def test_another_tenants_ids_answer_the_404_of_a_missing_id(stack, tenant_a):
    a_job, a_batch = tenant_a["job"], tenant_a["batch"]
    ghost_job, ghost_batch = "job_" + "0" * 24, "batch_" + "0" * 24
    with _client(stack, "b") as b:
        for (method, path), (_, ghost_path) in zip(_endpoints(a_job, a_batch), _endpoints(ghost_job, ghost_batch)):
            theirs, missing = b.request(method, path), b.request(method, ghost_path)
            assert theirs.status_code == 404, (method, path, theirs.status_code, theirs.text)
            assert missing.status_code == 404, (method, ghost_path, missing.text)
            # the same body (with the id swapped) and the same headers: nothing tells "exists" from "doesn't"
            assert theirs.json() == json.loads(missing.text.replace(ghost_job, a_job).replace(ghost_batch, a_batch))
            assert theirs.json()["error"]["type"] == "not_found"
            assert sorted(theirs.headers.keys()) == sorted(missing.headers.keys())
    # B's cancels changed nothing of A's
    with _client(stack, "a") as a:
        assert a.get(f"/v1/jobs/{a_job}").json()["status"] == "succeeded"
        batch = a.get(f"/v1/batches/{a_batch}").json()
        assert batch["status"] == "completed" and batch["cancelling_at"] is None
        # and A reads every one of them (so the 404s above were about the tenant, not the ids)
        for method, path in _endpoints(a_job, a_batch):
            if method == "GET":
                assert a.get(path).status_code == 200, path


def test_listings_admin_and_metrics(stack, tenant_a):
    with _client(stack, "b") as b:
        r = b.post("/v1/jobs", json={"text": "b = 'mine'\n", "params": {"max_tokens": 2}})
        assert r.status_code == 202
        b_job = r.json()["id"]
        listed = b.get("/v1/jobs?limit=500").json()
        assert [j["id"] for j in listed["data"]] == [b_job] and listed["total"] == 1
        assert {j["tenant"] for j in listed["data"]} == {"team-b"}
        assert b.get("/v1/jobs?status=succeeded,failed,queued,running,cancelled").json()["total"] == 1
        assert b.get("/v1/batches").json()["data"] == []
        assert b.get("/v1/batches", params={"name": "x"}).json()["data"] == []
        metrics = b.get("/metrics")
        assert metrics.status_code == 403 and "admin" in metrics.json()["error"]["message"]
    with _client(stack, "a") as a:
        a_jobs = a.get("/v1/jobs?limit=500").json()
        assert b_job not in {j["id"] for j in a_jobs["data"]}
        assert {j["tenant"] for j in a_jobs["data"]} == {"team-a"} and a_jobs["total"] == 3  # 1 job + 2 batch requests
        assert [x["id"] for x in a.get("/v1/batches").json()["data"]] == [tenant_a["batch"]]
    with _client(stack, "admin") as admin:
        every = admin.get("/v1/jobs?limit=500").json()
        assert {j["tenant"] for j in every["data"]} == {"team-a", "team-b"} and every["total"] == 4
        assert admin.get(f"/v1/jobs/{tenant_a['job']}").json()["tenant"] == "team-a"
        assert admin.get(f"/v1/batches/{tenant_a['batch']}/stats").json()["count"] == 1
        assert admin.get("/metrics").status_code == 200
        # what an admin creates is its own tenant's
        r = admin.post("/v1/jobs", json={"text": "ops = 1\n", "params": {"max_tokens": 1}})
        assert admin.get(f"/v1/jobs/{r.json()['id']}").json()["tenant"] == "ops"
    with _client(stack, None) as anon:
        assert anon.get("/metrics").status_code == 401


def test_missing_malformed_unknown_and_revoked_keys(stack):
    with _client(stack, None) as c:
        assert c.get("/healthz").status_code == 200  # health checks need no key
        for headers, needle in [({}, "missing API key"), ({"Authorization": "Basic abc"}, "malformed"),
                                ({"Authorization": "Bearer"}, "malformed"),
                                ({"Authorization": "Bearer sk-specq-" + "x" * 43}, "unknown or revoked"),
                                ({"Authorization": "Bearer " + stack.keys["a"][:-1]}, "unknown or revoked")]:
            for method, path in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/batches"),
                                 ("GET", "/v1/jobs/job_x"), ("POST", "/v1/batches/batch_x/cancel")]:
                r = c.request(method, path, headers=headers)
                assert r.status_code == 401, (headers, method, path, r.text)
                assert needle in r.json()["error"]["message"] and r.json()["error"]["type"] == "unauthorized"
                assert r.headers["www-authenticate"] == "Bearer"

    # a key of its own, revoked while in use: 401 from the next request on
    key = create_key(stack, "short-lived")
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}) as c:
        assert c.get("/v1/jobs").status_code == 200
        listed = stack.cli("keys", "list", check=True).stdout
        key_id = next(line.split()[0] for line in listed.splitlines() if "short-lived" in line)
        assert key not in listed and key[:17] in listed  # only the first characters are shown
        out = stack.cli("keys", "revoke", key_id, check=True).stdout
        assert "revoked" in out
        r = c.get("/v1/jobs")
        assert r.status_code == 401 and "unknown or revoked" in r.json()["error"]["message"]
    assert "short-lived" not in stack.cli("keys", "list", check=True).stdout
    assert "short-lived" in stack.cli("keys", "list", "--revoked", check=True).stdout
    assert stack.cli("keys", "revoke", "key_doesnotexist").returncode == 1
    bad = stack.cli("keys", "create", "--tenant", "no spaces/allowed")
    assert bad.returncode == 1 and "bad tenant name" in bad.stderr


def test_only_hashes_are_stored(stack):
    import hashlib

    from specq.storage import db
    from specq.storage.models import ApiKey

    with db.session(stack.database_url) as s:
        rows = {r.tenant: r for r in s.scalars(select(ApiKey))}
    for who, tenant in (("a", "team-a"), ("b", "team-b"), ("admin", "ops")):
        secret = stack.keys[who]
        row = rows[tenant]
        assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
        stored = " ".join(str(v) for v in row.to_dict().values()) + row.key_hash
        assert secret not in stored and secret[len(row.prefix):] not in stored
    assert rows["ops"].admin and not rows["team-a"].admin and rows["ops"].name == "on call"


def test_cli_sends_specq_api_key(stack, tenant_a):
    st = stack
    env = dict(st.env)
    try:
        st.env = dict(env, SPECQ_API_KEY=st.keys["a"])
        assert tenant_a["job"] in st.cli("jobs", check=True).stdout
        assert "succeeded" in st.cli("status", tenant_a["job"], check=True).stdout
        st.env = dict(env, SPECQ_API_KEY=st.keys["b"])
        assert tenant_a["job"] not in st.cli("jobs", check=True).stdout
        r = st.cli("status", tenant_a["job"])
        assert r.returncode == 1 and f"no job {tenant_a['job']}" in r.stderr
        r = st.cli("results", tenant_a["batch"])
        assert r.returncode == 1 and "no batch" in r.stderr
        st.env = {k: v for k, v in env.items() if k != "SPECQ_API_KEY"}
        r = st.cli("jobs")
        assert r.returncode == 1 and "missing API key" in r.stderr
    finally:
        st.env = env
