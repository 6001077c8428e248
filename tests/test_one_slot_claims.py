"""Two defects seen when 8 chat requests reached the embedded default stack at once (one worker, one
slot; bench/results/cpu-followup-latency-2026-12-06-before-t0-hang.log, docs/reliability.md):

1. The claim failed with "database is locked": the worker's claim ran its UPDATE inside the read
   transaction its evidence refresh had left open, and SQLite refuses to turn a read transaction into
   a write one at once (no busy wait) when another connection (the API adding jobs) wrote since.
   `claims.claim_next` now commits whatever its caller left open, so each claim step is a write
   transaction of its own (BEGIN IMMEDIATE, which waits on the busy timeout).
2. Two jobs ran on the one Engine at once: on the embedded broker Celery's solo pool runs a message
   with a countdown (a retry, a store error's re-send) on its timer thread, beside the task running
   on the main thread. The runs corrupted each other (llama_decode returned -1, a "success" in
   24 ms) and one job stayed `running` with the worker idle. A delivery now waits for the one slot.
"""

from __future__ import annotations

import time
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import select

from specq.storage import claims, db, jobs
from specq.storage.models import Job

from service_helpers import embedded_up, wait_job


def test_a_claim_after_a_read_left_open_waits_for_the_lock_instead_of_failing(store):
    with db.session() as s, db.session() as api:
        job_id = jobs.create_job(s, text="x = 1\n", params={}).id
        s.scalar(select(Job.status).where(Job.id == job_id))  # the worker's read before its claim (left open)
        jobs.create_job(api, text="y = 2\n", params={})  # the API adds a job meanwhile (commits)
        claim = claims.claim_next(s, job_id, "w:1", queue=None)
        assert claim is not None and claim.job_id == job_id
        assert jobs.get_job(s, job_id).status == "running"
