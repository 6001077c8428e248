"""Real processes for the job-service tests: a throwaway PostgreSQL database, a Redis queue name of
our own, and `specq api` / `specq worker` / `specq up` subprocesses on free ports.

Nothing here is mocked: the API is uvicorn in its own process, the worker is Celery with the real
engine and tiny random-weight models, and the broker is the real local Redis (or the embedded
SQLAlchemy transport on a SQLite file).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("SPECQ_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
#: a Redis database number of its own, so other test runs' keys never meet ours
REDIS_URL = os.environ.get("SPECQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_reachable(url: str = REDIS_URL) -> str | None:
    """None if Redis answers PING, else the reason."""
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
        return None
    except Exception as e:  # pragma: no cover - the server runs in CI and on dev boxes
        return f"Redis unreachable at {url}: {e}"


@contextlib.contextmanager
def pg_database():
    """A fresh PostgreSQL database (URL), dropped afterwards."""
    import psycopg

    admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    name = f"specq_svc_{secrets.token_hex(5)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        from specq.storage import db

        db.dispose_engines()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextlib.contextmanager
def empty_store(backend: str, tmp_path: Path):
    """An empty job store (URL, not migrated): a SQLite file under `tmp_path`, or a throwaway
    PostgreSQL database (the test is skipped when PostgreSQL does not answer)."""
    import pytest

    from specq.storage import db

    if backend == "sqlite":
        try:
            yield f"sqlite:///{tmp_path / 'specq.sqlite'}"
        finally:
            db.dispose_engines()
        return
    reason = pg_reachable()
    if reason:
        pytest.skip(reason)
    with pg_database() as url:
        yield url


def pg_reachable() -> str | None:
    try:
        import psycopg

        psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
        return None
    except Exception as e:  # pragma: no cover
        return f"PostgreSQL unreachable at {PG_ADMIN_URL}: {e}"


def specq_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "specq", *args]


@dataclass
class Stack:
    """The environment of one service deployment under test, and its processes."""

    env: dict[str, str]
    port: int
    logdir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str | None:
        return self.env.get("SPECQ_DATABASE_URL") or f"sqlite:///{Path(self.env['SPECQ_HOME']) / 'specq.sqlite'}"

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")
        p = subprocess.Popen(specq_cmd(*args), env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        path = self.logdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_healthy(self, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log(name)[-3000:]}")
            try:
                r = httpx.get(f"{self.url}/healthz", timeout=2)
                if r.status_code == 200:
                    return r.json()
                last = r.text
            except httpx.HTTPError as e:
                last = str(e)
            time.sleep(0.2)
        raise RuntimeError(f"API not healthy after {timeout}s: {last}\n{self.log('api')[-3000:]}")

    def cli(self, *args: str, timeout: float = 180, check: bool = False) -> subprocess.CompletedProcess:
        env = dict(self.env, SPECQ_API_URL=self.url, COLUMNS="160")
        r = subprocess.run(specq_cmd(*args), env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"specq {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def base_env(home: Path, models, **extra: str) -> dict[str, str]:
    """The environment of a service under test: its own SPECQ_HOME, tiny models on the CPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(
        SPECQ_HOME=str(home),
        SPECQ_TARGET=str(models.target),
        SPECQ_SPECULATOR=str(models.speculator),
        SPECQ_N_GPU_LAYERS="0",
        SPECQ_N_CTX="4096",
        SPECQ_THREADS="2",
        SPECQ_PROGRESS_INTERVAL="0.2",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def wait_job(client: httpx.Client, job_id: str, statuses=("succeeded", "failed", "cancelled"), timeout: float = 120.0,
             until=None) -> dict:
    """Poll GET /v1/jobs/{id} until its status is in `statuses` (or `until(job)` is true)."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if (until(job) if until else job["status"] in statuses):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['status']} ({job.get('progress')}) after {timeout}s")
        time.sleep(0.1)


def require_servers() -> None:
    """Skip (with the reason) when the local Redis or PostgreSQL does not answer."""
    import pytest

    for reason in (redis_reachable(), pg_reachable()):
        if reason:
            pytest.skip(reason)


def redis_pg_env(pg_url: str, queue_prefix: str) -> dict[str, str]:
    """Settings for a stack on the real Redis + a throwaway PostgreSQL database, with its own queue."""
    return dict(SPECQ_DATABASE_URL=pg_url, SPECQ_BROKER_URL=REDIS_URL, SPECQ_QUEUE=f"{queue_prefix}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def running(st: Stack, *services: tuple[str, ...]):
    """Start each (name, *args) service of `st`, wait for /healthz, yield the stack, stop it all."""
    try:
        for name, *args in services:
            st.start(name, *args)
        st.wait_healthy()
        yield st
    finally:
        st.stop()


@contextlib.contextmanager
def embedded_up(home: Path, models, **extra: str):
    """`specq up` alone on the embedded default (SQLite job store + SQLAlchemy broker under `home`),
    tiny models, a free port; yields the running Stack."""
    port = free_port()
    st = Stack(env=base_env(home, models, SPECQ_API_PORT=str(port), **extra), port=port, logdir=home)
    with running(st, ("up", "up")):
        yield st


def clean_env(home: Path, port: int, **extra: str) -> dict[str, str]:
    """This process's environment without any SPECQ_ setting, with SPECQ_HOME and SPECQ_API_PORT set and
    `extra` on top: what a test's own `specq api` runs with."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(SPECQ_HOME=str(home), SPECQ_API_PORT=str(port), PYTHONUNBUFFERED="1", **extra)
    return env


@contextlib.contextmanager
def api_only(backend: str, home: Path, port: int, env_of, queue_prefix: str):
    """A real `specq api` and no worker (jobs stay queued) on `backend` "sqlite" (the embedded default) or
    "postgresql" (a throwaway database + the local Redis; skipped when they do not answer); `env_of(**extra)`
    gives its environment. Yields the Stack."""
    if backend == "sqlite":
        with running(Stack(env=env_of(), port=port, logdir=home), ("api", "api")) as st:
            yield st
        return
    require_servers()
    with pg_database() as pg_url:
        st = Stack(env=env_of(**redis_pg_env(pg_url, queue_prefix)), port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        with running(st, ("api", "api")):
            yield st
