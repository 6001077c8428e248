"""Broker, database and API restarts mid-batch, with real processes on throwaway servers.

* Redis is killed (SIGKILL) and started again while 20 jobs are queued and one is running, then the
  API is killed and started again: all 20 complete, none runs twice, the running job is not touched.
  Redis keeps its queue in an append-only file synced on every write (tests/fault_servers.py).
* PostgreSQL crashes (`pg_ctl stop -m immediate`) and comes back while the worker is finishing jobs:
  the worker's result write is retried until the server is back, and all 20 complete.

Each test records its counts in docs/reliability-figures.*.
"""

from __future__ import annotations

import time

import httpx
import pytest

from fault_helpers import (all_finished, api_on_throwaway_servers, job_row, kill9, start_worker, statuses, wait_for,
                           worker_logs)
from fault_servers import servers_available
from reliability_figures import record, tally

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

N_JOBS = 20
DOC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
#: ~1.5 s per job on the tiny models (1,500 tokens): a job is always running when a server goes down
PARAMS = {"max_tokens": 1500, "seed": 5}


@pytest.fixture
def servers(tiny_models, tmp_path):
    reason = servers_available()
    if reason:
        pytest.skip(reason)
    with api_on_throwaway_servers(tmp_path, tiny_models) as (st, redis, pg):
        start_worker(st, "worker")
        st.wait_healthy()
        yield st, redis, pg


def _submit_batch(st) -> list[str]:
    with httpx.Client(base_url=st.url, timeout=30) as client:
        ids = []
        for i in range(N_JOBS):
            r = client.post("/v1/jobs", json={"text": DOC, "question": f"Question {i}: what does add do?",
                                              "params": PARAMS})
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
    return ids


def _running(st, ids):
    from sqlalchemy import select

    from specq.storage import db
    from specq.storage.models import Job

    with db.session(st.database_url) as s:
        job_id = s.scalar(select(Job.id).where(Job.id.in_(ids), Job.status == "running"))
        s.commit()
    return job_id


def _counts(st, ids):
    from specq.storage import db

    with db.session(st.database_url) as s:
        return tally(s, ids, worker_logs(st))


def _attempts(st, ids) -> dict[int, int]:
    out: dict[int, int] = {}
    for job_id in ids:
        a = job_row(st, job_id).attempts
        out[a] = out.get(a, 0) + 1
    return out


def test_redis_restart_then_api_restart_mid_batch(servers):
    st, redis, _pg = servers
    ids = _submit_batch(st)
    t0 = time.monotonic()
    wait_for(lambda: statuses(st, ids).get("succeeded", 0) >= 3 and _running(st, ids), 300, "3 jobs done, one running")
    before = statuses(st, ids)
    down_s = redis.restart(down_for=2.0)  # SIGKILL, 2 s down, start on the same append-only file
    # the API restarts too (SIGKILL): a running job must not notice
    running = wait_for(lambda: _running(st, ids), 120, "a running job after the Redis restart")
    running_before = job_row(st, running)
    kill9(st, "api")
    st.start("api", "api")
    st.wait_healthy(timeout=120)
    wait_for(lambda: all_finished(st, ids), 600, "all jobs finished", interval=0.5)
    wall = time.monotonic() - t0
    running_after = job_row(st, running)
    counts = _counts(st, ids)
    attempts = _attempts(st, ids)
    assert counts == {"submitted": N_JOBS, "completed": N_JOBS, "failed": 0, "duplicated": 0, "lost": 0}, \
        (counts, worker_logs(st)[-4000:])
    assert attempts == {1: N_JOBS}, attempts  # none ran twice
    assert running_after.status == "succeeded" and running_after.worker == running_before.worker
    record("redis_restart", counts, done_before_restart=before.get("succeeded", 0),
           queued_at_restart=before.get("queued", 0), redis_down_s=round(down_s, 1),
           attempts={str(k): v for k, v in attempts.items()}, wall_s=round(wall, 1))


def test_postgres_restart_while_results_are_written(servers):
    st, _redis, pg = servers
    ids = _submit_batch(st)
    t0 = time.monotonic()
    wait_for(lambda: statuses(st, ids).get("succeeded", 0) >= 3 and _running(st, ids), 300, "3 jobs done, one running")
    before = statuses(st, ids)
    down_s = pg.restart(down_for=5.0)  # crash (immediate), 5 s down: the running job finishes meanwhile
    wait_for(lambda: all_finished(st, ids), 600, "all jobs finished", interval=0.5)
    wall = time.monotonic() - t0
    logs = worker_logs(st)
    counts = _counts(st, ids)
    retried = logs.count("saving the result failed (")
    assert counts == {"submitted": N_JOBS, "completed": N_JOBS, "failed": 0, "duplicated": 0, "lost": 0}, \
        (counts, logs[-4000:])
    # the result computed while the server was down was written once it was back
    assert "saving the result went through after" in logs, logs[-4000:]
    attempts = _attempts(st, ids)
    record("postgres_restart", counts, done_before_restart=before.get("succeeded", 0),
           postgres_down_s=round(down_s, 1), result_write_retries=retried,
           attempts={str(k): v for k, v in attempts.items()}, wall_s=round(wall, 1))
