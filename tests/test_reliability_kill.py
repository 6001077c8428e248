"""Workers killed with SIGKILL mid-job, with real processes: the job is redelivered and completes once.

On throwaway Redis + PostgreSQL servers (and once on the embedded broker), a worker is killed while
its job is in the scoring phase or in decode; a second worker is started, its reconciler finds the job
whose heartbeat stopped, requeues it and the job completes: exactly one result row, attempts = 2.
Killed on every attempt, the job fails with a clear message once `max_attempts` are used, through
`specq reconcile` with no worker left (`/metrics` counts it in `specq_jobs_stale` until then). Each test records its counts in docs/reliability-figures.*.
"""

from __future__ import annotations

import time

import httpx
import pytest

from fault_helpers import api_on_throwaway_servers, fault_stack, job_row, kill9, start_worker, wait_for, worker_logs
from fault_servers import servers_available
from reliability_figures import record, tally

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

QUESTION = "Which function handles the request?"
#: ~9,300 tokens of code scored in 145 windows of 64 tokens with 64 lookahead steps each: ~5 s of
#: scoring on the tiny models (one thread), long enough to be killed in it
LONG_DOC = "".join(f"def handler_{i}(request):\n    return request.get('field_{i}', {i})\n\n" for i in range(150))
SCORING = {"mode": "specprefill", "window": 64, "lookahead": 64, "max_tokens": 8, "seed": 1}
#: 2,500 decoded tokens: ~5 s on the tiny models (one thread), long enough to be killed in it
DECODE = {"mode": "baseline", "max_tokens": 2500, "seed": 3}
#: room for LONG_DOC and for DECODE
N_CTX = "12288"
SHORT_DOC = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    reason = servers_available()
    if reason:
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("kill")
    with api_on_throwaway_servers(home, tiny_models, SPECQ_N_CTX=N_CTX) as (st, _redis, _pg):
        st.wait_healthy()
        yield st


@pytest.fixture(scope="module")
def embedded(tiny_models, tmp_path_factory):
    """`specq api` + workers on the embedded default: SQLite store, SQLAlchemy broker, one SPECQ_HOME."""
    home = tmp_path_factory.mktemp("kill_embedded")
    st = fault_stack(home, tiny_models, SPECQ_N_CTX=N_CTX)
    st.cli("db", "upgrade", check=True)
    try:
        st.start("api", "api")
        st.wait_healthy()
        yield st
    finally:
        st.stop()


def _submit(client: httpx.Client, text: str, params: dict) -> str:
    r = client.post("/v1/jobs", json={"text": text, "question": QUESTION, "params": params})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _in_phase(st, job_id: str, phase: str, attempt: int, min_done: int = 0):
    def check():
        job = job_row(st, job_id)
        return (job.status == "running" and job.attempts == attempt and job.progress_phase == phase
                and job.progress_done >= min_done)
    return wait_for(check, 240, f"job {job_id} in {phase} (attempt {attempt})", interval=0.05)


def _kill_then_recover(st, name: str, text: str, params: dict, phase: str, min_done: int) -> None:
    w1, w2 = f"worker-{name}-1", f"worker-{name}-2"
    start_worker(st, w1)
    with httpx.Client(base_url=st.url, timeout=30) as client:
        job_id = _submit(client, text, params)
        _in_phase(st, job_id, phase, attempt=1, min_done=min_done)
        killed_in = job_row(st, job_id)
        kill9(st, w1)
        t_kill = time.monotonic()
        start_worker(st, w2)
        # the new worker's reconciler requeues the job once its heartbeat is SPECQ_STALE_AFTER old
        wait_for(lambda: job_row(st, job_id).attempts == 2, 240, f"job {job_id} claimed again")
        t_reclaimed = time.monotonic() - t_kill
        job = wait_for(lambda: (j := job_row(st, job_id)).status in ("succeeded", "failed") and j, 600,
                       f"job {job_id} finished")
        t_done = time.monotonic() - t_kill
        view = client.get(f"/v1/jobs/{job_id}").json()
        metrics = client.get("/metrics").text
    from specq.storage import db

    with db.session(st.database_url) as s:
        counts = tally(s, [job_id], worker_logs(st))
    assert job.status == "succeeded", (job.to_dict(), worker_logs(st)[-4000:])
    assert job.attempts == 2 and counts == {"submitted": 1, "completed": 1, "failed": 0, "duplicated": 0, "lost": 0}
    assert view["result"] is not None and view["attempts"] == 2
    assert f"reconciler: job {job_id} requeued" in st.log(w2)
    # the live worker's heartbeat is in /metrics
    assert "specq_worker_heartbeat_timestamp_seconds{" in metrics and "specq_worker_busy{" in metrics
    record(f"kill_worker_{name}", counts, killed_at=f"{killed_in.progress_phase} {killed_in.progress_done}/"
           f"{killed_in.progress_total}", reclaimed_after_s=round(t_reclaimed, 1), completed_after_s=round(t_done, 1),
           attempts=job.attempts)
    kill9(st, w2)


