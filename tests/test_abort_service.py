"""Cancel and the time limit end a job inside one long llama_decode call: a real `specq api` +
`specq worker` (Celery's solo pool) on PostgreSQL/Redis, the real 1.5B target on the CPU, each job's
prefill one 4,096-token call (SPECQ_N_BATCH = SPECQ_CALL_TOKENS = 4096: ~45 s uncancelled on 2 cores;
before the abort callback a cancel or the time limit waited for the whole call)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from service_helpers import Stack, base_env, free_port, pg_database, redis_pg_env, require_servers, running

pytestmark = [pytest.mark.services, pytest.mark.real_models]

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "python-license.txt").read_text()
TIME_LIMIT = 6.0


def _real_paths() -> tuple[str, str]:
    from specq.engine import models

    paths = []
    for name in (models.DEFAULT_TARGET, models.DEFAULT_SPECULATOR):
        if models.model_status(name).state not in ("verified", "present (not hashed)"):
            pytest.skip(f"{name} not pulled (run `specq models pull`)")
        paths.append(str(models.resolve_model(name)))
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    require_servers()
    target, speculator = _real_paths()
    home = tmp_path_factory.mktemp("abort")
    port = free_port()
    with pg_database() as pg_url:
        env = base_env(home, tiny_models, SPECQ_API_PORT=str(port), SPECQ_TARGET=target, SPECQ_SPECULATOR=speculator,
                       SPECQ_N_CTX="8192", SPECQ_N_BATCH="4096", SPECQ_CALL_TOKENS="4096",
                       SPECQ_TIME_LIMIT=f"{TIME_LIMIT:g}", SPECQ_WARM_UP="0", SPECQ_PROGRESS_INTERVAL="0.2",
                       SPECQ_CONCURRENCY="1", **redis_pg_env(pg_url, "specq-abort"))
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        with running(st, ("api", "api"), ("worker", "worker")):
            yield st


def _doc() -> str:
    """About 4,000 tokens of the real tokenizer (the license text repeated)."""
    return (TEXT + "\n") * 2


def _poll(c: httpx.Client, job_id: str, until, timeout: float = 300.0, every: float = 0.05) -> tuple[dict, float]:
    deadline = time.monotonic() + timeout
    while True:
        job = c.get(f"/v1/jobs/{job_id}").json()
        if until(job):
            return job, time.monotonic()
        assert time.monotonic() < deadline, job
        time.sleep(every)


def test_cancel_during_a_long_prefill_ends_the_job_within_2s(stack):
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        job_id = c.post("/v1/jobs", json={"text": _doc(), "params": {"mode": "baseline", "max_tokens": 4}}).json()["id"]
        job, _ = _poll(c, job_id, lambda j: j["status"] == "running" and j["progress"]["phase"] == "sparse_prefill")
        time.sleep(1.0)  # well inside the one 4,096-token call
        r = c.delete(f"/v1/jobs/{job_id}")
        t_cancel = time.monotonic()
        assert r.status_code == 200, r.text
        job, t_end = _poll(c, job_id, lambda j: j["status"] in ("succeeded", "failed", "cancelled"))
    assert job["status"] == "cancelled", job
    assert t_end - t_cancel < 2.0, f"cancelled {t_end - t_cancel:.2f} s after the request"
    print(f"cancel request → cancelled {t_end - t_cancel:.3f} s")


def test_time_limit_ends_a_long_prefill_on_the_solo_pool(stack):
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        job_id = c.post("/v1/jobs", json={"text": _doc(), "params": {"mode": "baseline", "max_tokens": 4}}).json()["id"]
        _, t_running = _poll(c, job_id, lambda j: j["status"] == "running")
        job, t_end = _poll(c, job_id, lambda j: j["status"] in ("succeeded", "failed", "cancelled"))
    assert job["status"] == "failed" and job["attempts"] == 1, job
    assert job["error"] == f"job exceeded the time limit of {TIME_LIMIT:g}s (SPECQ_TIME_LIMIT)"
    # running was seen at most one poll after the start: the job ended within 2 s of its deadline
    assert t_end - t_running < TIME_LIMIT + 2.0, f"ended {t_end - t_running - TIME_LIMIT:.2f} s after the limit"
    print(f"time limit {TIME_LIMIT:g}s → failed after {t_end - t_running:.3f} s running")
