"""compose.yaml and the Dockerfile, without a Docker engine:

* compose.yaml is valid against the Compose Specification schema (tests/data/compose_spec.json, the
  one docker-compose 1.29.2 ships) and, where Debian's `docker-compose` is installed, its
  `docker-compose config` accepts it;
* the deployment rules hold: redis and postgres have healthchecks; `migrate` and `models` are one-shots
  that api and worker wait for (service_completed_successfully); the worker reserves an NVIDIA GPU,
  is built from a CUDA image with our patched llama-cpp-python (CMAKE_ARGS=-DGGML_CUDA=on via
  scripts/build-llama.sh) and has a stop grace period longer than a phase;
* every service's `command`, read from compose.yaml itself, runs against the local Redis and
  PostgreSQL (marked `services`): the redis/postgres healthchecks, `migrate`, `models` (when the
  default models are already pulled here), then `api` + `worker` serving a batch, and the api
  healthcheck; the worker stops cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from service_helpers import REDIS_URL, REPO, Stack, free_port, pg_database, pg_reachable, redis_reachable

COMPOSE = REPO / "compose.yaml"
SCHEMA = REPO / "tests" / "data" / "compose_spec.json"


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the anchors and `<<` merge keys


def _interpolate(value, env: dict[str, str]):
    """Compose's ${VAR}, ${VAR:-default} and ${VAR-default}, from `env` only."""
    if isinstance(value, str):
        def sub(m):
            name, op, default = m.group(1), m.group(2), m.group(3) or ""
            if op == ":-":
                return env.get(name) or default
            if op == "-":
                return env.get(name, default)
            return env.get(name, "")
        return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|-)([^}]*))?\}", sub, value)
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    return value


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(a + b for a, b in parts) == duration, duration
    return sum(float(a) * units[b] for a, b in parts)


