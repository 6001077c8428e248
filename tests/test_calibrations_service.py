"""Issue 48 item 3, end to end: calibration through the service (POST /v1/calibrations; storage/calibrations.py,
worker/calibration.py) on a real API and worker (Redis + PostgreSQL, tiny models, API keys on, two serving
slots: a unit takes the engine alone while the engine loop is idle).

* bad input stores nothing: a tenant key is refused (403), a server path or a malformed line is refused naming
  the line (400), a document_id another tenant owns too;
* a calibration's units run on the worker at the lowest priority: a real job submitted while they are queued
  runs before the rest of them; once a length's units are done its rows are written once, listed by GET
  /v1/evidence and `specq evidence --json`, and mode auto runs specprefill for a job they cover;
* `n` skips the units beyond it; a document longer than every length edge fails the calibration, nothing written.
"""

from __future__ import annotations

import json
import time
from datetime import datetime

import httpx
import pytest

from service_helpers import Stack, base_env, free_port, pg_database, redis_pg_env, require_servers, running, wait_job

pytestmark = pytest.mark.services


def _doc(d: int, lines: int = 3) -> str:
    return "".join(f"doc {d} line {i}: the value of item {i} is {(i * 7 + d) % 13}.\n" for i in range(lines))


def _lines(docs: int, per: int) -> list[dict]:
    return [{"text": _doc(d), "question": f"What is the value of item {q + 1}?"} for d in range(docs) for q in range(per)]


@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    require_servers()
    home = tmp_path_factory.mktemp("calsvc")
    port = free_port()
    with pg_database() as pg_url:
        env = base_env(home, tiny_models, SPECQ_API_PORT=str(port), SPECQ_CONCURRENCY="1", SPECQ_THREADS="1",
                       SPECQ_SLOTS="2", SPECQ_AUTO_MIN_TOKENS="64", SPECQ_CACHE_BYTES="0", SPECQ_WARM_UP="0",
                       SPECQ_AUTH="keys", **redis_pg_env(pg_url, "specq-calsvc"))
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        tenant = st.cli("keys", "create", "--tenant", "team-a", check=True).stdout.strip()
        admin = st.cli("keys", "create", "--tenant", "ops", "--admin", check=True).stdout.strip()
        st.env["SPECQ_API_KEY"] = admin  # the CLI's key (st.cli)
        with running(st, ("api", "api"), ("worker", "worker")):
            with httpx.Client(base_url=st.url, timeout=30, headers={"Authorization": f"Bearer {admin}"}) as c, \
                    httpx.Client(base_url=st.url, timeout=30, headers={"Authorization": f"Bearer {tenant}"}) as t:
                yield st, c, t, admin


