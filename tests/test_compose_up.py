"""`docker compose --profile cpu up` for real (issue 52): the images built from the Dockerfile, the stack
of compose.yaml started, and real jobs served by the real model pair in the containers.

Marked `compose`. Needs a Docker engine (started here as root when `dockerd` is installed and none
runs; it is left running, so its image cache serves the next run), Compose (`docker compose` v2 or
Debian's `docker-compose` 1.29; SPECQ_COMPOSE_CLI picks one) and the real pair in $SPECQ_HOME/models.
Docker Hub is not reachable here: scripts/compose-images.sh makes local stand-ins under the Hub names
compose.yaml and the Dockerfile use (docs/deploy.md), and scripts/compose-wheel.sh hands the worker-cpu
build this machine's own llama-cpp-python wheel where it fits (no compile of llama.cpp). They run where
SPECQ_COMPOSE=1 or SPECQ_REQUIRE_DOCKER=1 is set (.ci/run sets the latter, after README's test command),
else skip (README's test command leaves them out: they take minutes); without an engine or the models
they skip, unless SPECQ_REQUIRE_DOCKER=1, where they fail.

What stays the user's: compose.yaml, .env and the Dockerfile, unchanged. What the test adds in an
override file: the host's model files (hard links, no 1.6 GB pull) mounted at the models volume's
`models/` directory, and a short SPECQ_STALE_AFTER / SPECQ_RECONCILE_INTERVAL for the worker, so
that a job whose worker is killed is requeued in seconds rather than minutes.

Times (cold build, cached build, up, ready, each step) are printed and written to
$SPECQ_COMPOSE_TIMES (default .pytest_cache/specq-compose-up.json).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from service_helpers import REPO, free_port

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]

REQUIRED = os.environ.get("SPECQ_REQUIRE_DOCKER") == "1"
PROJECT = f"specqcompose{os.getpid()}"
STALE_AFTER_S = 12
TIMES: dict[str, float] = {}
#: what the times depend on: the machine's load, how llama.cpp got into the image (written with TIMES)
NOTES: dict[str, object] = {}

# two small files with one distinctive function each: the answer must name it
DOC_A = '''import decimal


def compute_invoice_total(items, tax_rate):
    """Sum the price times quantity of every item, then add the tax."""
    subtotal = sum(decimal.Decimal(i["price"]) * i["qty"] for i in items)
    return subtotal * (1 + decimal.Decimal(tax_rate))
'''
DOC_B = '''def reverse_words_in_sentence(sentence):
    """'hello big world' -> 'world big hello'"""
    return " ".join(reversed(sentence.split()))
'''
QUESTION = "What is the name of the function defined in this file? Answer with the name only."


def _unavailable(reason: str):
    if REQUIRED:
        pytest.fail(f"{reason} (SPECQ_REQUIRE_DOCKER=1: the compose test must run)")
    pytest.skip(reason)


def _run(cmd: list[str], *, timeout: float = 120, env: dict | None = None, check: bool = True,
         cwd: Path = REPO) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n"
                             f"--- stderr\n{r.stderr[-4000:]}")
    return r


def _engine_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _ensure_engine() -> None:
    """A running Docker engine: the one there is, or a `dockerd` started now (as root) and left running."""
    if shutil.which("docker") is None:
        _unavailable("no docker client (apt-get install docker.io)")
    if _engine_answers():
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        _unavailable("no Docker engine runs and none can be started here (needs root and dockerd)")
    log = open("/var/log/dockerd-specq-tests.log", "ab")
    subprocess.Popen([dockerd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while not _engine_answers():
        if time.monotonic() > deadline:
            _unavailable("dockerd was started but does not answer (see /var/log/dockerd-specq-tests.log)")
        time.sleep(1)


def _compose_cli() -> list[str]:
    forced = os.environ.get("SPECQ_COMPOSE_CLI", "").split()
    if forced:
        return forced
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    _unavailable("no Compose (docker compose v2 or Debian's docker-compose)")


def _model_files() -> list[Path]:
    from specq.engine import models

    files = []
    for name in models.DEFAULT_PAIR:
        st = models.model_status(name)
        if st.state != "verified":
            _unavailable(f"{name} is {st.state} here (run `specq models pull`)")
        files += [st.path, st.path.with_name(st.path.name + ".sha256")]
    return files


def _linked_models(files: list[Path]) -> Path:
    """A directory the containers' user (uid 10001) may write its lock files into, holding the host's
    verified model files as hard links (same inode and mtime, so their .sha256 markers stay valid)."""
    d = Path(tempfile.mkdtemp(prefix="specq-compose-models-", dir="/var/tmp"))
    for f in files:
        try:
            os.link(f, d / f.name)
        except OSError:  # another file system: a copy
            shutil.copy2(f, d / f.name)
    if os.geteuid() == 0:
        os.chown(d, 10001, 10001)
    else:
        d.chmod(0o777)
    return d


class Stack:
    def __init__(self, cli: list[str], override: Path, port: int):
        self.cli, self.override, self.port = cli, override, port
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("COMPOSE_", "SPECQ_", "POSTGRES_", "CPU_CMAKE", "CUDA_ARCH"))}
        self.env["SPECQ_API_PORT"] = str(port)

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return _run([*self.cli, "-p", PROJECT, "-f", str(REPO / "compose.yaml"), "-f", str(self.override),
                     "--profile", "cpu", *args], timeout=timeout, env=self.env, check=check)

    def logs(self, *services: str) -> str:
        r = self.compose("logs", "--no-color", "--tail", "60", *services, check=False, timeout=60)
        return r.stdout[-6000:]

    def specq(self, *args: str, files: dict[str, str] = {}, key: str = "", timeout: float = 300) -> str:
        """`specq ARGS` in the api container (the CLI against its own API), after writing `files` there."""
        setup = " && ".join(f"echo {base64.b64encode(t.encode()).decode()} | base64 -d > /tmp/{n}"
                            for n, t in files.items())
        cmd = " ".join(["specq", *(_sh_quote(a) for a in args)])
        r = self.compose("exec", "-T", "-e", f"SPECQ_API_KEY={key}", "-e", "SPECQ_API_URL=http://127.0.0.1:8178",
                         "api", "sh", "-c", f"cd /tmp && {setup + ' && ' if setup else ''}{cmd}",
                         timeout=timeout, check=False)
        assert r.returncode == 0, f"specq {args} exited {r.returncode}\n{r.stdout}\n{r.stderr}\n{self.logs('worker-cpu')}"
        return r.stdout

    def psql(self, sql: str) -> list[list[str]]:
        r = self.compose("exec", "-T", "postgres", "psql", "-U", "specq", "-d", "specq", "-At", "-F", "\t",
                         "-v", "ON_ERROR_STOP=1", "-c", sql, timeout=60)
        return [line.split("\t") for line in r.stdout.splitlines() if line]


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def _timed(name: str, start: float) -> None:
    TIMES[name] = round(time.monotonic() - start, 1)
    print(f"compose: {name} {TIMES[name]} s")


@pytest.fixture(scope="module")
def stack():
    if not (REQUIRED or os.environ.get("SPECQ_COMPOSE") == "1"):
        pytest.skip("the compose test builds images (minutes, tens of them cold): SPECQ_COMPOSE=1 runs it "
                    "(or SPECQ_REQUIRE_DOCKER=1)")
    files = _model_files()
    NOTES["load_average_start"] = [round(x, 2) for x in os.getloadavg()]
    _ensure_engine()
    cli = _compose_cli()
    t = time.monotonic()
    _run(["bash", str(REPO / "scripts" / "compose-images.sh")], timeout=1800)
    _timed("stand-in images", t)
    # this machine's llama-cpp-python wheel into wheels/ where it fits the image (else the build compiles);
    # CPU_CMAKE_ARGS as the build below sees it (Stack drops it from the environment)
    wheel = _run(["bash", str(REPO / "scripts" / "compose-wheel.sh")],
                 env={k: v for k, v in os.environ.items() if k != "CPU_CMAKE_ARGS"}).stdout.strip()
    print(wheel)
    NOTES["wheel"] = wheel

    models_dir = _linked_models(files)
    work = Path(tempfile.mkdtemp(prefix="specq-compose-"))
    override = work / "compose.test.yaml"
    override.write_text(json.dumps({"services": {  # JSON is YAML; compose merges this over compose.yaml
        "models": {"volumes": [f"{models_dir}:/var/lib/specq/models"]},
        "worker-cpu": {"volumes": [f"{models_dir}:/var/lib/specq/models"],
                       "environment": {"SPECQ_STALE_AFTER": str(STALE_AFTER_S), "SPECQ_RECONCILE_INTERVAL": "3"}},
    }}, indent=2))
    st = Stack(cli, override, free_port())
    try:
        t = time.monotonic()
        built = st.compose("build", timeout=3000).stdout
        _timed("build", t)
        # how the worker-cpu image got llama.cpp (scripts/build-llama.sh's lines; none: the layer was cached)
        NOTES["llama_cpp_in_image"] = ("compiled" if "building llama-cpp-python" in built else
                                       "installed from wheels/" if "installed llama-cpp-python" in built else
                                       "cached image layer")
        t = time.monotonic()
        st.compose("up", "-d", timeout=600)
        _timed("up -d", t)
        ready = _wait_ready(st, timeout=420)
        _timed("up -d to ready (worker loaded and warmed up)", t)
        assert ready["workers_ready"] >= 1 and ready["broker_kind"] == "redis", ready
        out = st.compose("exec", "-T", "api", "specq", "keys", "create", "--tenant", "compose", "--admin").stdout
        st.key = re.search(r"sk-specq-\S+", out).group(0)
        st.http = httpx.Client(base_url=f"http://127.0.0.1:{st.port}", timeout=30,
                               headers={"authorization": f"Bearer {st.key}"})
        yield st
    finally:
        try:
            t = time.monotonic()
            st.compose("down", "-v", "--remove-orphans", timeout=300, check=False)
            _timed("down -v", t)
        finally:
            shutil.rmtree(models_dir, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
            out = Path(os.environ.get("SPECQ_COMPOSE_TIMES") or REPO / ".pytest_cache" / "specq-compose-up.json")
            out.parent.mkdir(parents=True, exist_ok=True)
            NOTES["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
            out.write_text(json.dumps({"compose": " ".join(cli), **NOTES, "seconds": TIMES}, indent=2) + "\n")


def _wait_ready(st: Stack, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"http://127.0.0.1:{st.port}/readyz", timeout=5)
            last = r.json()
            if r.status_code == 200 and last.get("workers_ready", 0) >= 1:
                return last
        except (httpx.HTTPError, ValueError) as e:
            last = repr(e)
        time.sleep(2)
    ps = st.compose("ps", check=False).stdout
    raise AssertionError(f"not ready after {timeout} s: {last}\n{ps}\n{st.logs()}")


def _wait_job(st: Stack, job_id: str, timeout: float, until=lambda j: j["status"] in ("succeeded", "failed")) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = st.http.get(f"/v1/jobs/{job_id}").json()
        if until(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['status']} after {timeout} s\n{st.logs('worker-cpu')}")
        time.sleep(0.2)


def _containers(service: str) -> list[dict]:
    ids = _run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}",
                "--filter", f"label=com.docker.compose.service={service}"]).stdout.split()
    assert ids, f"no {service} container"
    return json.loads(_run(["docker", "inspect", *ids]).stdout)


def _when(stamp: str) -> float:
    """Docker's RFC 3339 time with nanoseconds (trailing zeros dropped) as Unix seconds."""
    from datetime import datetime

    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$", stamp)
    assert m, stamp
    return datetime.fromisoformat(m.group(1) + "+00:00").timestamp() + float("0." + (m.group(2) or "0"))