def test_compose_yaml_is_valid_against_the_compose_spec_schema():
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    doc = _compose()
    errors = sorted(jsonschema.Draft201909Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
    assert set(doc["services"]) >= {"redis", "postgres", "migrate", "models", "api", "worker"}


def test_docker_compose_config_accepts_it():
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("Debian's docker-compose is not installed (apt-get install docker-compose)")
    r = subprocess.run([exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=120,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load(r.stdout)
    assert resolved["services"]["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    print(f"docker-compose config: OK ({len(resolved['services'])} services: {', '.join(sorted(resolved['services']))})")


def test_deployment_rules():
    s = _compose()["services"]
    for name in ("redis", "postgres"):
        assert s[name]["healthcheck"]["test"][0] == "CMD", name
    for name in ("migrate", "models"):
        assert s[name]["restart"] == "no", name
    assert s["migrate"]["command"] == ["specq", "db", "upgrade"]
    assert s["models"]["command"][:3] == ["specq", "models", "pull"]
    for name in ("api", "worker"):
        deps = s[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["redis"]["condition"] == "service_healthy", name
    assert s["worker"]["depends_on"]["models"]["condition"] == "service_completed_successfully"
    assert s["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    # the models volume is where `models pull` writes and the worker reads
    assert "models:/var/lib/specq" in s["models"]["volumes"] and "models:/var/lib/specq" in s["worker"]["volumes"]
    assert s["models"]["environment"]["SPECQ_HOME"] == s["worker"]["environment"]["SPECQ_HOME"] == "/var/lib/specq"
    # the one-shot pulls; a worker that finds a model missing says so and waits (a volume not mounted)
    assert s["worker"]["environment"]["SPECQ_PULL_MODELS"] == s["worker-cpu"]["environment"]["SPECQ_PULL_MODELS"] == "0"
    # GPU worker: an NVIDIA reservation, a CUDA build, a stop grace period well above a phase
    dev = s["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"] and dev["device_ids"] == ["0"]
    assert s["worker"]["build"]["target"] == "worker" and s["api"]["build"]["target"] == "api"
    assert _seconds(s["worker"]["stop_grace_period"]) >= 300
    dockerfile = (REPO / "Dockerfile").read_text()
    worker_build = dockerfile.split("AS worker-build", 1)[1].split("\nFROM ", 1)[0]
    assert re.search(r"^FROM nvidia/cuda:\$\{CUDA_VERSION\}-devel", dockerfile, re.M)
    assert re.search(r"^FROM nvidia/cuda:\$\{CUDA_VERSION\}-runtime-\S+ AS worker$", dockerfile, re.M)
    assert "-DGGML_CUDA=on" in worker_build and "scripts/build-llama.sh" in worker_build
    api_stage = dockerfile.split("AS api", 1)[1].split("\nFROM ", 1)[0]
    assert "llama-cpp-python" in api_stage and "build-llama" not in api_stage  # the API image has no llama.cpp
    # the documented way to run one worker per GPU is there
    text = COMPOSE.read_text()
    assert "One worker per GPU" in text and 'device_ids: ["1"]' in text
    assert "one worker per GPU" in (REPO / "docs" / "deploy.md").read_text()


def _started(services: dict, profiles: list[str]) -> set[str]:
    """The services `docker compose up` starts with these profiles on (the Compose spec's rule: a
    service without `profiles` always, one with them when one of its profiles is on)."""
    return {name for name, svc in services.items() if not svc.get("profiles") or set(svc["profiles"]) & set(profiles)}


def _env_file() -> dict[str, str]:
    lines = (REPO / ".env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def test_cpu_profile_runs_without_nvidia_and_the_default_stays_the_gpu():
    """`docker compose up` (COMPOSE_PROFILES=gpu from .env) starts the GPU worker; `docker compose
    --profile cpu up` (the flag replaces COMPOSE_PROFILES, in v1 and v2) starts the CPU worker
    instead, and nothing it starts reserves an NVIDIA device or uses a CUDA image."""
    s = _compose()["services"]
    default = _started(s, _env_file()["COMPOSE_PROFILES"].split(","))
    assert default == {"redis", "postgres", "migrate", "models", "api", "worker"}
    cpu = _started(s, ["cpu"])
    assert cpu == {"redis", "postgres", "migrate", "models", "api", "worker-cpu"}
    for name in cpu:
        assert "deploy" not in s[name] and "nvidia" not in json.dumps(s[name]), name
    w = s["worker-cpu"]
    assert w["build"]["target"] == "worker-cpu" and w["environment"]["SPECQ_N_GPU_LAYERS"] == "0"
    assert w["command"] == s["worker"]["command"] and w["volumes"] == s["worker"]["volumes"]
    assert w["depends_on"] == s["worker"]["depends_on"] and _seconds(w["stop_grace_period"]) >= 300
    dockerfile = (REPO / "Dockerfile").read_text()
    build = dockerfile.split("AS worker-cpu-build", 1)[1].split("\nFROM ", 1)[0]
    assert "scripts/build-llama.sh" in build and "GGML_CUDA" not in build and "endswith('.cpu')" in build
    assert re.search(r"^FROM python:\S+ AS worker-cpu$", dockerfile, re.M)
    exe = shutil.which("docker-compose")
    if exe is not None:  # Debian's docker-compose 1.29 reads the profile and accepts the file with it
        r = subprocess.run([exe, "-f", str(COMPOSE), "--profile", "cpu", "config"], capture_output=True, text=True,
                           timeout=120, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd=REPO)
        assert r.returncode == 0, r.stderr
        assert yaml.safe_load(r.stdout)["services"]["worker-cpu"]["profiles"] == ["cpu"]


def test_every_image_runs_as_a_non_root_user():
    """Each stage compose runs (api, worker, worker-cpu) ends as USER specq (uid 10001), which owns
    SPECQ_HOME (the models volume takes the owner of the image's directory)."""
    dockerfile = (REPO / "Dockerfile").read_text()
    stages = dict(re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", dockerfile, re.M | re.S))
    for name in ("api", "worker", "worker-cpu"):
        users = re.findall(r"^USER (\S+)$", stages[name], re.M)
        assert users and users[-1] == "specq", name
        assert "--uid 10001" in stages[name] and "chown specq:specq /var/lib/specq" in stages[name], name
    assert not re.search(r"^\s+user:\s*[\"']?(root|0)\b", COMPOSE.read_text(), re.M)


def _argv(command: list[str]) -> list[str]:
    assert command[0] == "specq", command
    return command[1:]


@pytest.mark.services
def test_every_service_command_runs_against_local_redis_and_postgres(tiny_models, tmp_path):
    for reason in (redis_reachable(), pg_reachable()):
        if reason:
            pytest.skip(reason)
    doc = _compose()
    services = {name: _interpolate(svc, {}) for name, svc in doc["services"].items()}
    transcript: list[str] = []

    def run(label: str, argv: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
        t0 = time.monotonic()
        r = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        transcript.append(f"{label:<10} {' '.join(argv)} -> exit {r.returncode} ({time.monotonic() - t0:.1f} s)")
        return r

    base = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    base["PYTHONUNBUFFERED"] = "1"

    # redis / postgres healthchecks, as written, against the local servers
    for name in ("redis", "postgres"):
        test = services[name]["healthcheck"]["test"]
        if shutil.which(test[1]) is None:
            transcript.append(f"{name:<10} healthcheck {test[1]}: not installed here, skipped")
            continue
        r = run(f"{name}", test[1:], base, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr

    with pg_database() as pg_url:
        port = free_port()
        queue = f"specq-compose-{secrets.token_hex(4)}"

        def env_of(name: str, **extra: str) -> dict[str, str]:
            env = dict(base)
            env.update({k: str(v) for k, v in (services[name].get("environment") or {}).items()})
            # compose's service names -> the local servers; the volume -> a temporary folder
            if "SPECQ_DATABASE_URL" in env:
                env["SPECQ_DATABASE_URL"] = pg_url
            if "SPECQ_BROKER_URL" in env:
                env["SPECQ_BROKER_URL"] = REDIS_URL
            env["SPECQ_HOME"] = str(tmp_path / "home")
            env["SPECQ_QUEUE"] = queue
            env.update(extra)
            return env

        # migrate: `specq db upgrade`, one-shot, exit 0
        r = run("migrate", [sys.executable, "-m", "specq", *_argv(services["migrate"]["command"])], env_of("migrate"))
        assert r.returncode == 0, r.stdout + r.stderr
        from specq.storage import db

        assert db.current_revision(pg_url) == db.head_revision()

        # the first key, as docs/deploy.md says: `docker compose run --rm migrate specq keys create …`
        assert services["api"]["environment"]["SPECQ_AUTH"] == "keys"
        r = run("keys", [sys.executable, "-m", "specq", "keys", "create", "--tenant", "ops", "--admin"], env_of("migrate"))
        assert r.returncode == 0, r.stdout + r.stderr
        key = r.stdout.strip()

        # models: `specq models pull`, one-shot; here only where the default pair is already pulled
        # (CI pulls it before the tests), so the test downloads nothing
        home = os.environ.get("SPECQ_HOME") or os.path.expanduser("~/.cache/specq")
        lst = run("models?", [sys.executable, "-m", "specq", "models", "list"], dict(base, SPECQ_HOME=home))
        if lst.returncode == 0 and lst.stdout.count("verified") >= 2:
            r = run("models", [sys.executable, "-m", "specq", *_argv(services["models"]["command"])],
                    dict(base, SPECQ_HOME=home), timeout=300)
            assert r.returncode == 0 and "already present and verified" in r.stdout, r.stdout + r.stderr
        else:
            transcript.append("models     the default models are not pulled here: skipped (would download them)")

        # api + worker, long-running; the worker on the tiny models and the CPU
        tiny = dict(SPECQ_TARGET=str(tiny_models.target), SPECQ_SPECULATOR=str(tiny_models.speculator),
                    SPECQ_N_GPU_LAYERS="0", SPECQ_N_CTX="512", SPECQ_THREADS="2", SPECQ_PROGRESS_INTERVAL="0.2")
        st = Stack(env=env_of("api", SPECQ_API_PORT=str(port)), port=port, logdir=tmp_path)
        st.start("api", *_argv(services["api"]["command"]))
        worker_env = env_of("worker", **tiny)
        log = open(tmp_path / "worker.log", "wb")
        worker = subprocess.Popen([sys.executable, "-m", "specq", *_argv(services["worker"]["command"])], env=worker_env,
                                  cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        st.procs["worker"] = worker
        try:
            st.wait_healthy()
            transcript.append(f"api        {' '.join(services['api']['command'])} -> healthy on :{port}")
            # the api's healthcheck, as written (python -> this interpreter)
            hc = services["api"]["healthcheck"]["test"]
            assert hc[:2] == ["CMD", "python"]
            r = run("api-hc", [sys.executable, *hc[2:]], dict(base, SPECQ_API_PORT=str(port)), timeout=30)
            assert r.returncode == 0, r.stderr
            # the worker serves a batch
            with httpx.Client(base_url=st.url, timeout=30) as c:
                assert c.get("/v1/batches").status_code == 401  # keys are on
                c.headers["Authorization"] = f"Bearer {key}"
                files = [("file", ("one.py", b"def one():\n    return 1\n")), ("file", ("two.md", b"# Two\n"))]
                b = c.post("/v1/batches", files=files, data={"question": "What is this?", "params": '{"max_tokens": 3}'}).json()
                deadline = time.monotonic() + 120
                while b["status"] not in ("completed", "failed", "cancelled"):
                    assert time.monotonic() < deadline, b
                    time.sleep(0.2)
                    b = c.get(f"/v1/batches/{b['id']}").json()
                assert b["status"] == "completed" and b["request_counts"]["completed"] == 2, b
                assert f'specq_workers{{queue="{queue}"}} 1.0' in c.get("/metrics").text
            transcript.append(f"worker     {' '.join(services['worker']['command'])} -> served a 2-file batch")
            # SIGTERM (what `docker compose stop` sends): a warm shutdown, well within stop_grace_period
            t0 = time.monotonic()
            os.killpg(worker.pid, signal.SIGTERM)
            rc = worker.wait(timeout=_seconds(services["worker"]["stop_grace_period"]))
            transcript.append(f"worker     SIGTERM -> exit {rc} after {time.monotonic() - t0:.1f} s")
            assert rc == 0, (tmp_path / "worker.log").read_text()[-3000:]
        finally:
            st.stop()
            log.close()
    print("\n" + "\n".join(transcript))
