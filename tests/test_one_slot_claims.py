"""Two defects seen when 8 chat requests reached the embedded default stack at once (one worker, one
slot; bench/results/cpu-followup-latency-2026-12-06-before-t0-hang.log, docs/reliability.md):

1. The claim failed with "database is locked": the worker's claim ran its UPDATE inside the read
   transaction its evidence refresh had left open, and SQLite refuses to turn a read transaction into
   a write one at once (no busy wait) when another connection (the API adding jobs) wrote since.
   `claims.claim_next` now commits whatever its caller left open, so each claim step is a write
   transaction of its own (BEGIN IMMEDIATE, which waits on the busy timeout). SQLite only: PostgreSQL
   turns a read transaction into a write one without such an error.
2. Two jobs ran on the one Engine at once: on the embedded broker Celery's solo pool runs a message
   with a countdown (a retry, a store error's re-send) on its timer thread, beside the task running
   on the main thread. The runs corrupted each other (llama_decode returned -1, a "success" in
   24 ms) and one job stayed `running` with the worker idle. A delivery now waits for the one slot.
   The service test runs `specq up` as a user does (tiny models in the worker process, as the other
   embedded-stack tests, unmarked); on the old code it failed with an attempt lost to "no logits for
   token 0 of the last batch", and in another run with a job stuck `running` in sparse_prefill 0/465
   for 90 s: the hang of the measurement.
"""

from __future__ import annotations

from datetime import timezone

import httpx
import pytest
from sqlalchemy import select

from specq.storage import claims, db, jobs
from specq.storage.models import Job

from service_helpers import embedded_up, wait_job


def test_a_claim_after_a_read_left_open_waits_for_the_lock_instead_of_failing(store):
    """Defect 1 (module doc), on the SQLite store."""
    with db.session() as s, db.session() as api:
        job_id = jobs.create_job(s, text="x = 1\n", params={}).id
        s.scalar(select(Job.status).where(Job.id == job_id))  # the worker's read before its claim (left open)
        jobs.create_job(api, text="y = 2\n", params={})  # the API adds a job meanwhile (commits)
        claim = claims.claim_next(s, job_id, "w:1", queue=None)
        assert claim is not None and claim.job_id == job_id
        assert jobs.get_job(s, job_id).status == "running"


def _interval(s, job_id: str):
    """The job's (start, end) in epoch seconds, status and attempts."""
    job = s.get(Job, job_id)
    s.commit()
    epoch = [(t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp() for t in (job.started_at, job.finished_at)]
    return *epoch, job.status, job.attempts


def test_a_countdown_message_waits_for_the_one_slot_on_the_embedded_broker(tmp_path, tiny_models, monkeypatch):
    """`specq up` on the embedded default (solo pool, one slot): a job's message with a countdown is
    due while another job runs. Each job runs once, one after the other, and both succeed."""
    from specq.broker import enqueue_job
    from specq.settings import ServiceSettings

    countdown = 0.3
    with embedded_up(tmp_path, tiny_models, SPECQ_WARM_UP="0") as st:
        url = st.database_url
        params = {"question": "what?", "max_tokens": 600, "ignore_eos": True, "mode": "baseline", "seed": 1}
        with db.session(url) as s:
            a = jobs.create_job(s, text="def f(x):\n    return x\n" * 20, params=params).id
            b = jobs.create_job(s, text="def g(y):\n    return y\n" * 20, params=params).id
        monkeypatch.setenv("SPECQ_HOME", st.env["SPECQ_HOME"])  # the embedded broker's file is under it
        settings = ServiceSettings.from_env(st.env)
        enqueue_job(b, settings, countdown=countdown)  # received first, held on the worker's timer
        enqueue_job(a, settings)  # runs on the main thread while b's message comes due
        with httpx.Client(base_url=st.url, timeout=10) as c:
            done = {j: wait_job(c, j, timeout=90) for j in (a, b)}
        with db.session(url) as s:
            (s1, f1, *r1), (s2, f2, *r2) = sorted((_interval(s, j) for j in (a, b)), key=lambda r: r[0])
        log = st.log("up")
    assert [d["status"] for d in done.values()] == ["succeeded", "succeeded"], (done, log[-4000:])
    assert s2 >= f1, f"two jobs ran at once on the one slot: {s1:.2f}..{f1:.2f} and {s2:.2f}..{f2:.2f}"
    assert r1 == r2 == ["succeeded", 1], (r1, r2, log[-4000:])  # one attempt each: no decode failure, no retry
    # not vacuous: the countdown's message was run while the other job held the slot, and waited
    assert "waiting for a free slot" in log, log[-4000:]
