"""A worker SIGKILLed mid-unit of a calibration (POST /v1/calibrations): the unit is a job, so the reconciler of
the next worker requeues it once its heartbeat is stale; it reruns once (attempts 2) and its calibration's rows
are written once. On the embedded default (SQLite store, SQLAlchemy broker), with the fault stacks' settings
(tests/fault_helpers.py: SPECQ_STALE_AFTER 8 s, reconcile every second)."""

from __future__ import annotations

import httpx
import pytest

from fault_helpers import fault_stack, job_row, kill9, start_worker, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

#: ~9,300 tokens of code (tests/test_reliability_kill.py's): each of the unit's passes takes a while on the tiny models
LONG_DOC = "".join(f"def handler_{i}(request):\n    return request.get('field_{i}', {i})\n\n" for i in range(150))


def test_a_unit_whose_worker_is_killed_reruns_once_and_its_rows_are_written_once(tiny_models, tmp_path):
    st = fault_stack(tmp_path, tiny_models, SPECQ_N_CTX="12288", SPECQ_CACHE_BYTES="0")
    st.cli("db", "upgrade", check=True)
    try:
        st.start("api", "api")
        st.wait_healthy()
        start_worker(st, "worker-1")
        with httpx.Client(base_url=st.url, timeout=30) as c:
            made = c.post("/v1/calibrations", json={"lines": [{"text": LONG_DOC, "question": "Which function reads field_7?"}],
                                                    "keep": [0.3], "lengths": [16384], "max_tokens": 8})
            assert made.status_code == 201, made.text
            cal_id = made.json()["id"]
            unit_id = next(j["id"] for j in c.get("/v1/jobs").json()["data"] if j["kind"] == "calibration")

            def mid_unit():
                job = job_row(st, unit_id)
                return job.status == "running" and (job.progress_phase or "").startswith(("baseline", "specprefill")) and job

            killed_in = wait_for(mid_unit, 240, f"unit {unit_id} in one of its passes", interval=0.05)
            kill9(st, "worker-1")
            start_worker(st, "worker-2")
            wait_for(lambda: job_row(st, unit_id).attempts == 2, 240, f"unit {unit_id} claimed again")

            def finished():
                cal = c.get(f"/v1/calibrations/{cal_id}").json()
                return cal["status"] in ("succeeded", "failed") and cal

            cal = wait_for(finished, 600, f"calibration {cal_id} finished", interval=0.5)
            stored = [d for d in c.get("/v1/evidence").json()["data"] if d["origin"] == "store"]
        unit = job_row(st, unit_id)
        assert cal["status"] == "succeeded" and cal["progress"]["done"] == 1, (cal, st.log("worker-2")[-3000:])
        assert unit.status == "succeeded" and unit.attempts == 2, unit.to_dict()
        assert f"reconciler: job {unit_id} requeued" in st.log("worker-2")
        assert {r["metric"] for r in cal["rows"]} == {"agreement", "token_f1", "loglik_delta"}
        assert sorted(d["id"] for d in stored) == sorted(r["id"] for r in cal["rows"]) and len(stored) == 3
        print(f"\nunit killed in {killed_in.progress_phase} {killed_in.progress_done}/{killed_in.progress_total}; reran once")
    finally:
        st.stop()