def test_the_stack_started_in_order_and_nothing_restarted(stack):
    """The one-shots ran once and exited 0 (migrate needed PostgreSQL to answer); the api started only
    after migrate finished and the worker only after models finished (healthcheck and
    service_completed_successfully ordering, no crash loop: no restarts)."""
    (migrate,), (models,) = _containers("migrate"), _containers("models")
    (api,), (worker,) = _containers("api"), _containers("worker-cpu")
    for one_shot in (migrate, models):
        assert one_shot["State"]["Status"] == "exited" and one_shot["State"]["ExitCode"] == 0, one_shot["State"]
    assert _when(api["State"]["StartedAt"]) >= _when(migrate["State"]["FinishedAt"])
    assert _when(worker["State"]["StartedAt"]) >= _when(models["State"]["FinishedAt"])
    for c in (api, worker, *_containers("postgres"), *_containers("redis")):
        assert c["RestartCount"] == 0 and c["State"]["Running"], (c["Name"], c["RestartCount"], c["State"])
    assert api["Config"]["User"] == worker["Config"]["User"] == "specq"
    # the API never met a PostgreSQL that was not ready: migrate (restart "no") started after postgres and
    # connected at its first try, and neither it nor the api logged an error
    (postgres,) = _containers("postgres")
    assert _when(migrate["State"]["StartedAt"]) >= _when(postgres["State"]["StartedAt"])
    logs = stack.logs("migrate", "api")
    assert "Traceback" not in logs and "OperationalError" not in logs, logs


