"""Batches, their exports and /metrics, end to end: a real `specq api` + `specq worker` on the local
Redis (database 13, a queue of our own) and a throwaway PostgreSQL database, tiny random-weight
models on the CPU. Nothing is mocked.

* a 5-request JSONL batch over REST: validating -> in_progress -> finalizing -> completed with a
  timestamp per transition, results carry every custom_id, CSV columns, stats equal to the rows;
* a 3-file batch through the CLI as a new user would (`specq submit a.py b.py c.md -q … --wait`,
  then `specq results BATCH --format csv`, `--format table`, `specq stats`, `specq batches`);
* a malformed line fails the batch with its line number, nothing queued;
* cancel mid-batch: cancelling -> cancelled, the finished result stays;
* /metrics parses as Prometheus text and its counts match the database.
"""

from __future__ import annotations

import csv
import io
import json
import time

import httpx
import pytest
from sqlalchemy import func, select

from service_helpers import Stack, base_env, free_port, pg_database, redis_pg_env, require_servers, running
from specq.api.batches import csv_cell

pytestmark = pytest.mark.services

DOCS = {
    "a.py": "def add(a, b):\n    return a + b\n",
    "b.py": "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "c.md": "# Notes\n\nThe cache is flushed every night.\n",
}
QUESTION = "What does this file define?"


@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    require_servers()
    home = tmp_path_factory.mktemp("batches")
    port = free_port()
    with pg_database() as pg_url:
        env = base_env(home, tiny_models, SPECQ_API_PORT=str(port), **redis_pg_env(pg_url, "specq-test"))
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        with running(st, ("api", "api"), ("worker", "worker", "--loglevel", "INFO")):
            yield st


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        yield c


def _session(stack):
    from specq.storage import db

    return db.session(stack.database_url)


def wait_batch(client, batch_id: str, statuses=("completed", "failed", "cancelled"), timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        b = client.get(f"/v1/batches/{batch_id}").json()
        if b["status"] in statuses:
            return b
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} still {b['status']} {b['request_counts']} after {timeout}s")
        time.sleep(0.2)