def test_kill_during_scoring_then_completes_once(stack):
    _kill_then_recover(stack, "scoring", LONG_DOC, SCORING, "score", min_done=5)


def test_kill_during_decode_then_completes_once(stack):
    _kill_then_recover(stack, "decode", SHORT_DOC, DECODE, "decode", min_done=20)


def test_killed_on_every_attempt_fails_with_a_clear_message(stack):
    """max_attempts 2: killed in attempt 1, requeued, killed in attempt 2; with no worker left,
    `specq reconcile` fails it (instead of requeueing it forever)."""
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        start_worker(stack, "worker-max-1")
        job_id = _submit(client, SHORT_DOC, DECODE)
        _in_phase(stack, job_id, "decode", attempt=1, min_done=20)
        kill9(stack, "worker-max-1")
        start_worker(stack, "worker-max-2")
        _in_phase(stack, job_id, "decode", attempt=2, min_done=20)
        kill9(stack, "worker-max-2")
        t_kill = time.monotonic()
        # no worker left, so no reconciler: /metrics shows the abandoned job
        wait_for(lambda: "specq_jobs_stale 1.0" in client.get("/metrics").text, 120, "specq_jobs_stale 1", interval=0.5)

        def reconciled():
            r = stack.cli("reconcile", check=True)
            return job_id in r.stdout and r

        r = wait_for(reconciled, 120, "specq reconcile failing the job", interval=1.0)
        t_failed = time.monotonic() - t_kill
        view = client.get(f"/v1/jobs/{job_id}").json()
    assert f"{job_id}\tfailed" in r.stdout and "1 failed" in r.stderr
    assert view["status"] == "failed" and view["attempts"] == 2
    assert view["error"].startswith("failed after 2 attempts: worker ")
    assert "stopped heartbeating during decode (last heartbeat 20" in view["error"]
    # a later sweep leaves it alone
    assert job_id not in stack.cli("reconcile", check=True).stdout
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        assert "specq_jobs_stale 0.0" in client.get("/metrics").text
    from specq.storage import db

    with db.session(stack.database_url) as s:
        counts = tally(s, [job_id], worker_logs(stack))
    assert counts == {"submitted": 1, "completed": 0, "failed": 1, "duplicated": 0, "lost": 0}
    record("kill_worker_max_attempts", counts, failed_after_s=round(t_failed, 1), error=view["error"][:90] + "…")


def test_kill_on_the_embedded_broker_then_completes_once(embedded):
    """kombu's SQLAlchemy transport never redelivers a killed worker's message; the reconciler re-sends it."""
    _kill_then_recover(embedded, "embedded", SHORT_DOC, DECODE, "decode", min_done=20)


def test_cancel_during_scoring_stops_it_and_frees_the_worker(stack):
    """A cancel lands while the job scores: it stops at the next scoring window (not after the whole
    phase), nothing is saved, and the same worker runs the next job."""
    start_worker(stack, "worker-cancel")
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        job_id = _submit(client, LONG_DOC, SCORING)
        _in_phase(stack, job_id, "score", attempt=1, min_done=5)
        assert client.delete(f"/v1/jobs/{job_id}").json()["cancel_requested"] is True
        job = wait_for(lambda: (j := job_row(stack, job_id)).status != "running" and j, 120, "job stopped")
        assert job.status == "cancelled" and job.attempts == 1
        assert job.progress_phase == "score" and job.progress_done < job.progress_total
        nxt = _submit(client, SHORT_DOC, {"max_tokens": 4})
        done = wait_for(lambda: (j := job_row(stack, nxt)).status == "succeeded" and j, 120, "next job done")
    assert done.worker == job.worker and job.error == "cancelled while running"  # the same worker, freed
    kill9(stack, "worker-cancel")
