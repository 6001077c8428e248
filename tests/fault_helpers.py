"""What the fault and load tests share: a service stack on throwaway servers, killing and starting
workers, polling the store through outages, and the worker processes' memory.

Settings of the stacks: heartbeats every 0.2 s, a job is stale after 8 s without one, and each worker's
reconciler sweeps every second, so a killed worker's job is back in the queue within ~10 s (production
defaults: 0.5 s, 120 s, 30 s). llama.cpp runs one thread: on a shared 2-core machine two threads that
wait on each other make decode 10x slower whenever another process takes a core.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time

from fault_servers import throwaway_postgres, throwaway_redis
from service_helpers import Stack, base_env, free_port

#: settings every fault/load stack shares (see the module doc)
FAULT_ENV = dict(SPECQ_PROGRESS_INTERVAL="0.2", SPECQ_STALE_AFTER="8", SPECQ_RECONCILE_INTERVAL="1",
                 SPECQ_MAX_ATTEMPTS="2", SPECQ_RETRY_BACKOFF="0.5", SPECQ_RETRY_BACKOFF_MAX="5",
                 SPECQ_STORE_RETRY_FOR="120", SPECQ_WARM_UP="false", SPECQ_THREADS="1")


def fault_stack(home, models, *, database_url: str | None = None, broker_url: str | None = None, **extra) -> Stack:
    """A Stack (not started) on the given servers, or on the embedded default when both are None."""
    port = free_port()
    env = base_env(home, models, SPECQ_API_PORT=str(port), SPECQ_QUEUE=f"faults-{secrets.token_hex(3)}",
                   **FAULT_ENV)
    if database_url:
        env["SPECQ_DATABASE_URL"] = database_url
    if broker_url:
        env["SPECQ_BROKER_URL"] = broker_url
    env.update(extra)
    return Stack(env=env, port=port, logdir=home)


@contextlib.contextmanager
def api_on_throwaway_servers(home, models, **extra):
    """A throwaway Redis (home/redis) and PostgreSQL, migrated, with `specq api` started on them:
    yields (stack, redis, pg); everything is stopped afterwards."""
    with throwaway_redis(home / "redis") as redis, throwaway_postgres() as pg:
        st = fault_stack(home, models, database_url=pg.url, broker_url=redis.url, **extra)
        st.cli("db", "upgrade", check=True)
        try:
            st.start("api", "api")
            yield st, redis, pg
        finally:
            st.stop()


def start_worker(st: Stack, name: str) -> subprocess.Popen:
    return st.start(name, "worker", "--loglevel", "INFO")


def start_slots_worker(st: Stack, name: str, slots: int, **env: str) -> subprocess.Popen:
    """A worker with `slots` serving slots and `env` on top of the stack's environment, started and
    waited for until it logs "ready: target" (it must still be alive then)."""
    saved = dict(st.env)
    st.env.update({"SPECQ_SLOTS": str(slots), **env})
    try:
        p = st.start(name, "worker", "--loglevel", "INFO")
    finally:
        st.env.clear()
        st.env.update(saved)
    wait_for(lambda: "ready: target" in st.log(name) or p.poll() is not None, 120, f"{name} ready")
    assert p.poll() is None, st.log(name)[-3000:]
    return p


def start_seamed_worker(st: Stack, name: str, slots: int, *, fails: str = "", blocks: str = "",
                        **env: str) -> subprocess.Popen:
    """As start_slots_worker, with the engine loop's test seams (tests/seamed_worker.py): `fails` = the
    question whose decode batches fail, `blocks` = the question that blocks the loop for good."""
    import sys
    from pathlib import Path

    launcher = Path(__file__).resolve().parent / "seamed_worker.py"
    args = [sys.executable, str(launcher), "--loglevel", "INFO"]
    args += ["--fails", fails] if fails else []
    args += ["--blocks", blocks] if blocks else []
    log = open(st.logdir / f"{name}.log", "wb")
    p = subprocess.Popen(args, env={**st.env, "SPECQ_SLOTS": str(slots), **env}, cwd=launcher.parents[1],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    st.procs[name] = p
    wait_for(lambda: "ready: target" in st.log(name) or p.poll() is not None, 120, f"{name} ready")
    assert p.poll() is None, st.log(name)[-3000:]
    return p


@contextlib.contextmanager
def workers_reaped(st: Stack):
    """Around one test: the workers it started and left running (an assertion failed before its own
    kill9) are killed after it, so they cannot take the next test's jobs."""
    before = set(st.procs)
    try:
        yield
    finally:
        for name in set(st.procs) - before:
            if name.startswith("worker") and st.procs[name].poll() is None:
                kill9(st, name)


def kill9(st: Stack, name: str) -> None:
    """SIGKILL the process (group) `name`, as the OOM killer would, and reap it."""
    p = st.procs[name]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)


def worker_logs(st: Stack) -> str:
    return "".join(st.log(name) for name in st.procs if name.startswith("worker"))


def job_row(st: Stack, job_id: str):
    """The job as the store has it (not through the API, which may be restarting)."""
    from specq.storage import db, jobs

    with db.session(st.database_url) as s:
        return jobs.get_job(s, job_id)


def wait_for(check, timeout: float, what: str, interval: float = 0.1):
    """Poll `check()` until it returns something truthy (errors, e.g. a server restarting, count as
    not yet); return it, or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"{what}: not after {timeout}s (last: {last!r})")


def statuses(st: Stack, job_ids: list[str]) -> dict[str, int]:
    """{status: count} of `job_ids` in the store."""
    from sqlalchemy import func, select

    from specq.storage import db
    from specq.storage.models import Job

    with db.session(st.database_url) as s:
        rows = s.execute(select(Job.status, func.count()).where(Job.id.in_(job_ids)).group_by(Job.status)).all()
        s.commit()
    return {status: n for status, n in rows}


def all_finished(st: Stack, job_ids: list[str]) -> bool:
    counts = statuses(st, job_ids)
    return sum(counts.get(k, 0) for k in ("succeeded", "failed", "cancelled")) == len(job_ids)


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid`, MiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for {pid}")


def percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
