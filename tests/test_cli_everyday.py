"""The CLI as everyday use meets it (issue 45, items 2-5), through the real `specq` command against a
real service (`specq up --detach`: API + worker on tiny models, SQLite + the embedded broker):

* `specq up --port P` records its URL under $SPECQ_HOME and the CLI talks to it with no
  SPECQ_API_URL; `specq --url` and SPECQ_API_URL override it; `up` prints the URL;
* `specq up --detach` on a port another server holds exits 1 with the log's reason (it used to take
  the other server's /healthz 200 for its own API and report success);
* the result table and the jobs list say which mode ran and why;
* the waiting CLI's progress line: prefill tokens i/n, the time in the phase and the time left;
* `specq jobs` shows each job's file, question and batch name, and its table fits a 160-column
  (1,280 px) terminal (item 8).
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from service_helpers import REPO, Stack, base_env, free_port, running, specq_cmd

DOC = "def add(a, b):\n    return a + b\n"


def _run(env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(specq_cmd(*args), env=dict(env, COLUMNS="200"), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def up_env(tiny_models, tmp_path):
    """The environment of a `specq up` on its own SPECQ_HOME and port, with no SPECQ_API_URL; `specq down`
    afterwards."""
    port = free_port()
    env = base_env(tmp_path / "home", tiny_models, SPECQ_API_PORT=str(port), SPECQ_THREADS="1")
    env.pop("SPECQ_API_URL", None)
    env["_port"] = str(port)
    try:
        yield env
    finally:
        _run(env, "down", timeout=120)


def test_up_records_its_url_and_the_cli_finds_the_service_there(up_env, tmp_path):
    port = up_env["_port"]
    url = f"http://127.0.0.1:{port}"
    r = _run(up_env, "up", "--detach", "--port", port)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"API at {url}" in r.stderr and "up.url" in r.stderr
    assert (Path(up_env["SPECQ_HOME"]) / "up.url").read_text().strip() == url

    # no SPECQ_API_URL, not the default port: the CLI finds this service
    doc = tmp_path / "adder.py"
    doc.write_text(DOC)
    r = _run(up_env, "submit", str(doc), "-q", "What does add return?", "--max-tokens", "3", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    # what ran and why, and the target's prefill under the label of what it did
    assert "ran baseline: auto: " in r.stdout, r.stdout
    assert "prefill" in r.stdout and "sparse_prefill" in r.stdout  # label, and the timings_ms key beside it
    assert "sparse prefill" not in r.stdout  # a baseline run's prefill is not sparse

    listed = json.loads(_run(up_env, "jobs", "--json").stdout)
    job = listed["data"][0]
    assert job["ran"]["mode"] == "baseline" and job["ran"]["reason"].startswith("auto: ")
    piped = _run(up_env, "jobs").stdout.splitlines()[0].split("\t")  # id kind status progress ran … why
    assert piped[0] == job["id"] and piped[4] == "baseline" and piped[8] == job["ran"]["reason"]
    assert piped[9:] == ["adder.py", "What does add return?", "", ""]  # file, question, batch name, batch id
    status = _run(up_env, "status", job["id"]).stdout
    assert f"ran        baseline: {job['ran']['reason']}" in status

    # --url and SPECQ_API_URL win over the recorded URL
    nobody = f"http://127.0.0.1:{free_port()}"
    r = _run(up_env, "--url", nobody, "jobs")
    assert r.returncode == 1 and f"no specq API at {nobody} (--url)" in r.stderr, r.stderr
    r = _run(dict(up_env, SPECQ_API_URL=nobody), "jobs")
    assert r.returncode == 1 and f"no specq API at {nobody}:" in r.stderr, r.stderr
    r = _run(up_env, "--url", url, "jobs", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["data"][0]["id"] == job["id"]

    # stopped: the CLI still names the recorded URL (not somebody else's service on the default port)
    assert _run(up_env, "down", timeout=120).returncode == 0
    r = _run(up_env, "jobs")
    assert r.returncode == 1 and f"no specq API at {url} (recorded by `specq up` in" in r.stderr, r.stderr


class _OtherApi(BaseHTTPRequestHandler):
    """Another service already on the port: /healthz answers 200 (as another specq instance would)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"status": "ok", "version": "0", "instance": "somebody-else"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_up_detach_on_a_taken_port_fails_with_the_logs_reason(up_env):
    other = ThreadingHTTPServer(("127.0.0.1", int(up_env["_port"])), _OtherApi)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        r = _run(up_env, "up", "--detach", "--port", up_env["_port"])
    finally:
        other.shutdown()
        other.server_close()
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr
    assert "address already in use" in err and "another API (instance somebody-else)" in err, err
    assert "see " in err and "up.log" in err
    assert not (Path(up_env["SPECQ_HOME"]) / "up.pid").exists()  # nothing left for `specq down`
    assert not (Path(up_env["SPECQ_HOME"]) / "up.url").exists()  # the CLI is not pointed at the other one