def test_a_job_through_the_api_container_with_the_cli(stack):
    t = time.monotonic()
    out = stack.specq("submit", "invoice.py", "-q", QUESTION, "--max-tokens", "16", "--temperature", "0",
                      "--wait", "--json", files={"invoice.py": DOC_A}, key=stack.key)
    _timed("CLI job (submit --wait)", t)
    result = json.loads(out[out.index("{"):])
    assert "compute_invoice_total" in result["text"], result["text"]
    job_id = result["job_id"]
    # the per-phase timings are in PostgreSQL, next to the result
    phases = dict(stack.psql(f"SELECT phase, ms FROM phase_timings WHERE job_id = '{job_id}'"))
    assert {"tokenize", "ttft", "decode", "total"} <= set(phases), phases
    assert all(float(ms) >= 0 for ms in phases.values()) and float(phases["total"]) > 0, phases
    (status, attempts, n), = stack.psql(f"SELECT status, attempts, (SELECT count(*) FROM results r WHERE "
                                        f"r.job_id = j.id) FROM jobs j WHERE id = '{job_id}'")
    assert (status, attempts, n) == ("succeeded", "1", "1")


def test_an_openai_sdk_chat_request(stack):
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{stack.port}/v1", api_key=stack.key, timeout=300)
    t = time.monotonic()
    model = client.models.list().data[0].id  # the served model's name (the target's file name)
    assert model == "qwen2.5-coder-1.5b-instruct-q4_k_m", model
    r = client.chat.completions.create(model=model, max_tokens=16, temperature=0, messages=[
        {"role": "user", "content": f"```python\n{DOC_B}```\n{QUESTION}"}])
    _timed("OpenAI SDK chat completion", t)
    assert "reverse_words_in_sentence" in r.choices[0].message.content, r
    assert r.usage.completion_tokens > 0 and r.choices[0].finish_reason in ("stop", "length")