def _wait_cal(c: httpx.Client, cal_id: str, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        cal = c.get(f"/v1/calibrations/{cal_id}").json()
        if cal["status"] in ("succeeded", "failed", "cancelled"):
            return cal
        assert time.monotonic() < deadline, cal
        time.sleep(0.2)


def _unit_jobs(c: httpx.Client) -> list[dict]:
    return [j for j in c.get("/v1/jobs", params={"limit": 500}).json()["data"] if j["kind"] == "calibration"]


def _t(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def test_bad_input_is_refused_naming_the_line_and_nothing_is_stored(stack):
    st, c, t, _ = stack
    good = {"text": _doc(0), "question": "What is item 1?"}
    r = t.post("/v1/calibrations", json={"lines": [good]})
    assert r.status_code == 403, r.text
    assert t.get("/v1/calibrations").status_code == 403
    cases = [([good, {"path": "/etc/passwd", "question": "q"}], "line 2: path is not accepted here"),
             ([good, good, {"text": "x"}], "line 3: question must be a non-empty string"),
             ([good, {"text": "x", "question": "q", "colour": "red"}], "line 2: unknown field 'colour'"),
             ([good, {"text": "x", "document_id": "doc_1", "question": "q"}], "line 2: needs exactly one of text, document_id"),
             ([good, {"text": "x", "question": "q", "answer": 7}], "line 2: answer must be a non-empty string"),
             ([good, "not an object"], "line 2: not a JSON object")]
    for lines, needle in cases:
        r = c.post("/v1/calibrations", json={"lines": lines})
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (needle, r.text)
    r = c.post("/v1/calibrations", json={"lines": [good], "keep": [0.3, 1.5]})
    assert r.status_code == 400 and "keep" in r.json()["error"]["message"], r.text
    r = c.post("/v1/calibrations", json={"lines": [good], "colour": "red"})
    assert r.status_code == 400 and "colour" in r.json()["error"]["message"], r.text
    # a document of another tenant is no document of the admin's
    doc = t.post("/v1/documents", json={"text": _doc(1), "filename": "d.txt"}).json()
    r = c.post("/v1/calibrations", json={"lines": [good, {"document_id": doc["id"], "question": "q"}]})
    assert r.status_code == 400 and f"line 2: no stored document {doc['id']!r}" in r.json()["error"]["message"], r.text
    assert c.get("/v1/calibrations").json()["data"] == [] and _unit_jobs(c) == []


def test_units_run_after_real_work_and_write_rows_once_that_auto_uses(stack):
    st, c, _, admin = stack
    body = {"lines": _lines(8, 5), "keep": [1.0], "lengths": [1024], "max_tokens": 4}
    made = c.post("/v1/calibrations", json=body)
    assert made.status_code == 201, made.text
    cal = made.json()
    assert cal["status"] == "queued" and cal["progress"] == {"done": 0, "total": 40, "failed": 0, "skipped": 0}, cal
    # a real job submitted while the units are queued is claimed before the rest of them
    real = c.post("/v1/jobs", json={"text": _doc(9), "question": "What is item 2?", "params": {"max_tokens": 2}}).json()
    real = wait_job(c, real["id"], timeout=120)
    assert real["status"] == "succeeded", real
    done = _wait_cal(c, cal["id"])
    assert done["status"] == "succeeded" and done["progress"]["done"] == 40, done
    units = _unit_jobs(c)
    assert len(units) == 40 and all(u["status"] == "succeeded" and u["priority"] == 9 for u in units)
    # in message order the real job's message is behind all 40: claimed by priority, it runs after the unit(s)
    # already running when it arrived, before the rest
    after = [u for u in units if _t(u["started_at"]) > _t(real["started_at"])]
    assert len(after) >= 20, f"only {len(after)} of 40 units started after the real job"
    rows = {r["metric"]: r for r in done["rows"]}
    assert set(rows) == {"agreement", "token_f1", "loglik_delta"}, rows  # no reference answers: no answer_right
    assert all(r["n"] == 40 and len(r["documents"]) == 8 and r["source"] == f"calibration:{cal['id']}" for r in rows.values())
    assert list(done["rows_written"]) == ["1024:1"]
    # listed by GET /v1/evidence and `specq evidence --json`, in use; written once (a second read writes nothing)
    again = c.get(f"/v1/calibrations/{cal['id']}").json()
    assert sorted(r["id"] for r in again["rows"]) == sorted(r["id"] for r in done["rows"])
    stored = [d for d in c.get("/v1/evidence").json()["data"] if d["origin"] == "store"]
    assert sorted(d["id"] for d in stored) == sorted(r["id"] for r in done["rows"])
    assert all(d["in_use"] and d["passes"] for d in stored), stored
    listed = st.cli("evidence", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(d["id"] for d in json.loads(listed.stdout)["data"] if d["origin"] == "store") == sorted(rows[m]["id"] for m in rows)
    # mode auto runs specprefill for a job those rows cover (the worker reloads the rows at its next claim)
    job = c.post("/v1/jobs", json={"text": _doc(5), "question": "What is the value of item 6?",
                                   "params": {"keep": 1.0, "max_tokens": 4, "task": "lookup"}}).json()
    spec = wait_job(c, job["id"])["result"]["spec"]
    assert spec["mode"] == "specprefill" and "agreement >= 0.9 (provisional bar)" in spec["reason"], spec
    # the CLI's view of it
    out = st.cli("calibrations")
    assert out.returncode == 0 and f"{cal['id']}\tsucceeded\t40\t40\t1\t3\t" in out.stdout, (out.stdout, out.stderr)
    shown = st.cli("calibrations", "show", cal["id"])
    assert shown.returncode == 0 and "succeeded, 40 of 40 units done" in shown.stdout, shown.stdout


def test_n_skips_units_beyond_it_and_a_too_long_document_fails_the_calibration(stack, tmp_path):
    st, c, _, _ = stack
    # through `specq calibrate --service`: a `path` line is read by the CLI and sent as text
    (tmp_path / "d.txt").write_text(_doc(3))
    qs = tmp_path / "qs.jsonl"
    qs.write_text("".join(json.dumps(ln) + "\n" for ln in [{"path": "d.txt", "question": "What is item 1?"},
                                                            *_lines(1, 2)]))
    out = st.cli("calibrate", "--documents", str(qs), "--service", "--keep", "1.0", "--lengths", "1024", "--n", "2",
                 "--max-tokens", "2")
    assert out.returncode == 0 and out.stdout.startswith("cal_"), (out.stdout, out.stderr)
    cal_id = out.stdout.strip()
    done = _wait_cal(c, cal_id)
    assert done["status"] == "succeeded" and done["progress"] == {"done": 2, "total": 2, "failed": 0, "skipped": 1}, done
    assert {r["n"] for r in done["rows"]} == {2} and not any(r["passes"] for r in done["rows"])
    refused = st.cli("calibrate", "--documents", str(qs), "--service", "--local")
    assert refused.returncode == 1 and "--service: --local do not apply" in refused.stderr, refused.stderr
    too_long = c.post("/v1/calibrations", json={"lines": _lines(1, 2), "keep": [1.0], "lengths": [16]}).json()
    failed = _wait_cal(c, too_long["id"])
    assert failed["status"] == "failed" and failed["rows"] == [], failed
    assert failed["error"].startswith("line 1: the document has ") and "largest length edge (16)" in failed["error"], failed