def test_a_running_prefill_reports_tokens_through_the_worker(up_env):
    """The engine's per-call prefill progress reaches the API through the worker's progress channel
    (its watcher writes the latest report to the job store): polled, a running job shows
    `sparse_prefill` i/n tokens with 0 < i < n. Small prefill calls and a short write interval make the
    phase long enough to be seen with tiny models."""
    env = dict(up_env, SPECQ_CALL_TOKENS="16", SPECQ_PROGRESS_INTERVAL="0.05", SPECQ_STALE_AFTER="30")
    assert _run(env, "up", "--detach", "--port", env["_port"]).returncode == 0
    url = f"http://127.0.0.1:{env['_port']}"
    doc = "".join(f"def f{i}(a, b):\n    return a + b * {i}\n\n" for i in range(80))
    seen = set()
    with httpx.Client(base_url=url, timeout=30) as c:
        job_id = c.post("/v1/jobs", json={"text": doc, "question": "What does f7 return?",
                                          "params": {"mode": "baseline", "max_tokens": 2}}).json()["id"]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            job = c.get(f"/v1/jobs/{job_id}").json()
            p = job["progress"]
            if job["status"] == "running" and p["phase"] == "sparse_prefill":
                seen.add((p["done"], p["total"]))
            if job["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.01)
    assert job["status"] == "succeeded", job["error"]
    n = job["result"]["usage"]["prompt_tokens"]
    assert n > 1000 and any(0 < done < total == n for done, total in seen), sorted(seen)


def test_progress_line_has_tokens_elapsed_and_time_left():
    from specq.cli.progress import PhaseClock, duration

    now = [100.0]
    clock = PhaseClock(now=lambda: now[0])
    assert clock.text("score", 1, 8) == "scoring 1/8 windows · 0 s"
    now[0] += 2
    assert clock.text("score", 3, 8) == "scoring 3/8 windows · 2 s · ~5 s left"
    now[0] += 1
    assert clock.text("sparse_prefill", 0, 32768) == "prefill 0/32,768 tokens · 0 s"  # a new phase: its own clock
    now[0] += 10
    assert clock.text("sparse_prefill", 8192, 32768) == "prefill 8,192/32,768 tokens · 10 s · ~30 s left"
    now[0] += 30
    assert clock.text("sparse_prefill", 32768, 32768) == "prefill 32,768/32,768 tokens · 40 s"
    assert clock.job_text({"status": "queued", "progress": {"phase": None}}) == "queued"
    assert duration(125) == "2 min 5 s" and duration(3780) == "1 h 3 min"


def test_the_logs_reason_puts_the_os_error_first_and_skips_warning_source_lines():
    from specq.cli.service import log_reason

    log = ("INFO starting\n"
           "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8391): address already in use\n"
           "  _warn_or_raise_security_error(egid, euid, gid, uid,\n"
           "specq up: another API (instance x) already answers at http://127.0.0.1:8391: is the port in use?\n"
           "specq up: the api exited with status 3; stopping\n")
    reason = log_reason(log)
    assert reason.startswith("ERROR:    [Errno 98]") and reason.endswith("the api exited with status 3; stopping")
    assert "security_error" not in reason
    assert log_reason("INFO all fine\n") == ""


# --- item 8: the jobs list says which file, question and batch, and fits 1,280 px -------------------------------


@pytest.fixture
def api_only(tiny_models, tmp_path):
    """`specq api` alone (no worker): jobs' states are written through the storage layer as a worker
    writes them, so every row is exactly what the test needs."""
    port = free_port()
    st = Stack(env=base_env(tmp_path / "home", tiny_models, SPECQ_API_PORT=str(port)), port=port, logdir=tmp_path)
    st.cli("db", "upgrade", check=True)
    with running(st, ("api", "api")):
        yield st


def _on_terminal(st: Stack, *args: str, columns: int) -> list[str]:
    """The lines `specq ARGS` writes to a pseudo-terminal `columns` wide (colour codes removed)."""
    master, slave = pty.openpty()
    env = dict(st.env, SPECQ_API_URL=st.url, COLUMNS=str(columns), TERM="xterm-256color")
    p = subprocess.Popen(specq_cmd(*args), env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                         close_fds=True)
    os.close(slave)
    out = b""
    with contextlib.suppress(OSError):  # EIO once the child has closed its end
        while chunk := os.read(master, 65536):
            out += chunk
    os.close(master)
    text = out.decode()
    assert p.wait(timeout=120) == 0, text
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r\n", "\n").splitlines()


def test_jobs_shows_file_question_and_batch_name_and_fits_160_columns(api_only):
    from specq.storage import db, jobs, results

    st = api_only
    question = "Which function adds two numbers, and where is it defined in this module? " * 3
    name = "quarterly-report-with-a-long-name-" + "x" * 30 + ".py"
    batch_name = "nightly-summaries-of-the-quarterly-reports"
    r = httpx.post(f"{st.url}/v1/batches", files=[("file", (name, DOC.encode()))],
                   data={"question": question, "metadata": json.dumps({"name": batch_name})}, timeout=30)
    assert r.status_code == 200, r.text
    batch_id = r.json()["id"]
    single = httpx.post(f"{st.url}/v1/jobs", json={"text": DOC, "question": "What does add return?",
                                                   "filename": "adder.py"}, timeout=30).json()["id"]
    reason = "auto: " + "the speculator's scores did not justify a sparse prefill on this prompt; " * 2
    failed = httpx.post(f"{st.url}/v1/jobs", json={"text": DOC, "question": "q?"}, timeout=30).json()["id"]
    error = "the worker could not load the model: " + "a very long reason " * 10
    with db.session(st.database_url) as s:
        token = jobs.mark_running(s, single, "cli-test:1")
        assert results.save_result(s, single, token=token, result={
            "text": "a + b", "finish_reason": "stop", "usage": {"prompt_tokens": 10, "kept_tokens": 10, "completion_tokens": 2},
            "timings_ms": {"tokenize": 1.0, "sparse_prefill": 5.0, "decode": 2.0, "total": 8.0},
            "spec": {"mode": "baseline", "reason": reason}})
        assert jobs.mark_failed(s, failed, error, token=jobs.mark_running(s, failed, "cli-test:1"))
    listed = {j["id"]: j for j in json.loads(_run(dict(st.env, SPECQ_API_URL=st.url), "jobs", "--json").stdout)["data"]}
    in_batch = next(j for j in listed.values() if j["batch_id"] == batch_id)

    # piped: the fields so far in their places, then file, question (first 120 characters), batch name, batch id
    piped = {ln.split("\t")[0]: ln.split("\t") for ln in _run(dict(st.env, SPECQ_API_URL=st.url), "jobs").stdout.splitlines()}
    assert piped[in_batch["id"]][9:] == [name, question[:119] + "…", batch_name, batch_id]
    assert piped[single][4] == "baseline" and piped[single][8] == reason
    assert piped[single][9:] == ["adder.py", "What does add return?", "", ""]
    assert piped[failed][7] == error.strip() or piped[failed][7] == error

    # on a terminal 160 columns wide (1,280 px): every line fits, free text folds inside its column
    lines = _on_terminal(st, "jobs", columns=160)
    assert max(len(ln) for ln in lines) <= 160, "\n".join(lines)
    header = next(ln for ln in lines if ln.lstrip().startswith("id "))
    assert re.split(r"\s{2,}", header.strip())[:10] == ["id", "kind", "status", "progress", "ran", "file", "question",
                                                          "batch", "created (UTC)", "why / error"], header
    screen = "\n".join(lines)
    row = next(i for i, ln in enumerate(lines) if ln.startswith(single))
    assert "adder.py" in lines[row] and "What" in lines[row] and "baseline" in lines[row]
    for words in (name[:10], batch_name[:10], "Which", "the worker", "auto: the"):
        assert words in screen, (words, screen)
    assert "3 of 3 jobs" in screen