def test_a_two_file_batch_and_the_metrics(stack):
    t = time.monotonic()
    out = stack.specq("submit", "invoice.py", "words.py", "-q", QUESTION, "--max-tokens", "16", "--temperature", "0",
                      "--batch", "compose-two", "--wait", "--json",
                      files={"invoice.py": DOC_A, "words.py": DOC_B}, key=stack.key, timeout=600)
    _timed("two-file batch (submit --wait)", t)
    batch = json.loads(out[out.index("{"):])
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}, batch
    lines = [json.loads(x) for x in stack.http.get(f"/v1/batches/{batch['id']}/results").text.splitlines() if x]
    answers = {x["custom_id"]: x["result"]["text"] for x in lines}
    assert set(answers) == {"invoice.py", "words.py"}, answers
    assert "compute_invoice_total" in answers["invoice.py"] and "reverse_words_in_sentence" in answers["words.py"], answers

    metrics = stack.http.get("/metrics")
    assert metrics.status_code == 200, metrics.text
    text = metrics.text
    succeeded = float(re.search(r'^specq_jobs\{status="succeeded"\} (\S+)$', text, re.M).group(1))
    assert succeeded >= 3, text[:2000]  # the CLI job and the two batch jobs (the chat request is a job too)
    assert float(re.search(r"^specq_workers\{[^}]*\} (\S+)$", text, re.M).group(1)) >= 1
    assert re.search(r'^specq_phase_duration_seconds_count\{phase="total"\} [1-9]', text, re.M)
    assert re.search(r'^specq_batches\{status="completed"\} [1-9]', text, re.M)
    assert re.search(r'^specq_scrape_errors\{source="database"\} 0', text, re.M)


