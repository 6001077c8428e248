"""A hung engine thread is not invisible (issue 44 item 11): the worker's watchdog (worker/watchdog.py)
exits the process when the engine has not stepped since a job's deadline + grace, and the job is then
requeued by the reconciler while attempts remain, else failed with a message.

The end-to-end test blocks the engine loop through an injected test seam (tests/seamed_worker.py,
engine/serving/seams.py: `before_step`), on the real Redis + a throwaway PostgreSQL database, tiny
models on the CPU, with the fault tests' fast settings (stale after 8 s, a sweep every second, 2
attempts) and a 4 s time limit + 2 s grace."""

from __future__ import annotations

import httpx
import pytest

from fault_helpers import FAULT_ENV, job_row, kill9, start_seamed_worker, start_slots_worker, wait_for
from service_helpers import Stack, base_env, free_port, pg_database, redis_pg_env, require_servers

pytestmark = [pytest.mark.timeout(600)]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_watchdog_fires_only_past_a_deadline_plus_grace_without_a_step_for_the_grace():
    from specq.worker.watchdog import Watchdog

    clock, steps = Clock(), [0]
    wd = Watchdog(lambda: steps[0], grace=5.0, clock=clock, exit=lambda code: None)
    assert wd.check() is None
    wd.enter("a", deadline=110.0)
    clock.t = 116.0  # past deadline + grace, but the engine stepped just now: it is alive
    steps[0] += 1
    assert wd.check() is None
    clock.t = 120.0  # no step for 4 s <= grace
    assert wd.check() is None
    clock.t = 121.5  # stuck since 116 (it stepped once after the deadline, then no more): > grace
    why = wd.check()
    assert why and "job a" in why
    wd.leave("a")
    wd.enter("b", deadline=140.0)
    clock.t = 144.0
    assert wd.check() is None  # within the grace
    clock.t = 145.5
    why = wd.check()
    assert why and "job b" in why and "SPECQ_WATCHDOG_GRACE" in why
    wd.leave("b")
    assert wd.check() is None and wd.stalled_s() == 0.0  # the engine holds nothing: idle is not stuck


def test_a_stuck_engine_loop_exits_the_worker_and_its_job_is_requeued_then_failed(tiny_models, tmp_path):
    from specq.worker.watchdog import EXIT_CODE

    require_servers()
    port = free_port()
    with pg_database() as pg:
        env = base_env(tmp_path, tiny_models, SPECQ_API_PORT=str(port), **FAULT_ENV, **redis_pg_env(pg, "watchdog"))
        env.update(SPECQ_TIME_LIMIT="4", SPECQ_WATCHDOG_GRACE="2")
        st = Stack(env=env, port=port, logdir=tmp_path)
        st.cli("db", "upgrade", check=True)
        try:
            st.start("api", "api")
            st.wait_healthy()
            with httpx.Client(base_url=st.url, timeout=30) as client:
                w1 = start_seamed_worker(st, "worker-1", 2, blocks="HANG")
                r = client.post("/v1/jobs", json={"text": "def f(x):\n    return x\n" * 8, "question": "HANG",
                                                  "params": {"mode": "baseline", "max_tokens": 8}})
                assert r.status_code == 202, r.text
                job_id = r.json()["id"]
                wait_for(lambda: "the engine loop blocks" in st.log("worker-1"), 60, "worker-1's loop blocked")
                # the loop is stuck; the job's watcher still heartbeats, the time limit cannot end it:
                # the watchdog ends the process
                wait_for(lambda: w1.poll() is not None, 60, "the watchdog to end worker-1")
                assert w1.returncode == EXIT_CODE, st.log("worker-1")[-3000:]
                assert "watchdog: the engine has not stepped" in st.log("worker-1")
                assert job_row(st, job_id).status == "running"
                # its supervisor starts it again (still blocking on this question): its reconciler requeues
                # the job (attempt 1 of 2 lost), it claims it, blocks, and its watchdog ends it too
                w2 = start_seamed_worker(st, "worker-2", 2, blocks="HANG")
                wait_for(lambda: w2.poll() is not None, 90, "the watchdog to end worker-2")
                assert w2.returncode == EXIT_CODE
                assert "lost" in st.log("worker-2") or "requeued" in st.log("worker-2")
                row = job_row(st, job_id)
                assert row.status == "running" and row.attempts == 2, (row.status, row.attempts)
                # a third start, a plain worker: no attempts left, the reconciler fails the job with a message
                start_slots_worker(st, "worker-3", 2)
                row = wait_for(lambda: (j := job_row(st, job_id)).status == "failed" and j, 60, "the job failed")
                assert row.error.startswith("failed after 2 attempts: worker ") and "stopped heartbeating" in row.error
                view = client.get(f"/v1/jobs/{job_id}").json()
                assert view["status"] == "failed" and "stopped heartbeating" in view["error"]
                kill9(st, "worker-3")
        finally:
            st.stop()