def _jsonl(rows) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    rank = q * (len(v) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def test_jsonl_batch_statuses_results_csv_and_stats(stack, client):
    rows = [{"custom_id": f"req-{i}", "text": f"def f{i}(x):\n    return x * {i}\n", "question": f"What does f{i} return?",
             "params": {"max_tokens": 3 + i % 2, "seed": i}} for i in range(5)]
    r = client.post("/v1/batches", files={"input": ("requests.jsonl", _jsonl(rows), "application/jsonl")},
                    data={"metadata": json.dumps({"name": "five", "team": "qa"})})
    assert r.status_code == 200, r.text
    created = r.json()
    assert created["object"] == "batch" and created["id"].startswith("batch_")
    assert created["status"] == "in_progress" and created["request_counts"]["total"] == 5
    assert created["metadata"] == {"name": "five", "team": "qa"} and created["errors"] is None
    assert r.headers["location"] == f"/v1/batches/{created['id']}"

    done = wait_batch(client, created["id"])
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    stamps = [done[k] for k in ("created_at", "in_progress_at", "finalizing_at", "completed_at")]
    assert all(stamps) and stamps == sorted(stamps), stamps  # one timestamp per transition, in order
    assert done["failed_at"] is None and done["cancelled_at"] is None

    # results: JSONL, one line per request, in line order, each with its custom_id and run result object
    lines = [json.loads(x) for x in client.get(f"/v1/batches/{done['id']}/results").text.splitlines()]
    assert [x["custom_id"] for x in lines] == [r["custom_id"] for r in rows]
    for x, req in zip(lines, rows):
        assert x["status"] == "succeeded" and x["id"].startswith("job_")
        res = x["result"]
        assert set(res) >= {"text", "finish_reason", "usage", "timings_ms", "spec", "engine", "draft", "warnings"}
        assert res["usage"]["completion_tokens"] <= req["params"]["max_tokens"]
    assert client.get(f"/v1/batches/{done['id']}/errors").text == ""

    # CSV: usage and every phase as columns, same numbers as the JSONL
    r = client.get(f"/v1/batches/{done['id']}/results", params={"format": "csv"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert [t["custom_id"] for t in table] == [r["custom_id"] for r in rows]
    cols = set(table[0])
    assert {"custom_id", "job_id", "status", "answer", "prompt_tokens", "kept_tokens", "completion_tokens",
            "kept_ratio", "queue_wait_ms", "tokenize_ms", "sparse_prefill_ms", "ttft_ms", "decode_ms", "total_ms"} <= cols
    for t, x in zip(table, lines):
        assert t["answer"] == csv_cell(x["result"]["text"])  # a formula-looking answer gets a leading '
        assert not t["answer"].startswith(("=", "+", "-", "@", "\t", "\r"))
        assert int(t["prompt_tokens"]) == x["result"]["usage"]["prompt_tokens"]
        for phase, ms in x["result"]["timings_ms"].items():
            assert float(t[f"{phase}_ms"]) == pytest.approx(ms, abs=1e-3)

    # stats (SQL) equal the same numbers computed here from the rows
    st = client.get(f"/v1/batches/{done['id']}/stats").json()
    assert st["count"] == 5 and st["request_counts"]["completed"] == 5
    for phase in ("tokenize", "sparse_prefill", "ttft", "decode", "total"):
        values = [x["result"]["timings_ms"][phase] for x in lines]
        p = st["phases"][phase]
        assert p["count"] == 5
        assert p["p50"] == pytest.approx(_pct(values, 0.5), abs=1e-3)
        assert p["p95"] == pytest.approx(_pct(values, 0.95), abs=1e-3)
        assert p["mean"] == pytest.approx(sum(values) / 5, abs=1e-3)
    ratios = [x["result"]["usage"]["kept_tokens"] / x["result"]["usage"]["prompt_tokens"] for x in lines]
    assert st["kept_ratio_mean"] == pytest.approx(sum(ratios) / 5, abs=1e-9)
    assert st["wall_s"] > 0 and st["jobs_per_s"] > 0

    # listed, and found by name
    page = client.get("/v1/batches", params={"name": "five"}).json()
    assert page["data"][0]["id"] == done["id"]


def test_cli_three_files_then_results_csv(stack, tmp_path):
    paths = []
    for name, text in DOCS.items():
        (tmp_path / name).write_text(text)
        paths.append(name)
    env_cwd = dict(stack.env, SPECQ_API_URL=stack.url, COLUMNS="200")
    import subprocess

    from service_helpers import specq_cmd

    r = subprocess.run(specq_cmd("submit", *paths, "-q", QUESTION, "--max-tokens", "4", "--batch", "three", "--wait"),
                       env=env_cwd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr + stack.log("worker")[-3000:]
    batch_id = r.stdout.strip()
    assert batch_id.startswith("batch_") and "3/3 completed" in r.stderr

    res = stack.cli("results", batch_id, "--format", "csv", check=True)
    table = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [t["custom_id"] for t in table] == list(DOCS)  # custom_id = the file name, in submission order
    assert [t["filename"] for t in table] == list(DOCS)
    for t in table:
        assert t["status"] == "succeeded" and "answer" in t
        assert float(t["total_ms"]) > 0 and float(t["ttft_ms"]) > 0 and t["decode_ms"] != ""

    # the same batch by name: a table, JSONL with the run result objects, stats, the list
    tbl = stack.cli("results", "three", "--format", "table", check=True).stdout  # piped: tab-separated, no header
    assert [row.split("\t")[0] for row in tbl.splitlines()] == list(DOCS)
    assert all(len(row.split("\t")) == 7 and float(row.split("\t")[-1].replace(",", "")) > 0 for row in tbl.splitlines())
    jl = [json.loads(x) for x in stack.cli("results", "three", "--format", "jsonl", check=True).stdout.splitlines()]
    assert {x["custom_id"] for x in jl} == set(DOCS)
    st = stack.cli("stats", "three", check=True)  # piped: the table under its header; the summary on stderr
    assert batch_id in st.stderr and "3/3 completed" in st.stderr and "\nsparse_prefill\t3\t" in st.stdout
    assert batch_id in stack.cli("batches", check=True).stdout

    with _session(stack) as s:
        from specq.storage.models import Job, JobInput

        qs = s.execute(select(JobInput.question, JobInput.filename).join(Job, Job.id == JobInput.job_id)
                       .where(Job.batch_id == batch_id)).all()
    assert sorted(f for _, f in qs) == sorted(DOCS) and {q for q, _ in qs} == {QUESTION}


def test_malformed_line_fails_validation_with_line_number(stack, client, tmp_path):
    good = {"custom_id": "ok", "text": "x = 1\n", "question": "?"}
    body = _jsonl([good]) + b'{"custom_id": "broken", "text": \n' + _jsonl([{"custom_id": "p", "text": "y", "params": {"max_tokes": 2}}])
    r = client.post("/v1/batches", content=body, headers={"content-type": "application/jsonl"})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["status"] == "failed" and b["failed_at"] is not None and b["in_progress_at"] is None
    errs = b["errors"]["data"]
    assert [(e["line"], e["code"]) for e in errs] == [(2, "invalid_json"), (3, "invalid_params")]
    assert "line 2" in errs[0]["message"] and "max_tokes" in errs[1]["message"]
    with _session(stack) as s:
        from specq.storage.models import Job

        assert s.scalar(select(func.count()).select_from(Job).where(Job.batch_id == b["id"])) == 0
    assert client.get(f"/v1/batches/{b['id']}").json()["status"] == "failed"

    # the CLI says it in one line per bad line, exit 1
    f = tmp_path / "bad.jsonl"
    f.write_bytes(body)
    res = stack.cli("submit", "--jsonl", str(f))
    assert res.returncode == 1 and "line 2 is not valid JSON" in res.stderr and "failed validation" in res.stderr


def test_cancel_mid_batch_keeps_finished_results(stack, client):
    from specq.storage.models import Job

    rows = [{"custom_id": "quick", "text": "a = 1\n", "params": {"max_tokens": 2}},
            {"custom_id": "long", "text": "b = 2\n", "params": {"max_tokens": 3500, "seed": 3}},
            {"custom_id": "later-1", "text": "c = 3\n", "params": {"max_tokens": 2}},
            {"custom_id": "later-2", "text": "d = 4\n", "params": {"max_tokens": 2}}]
    b = client.post("/v1/batches", files={"input": ("r.jsonl", _jsonl(rows))}).json()
    assert b["status"] == "in_progress"
    deadline = time.monotonic() + 60
    while True:  # until `quick` finished and `long` is decoding
        with _session(stack) as s:
            state = {cid: (st, ph) for cid, st, ph in s.execute(
                select(Job.custom_id, Job.status, Job.progress_phase).where(Job.batch_id == b["id"]))}
        if state["quick"][0] == "succeeded" and state["long"] == ("running", "decode"):
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    r = client.post(f"/v1/batches/{b['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] in ("cancelling", "cancelled")
    assert r.json()["cancelling_at"] is not None
    done = wait_batch(client, b["id"], statuses=("cancelled",), timeout=30)
    assert done["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    assert done["completed_at"] is None and done["cancelled_at"] >= done["cancelling_at"]
    # the finished result stays; the others are errors
    lines = [json.loads(x) for x in client.get(f"/v1/batches/{b['id']}/results").text.splitlines()]
    assert [x["custom_id"] for x in lines] == ["quick"] and lines[0]["result"]["text"] is not None
    errs = {json.loads(x)["custom_id"]: json.loads(x) for x in client.get(f"/v1/batches/{b['id']}/errors").text.splitlines()}
    assert set(errs) == {"long", "later-1", "later-2"} and all(e["status"] == "cancelled" for e in errs.values())
    # cancelling again is harmless; a completed batch cannot be cancelled
    assert client.post(f"/v1/batches/{b['id']}/cancel").json()["status"] == "cancelled"
    other = client.get("/v1/batches", params={"status": "completed", "limit": 1}).json()["data"]
    if other:
        r = client.post(f"/v1/batches/{other[0]['id']}/cancel")
        assert r.status_code == 409 and "already completed" in r.json()["error"]["message"]


def test_metrics_prometheus_text_matches_the_database(stack, client):
    from prometheus_client.parser import text_string_to_metric_families

    from specq.storage.models import Job, PhaseTiming, Result

    # at least one finished job, and nothing left in the queue
    b = client.post("/v1/batches", files={"input": ("m.jsonl", _jsonl([{"custom_id": "m", "text": "z = 0\n",
                                                                          "params": {"max_tokens": 2}}]))}).json()
    wait_batch(client, b["id"])
    queue = stack.env["SPECQ_QUEUE"]

    def samples(name, suffix=""):
        return [s for s in fams[name].samples if s.name == name + suffix]

    # the worker's heartbeat (which carries jobs_done) is written every few seconds: wait for one
    # written after the batch, then check the whole scrape against the database
    deadline = time.time() + 30
    while True:
        r = client.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        fams = {f.name: f for f in text_string_to_metric_families(r.text)}
        done = [x for x in samples("specq_worker_jobs_done") if x.labels["queue"] == queue]
        if (done and done[0].value >= 1) or time.time() > deadline:
            break
        time.sleep(0.5)

    with _session(stack) as s:
        by_status = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
        n_total = s.scalar(select(func.count()).select_from(PhaseTiming).where(PhaseTiming.phase == "total"))
        sum_total = s.scalar(select(func.sum(PhaseTiming.ms)).where(PhaseTiming.phase == "total"))
        kept, prompt = s.execute(select(func.sum(Result.kept_tokens), func.sum(Result.prompt_tokens))).one()
    jobs = {x.labels["status"]: x.value for x in samples("specq_jobs")}
    assert jobs == {st: float(by_status.get(st, 0)) for st in ("queued", "running", "succeeded", "failed", "cancelled")}
    assert fams["specq_phase_duration_seconds"].type == "histogram"
    count = [x for x in samples("specq_phase_duration_seconds", "_count") if x.labels["phase"] == "total"]
    assert count[0].value == n_total
    tsum = [x for x in samples("specq_phase_duration_seconds", "_sum") if x.labels["phase"] == "total"]
    assert tsum[0].value == pytest.approx(sum_total / 1000.0, rel=1e-6)
    buckets = [x for x in samples("specq_phase_duration_seconds", "_bucket") if x.labels["phase"] == "total"]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == n_total
    assert [x.value for x in buckets] == sorted(x.value for x in buckets)  # cumulative
    assert samples("specq_kept_tokens", "_total")[0].value == kept
    assert samples("specq_prompt_tokens", "_total")[0].value == prompt
    depth = {x.labels["queue"]: x.value for x in samples("specq_queue_depth")}
    assert depth[queue] == 0
    workers = [x for x in samples("specq_worker_heartbeat_timestamp_seconds") if x.labels["queue"] == queue]
    assert len(workers) == 1 and abs(workers[0].value - time.time()) < 60
    assert {x.labels["queue"]: x.value for x in samples("specq_workers")}[queue] == 1
    assert done[0].value >= 1
    assert {x.labels["source"]: x.value for x in samples("specq_scrape_errors")} == {"database": 0, "broker": 0}
    batches = {x.labels["status"]: x.value for x in samples("specq_batches")}
    assert batches["completed"] >= 1


def test_warnings_round_trip_through_the_store_on_postgresql():
    require_servers()
    from specq.engine.result import RunResult
    from specq.storage import db, jobs, results

    with pg_database() as url:
        db.upgrade(url)
        with db.session(url) as s:
            job = jobs.create_job(s, text="x", params={})
            tok = jobs.mark_running(s, job.id, "w:1")
            r = RunResult(text="hi", warnings=["specprefill fell back to baseline: prompt too short"])
            assert results.save_result(s, job.id, r, token=tok)
            got = results.get_result(s, job.id)
            assert got == r.to_dict() and got["warnings"] == r.warnings
            assert results.get_results(s, [job.id]) == {job.id: got}