def test_a_worker_killed_mid_job_is_replaced_and_the_job_finishes_once(stack):
    """SIGKILL the worker container while it runs a job; `up -d` starts a new one, whose reconciler
    requeues the job once its heartbeat is SPECQ_STALE_AFTER old; the job then succeeds, once."""
    doc = "\n\n".join(DOC_A.replace("compute_invoice_total", f"compute_invoice_total_{i}") for i in range(12))
    r = stack.http.post("/v1/jobs", json={"text": doc, "question": "Explain every function in this file in detail.",
                                          "params": {"max_tokens": 160, "temperature": 0}})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    _wait_job(stack, job_id, 300, until=lambda j: j["status"] != "queued")
    t = time.monotonic()
    stack.compose("kill", "-s", "KILL", "worker-cpu", timeout=60)
    job = stack.http.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "running", f"the job was not running when its worker was killed: {job['status']}"
    stack.compose("up", "-d", "worker-cpu", timeout=300)
    job = _wait_job(stack, job_id, 600)
    _timed("killed mid-job to succeeded (new worker, stale requeue, rerun)", t)
    assert job["status"] == "succeeded", job
    (status, attempts, n, n_final), = stack.psql(
        f"SELECT status, attempts, (SELECT count(*) FROM results r WHERE r.job_id = j.id), "
        f"(SELECT count(*) FROM job_deltas d WHERE d.job_id = j.id AND d.final) FROM jobs j WHERE id = '{job_id}'")
    assert (status, attempts, n) == ("succeeded", "2", "1"), (status, attempts, n)
    assert n_final in ("0", "1"), n_final  # at most one attempt's answer was finished
    assert stack.http.get("/readyz").json()["workers_ready"] >= 1


def test_a_worker_without_the_models_volume_says_why_it_is_not_ready(stack):
    """The worker-cpu image run with no models volume at all, beside the stack (what an override or a
    `docker run` without the volume does): it does not pull 1.6 GB into its container or exit (compose.yaml
    sets SPECQ_PULL_MODELS=0); it waits, and /readyz names the missing file and what to do."""
    from specq.engine import models

    target = models.get_spec(models.DEFAULT_TARGET)
    name = f"{PROJECT}-no-models-volume"
    t = time.monotonic()
    _run(["docker", "run", "-d", "--rm", "--name", name, "--network", f"{PROJECT}_default",
          "-e", "SPECQ_DATABASE_URL=postgresql://specq:specq@postgres:5432/specq",
          "-e", "SPECQ_BROKER_URL=redis://redis:6379/0", "-e", "SPECQ_QUEUE=specq", "-e", "SPECQ_PULL_MODELS=0",
          "specq-worker-cpu:latest"], timeout=60)
    try:
        want = (f"target model {target.name} is missing: /var/lib/specq/models/{target.filename} "
                "(SPECQ_HOME=/var/lib/specq); this worker does not pull (SPECQ_PULL_MODELS=0)")
        deadline = time.monotonic() + 120
        while True:
            ready = stack.http.get("/readyz").json()
            if any(want in line for line in ready["workers_not_ready"]):
                break
            logs = _run(["docker", "logs", "--tail", "30", name], check=False).stderr
            assert time.monotonic() < deadline, (ready, logs)
            time.sleep(1)
        _timed("a worker with no models volume: started to not ready, saying why", t)
        assert ready["workers_ready"] >= 1, ready  # the stack's own worker is unaffected
        time.sleep(6)  # it waits (checking again every 5 s) rather than exiting
        (c,) = json.loads(_run(["docker", "inspect", name]).stdout)
        assert c["State"]["Running"] and c["RestartCount"] == 0, c["State"]
        logs = _run(["docker", "logs", name]).stderr
        assert "specq worker not ready: target model" in logs and "Traceback" not in logs, logs[-3000:]
    finally:
        _run(["docker", "rm", "-f", name], check=False, timeout=60)
