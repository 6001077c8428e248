#!/usr/bin/env python
"""Queue overhead of the job service: submit -> worker start, over many tiny jobs.

For each stack it starts a real API and a real worker (tiny random-weight models, CPU), then submits
jobs one at a time (max_tokens 1) and waits for each to finish before the next, so the worker is always
idle when a job arrives and the wait measured is the service's overhead, not a queue of other jobs:

* queue_wait_ms — the job's row: from the API inserting it (before sending to the broker) to the
  worker claiming it (`jobs.mark_running`): store + broker publish + broker delivery + claim;
* submit_ms — the client's POST /v1/jobs round trip (validation, insert, publish);
* turnaround_ms — client POST sent -> client sees `succeeded` (includes the run and the polling).

Before each job the client pauses a random 0-`--gap` seconds, so arrivals are not in step with the
embedded broker's polling (a worker that just finished a job polls on a fixed phase).

Stacks: `redis` (SPECQ_BROKER_URL=Redis, job store on a throwaway PostgreSQL database) and `embedded`
(`specq up` on the defaults: SQLite + kombu's SQLAlchemy transport, polled every
SPECQ_BROKER_POLL_INTERVAL seconds).

    .venv/bin/python scripts/bench_queue.py --jobs 200 [--stack redis|embedded|both] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    rank = q * (len(v) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def _summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": round(_pct(values, 0.5), 2), "p95": round(_pct(values, 0.95), 2),
            "mean": round(statistics.fmean(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


@contextlib.contextmanager
def _pg_database(admin_url: str):
    import psycopg

    admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=3)
    name = f"specq_bench_{secrets.token_hex(4)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextlib.contextmanager
def _processes(env: dict[str, str], commands: list[list[str]], logdir: Path):
    procs = []
    try:
        for i, cmd in enumerate(commands):
            log = open(logdir / f"proc{i}.log", "wb")
            procs.append(subprocess.Popen([sys.executable, "-m", "specq", *cmd], env=env, cwd=REPO, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def _wait_healthy(url: str, procs, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise SystemExit("a service process exited during startup; see its log")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"API at {url} not healthy after {timeout}s")


def run_jobs(url: str, n: int, warmup: int, poll: float, gap: float) -> dict:
    import random

    rng = random.Random(0)
    waits, submits, turnarounds = [], [], []
    doc = "def add(a, b):\n    return a + b\n"
    with httpx.Client(base_url=url, timeout=60) as c:
        for i in range(warmup + n):
            # a random pause, so arrivals are not in step with the embedded broker's polling
            time.sleep(rng.uniform(0, gap))
            t0 = time.perf_counter()
            r = c.post("/v1/jobs", json={"text": doc, "question": "what?", "params": {"max_tokens": 1, "seed": 1}})
            t1 = time.perf_counter()
            r.raise_for_status()
            job_id = r.json()["id"]
            while True:
                job = c.get(f"/v1/jobs/{job_id}").json()
                if job["status"] in ("succeeded", "failed", "cancelled"):
                    break
                time.sleep(poll)
            t2 = time.perf_counter()
            if job["status"] != "succeeded":
                raise SystemExit(f"job {job_id} {job['status']}: {job.get('error')}")
            if i >= warmup:
                waits.append(job["queue_wait_ms"])
                submits.append((t1 - t0) * 1000)
                turnarounds.append((t2 - t0) * 1000)
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{warmup + n} jobs", file=sys.stderr)
    return {"queue_wait_ms": _summary(waits), "submit_ms": _summary(submits), "turnaround_ms": _summary(turnarounds)}


def bench_stack(stack: str, args, models: dict[str, str]) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"specq-bench-{stack}-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(SPECQ_HOME=str(home), SPECQ_API_PORT=str(port), SPECQ_TARGET=models["target"],
               SPECQ_SPECULATOR=models["speculator"], SPECQ_N_GPU_LAYERS="0", SPECQ_N_CTX="512",
               SPECQ_BROKER_POLL_INTERVAL=str(args.poll_interval), PYTHONUNBUFFERED="1")
    print(f"{stack}: starting (logs in {home})", file=sys.stderr)
    with contextlib.ExitStack() as es:
        if stack == "redis":
            pg = es.enter_context(_pg_database(args.pg_admin_url))
            env.update(SPECQ_DATABASE_URL=pg, SPECQ_BROKER_URL=args.redis_url,
                       SPECQ_QUEUE=f"specq-bench-{secrets.token_hex(4)}")
            subprocess.run([sys.executable, "-m", "specq", "db", "upgrade"], env=env, cwd=REPO, check=True,
                           capture_output=True)
            procs = es.enter_context(_processes(env, [["api", "--loglevel", "warning"],
                                                      ["worker", "--loglevel", "WARNING"]], home))
        else:
            procs = es.enter_context(_processes(env, [["up", "--loglevel", "WARNING"]], home))
        _wait_healthy(url, procs)
        out = run_jobs(url, args.jobs, args.warmup, args.client_poll, args.gap)
    out.update(stack=stack, jobs=args.jobs, broker="redis" if stack == "redis" else
               f"embedded (SQLAlchemy transport on SQLite, poll {args.poll_interval}s)",
               store="postgresql" if stack == "redis" else "sqlite")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5, help="jobs run first and not counted")
    ap.add_argument("--stack", choices=["redis", "embedded", "both"], default="both")
    ap.add_argument("--redis-url", default=os.environ.get("SPECQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/13"))
    ap.add_argument("--pg-admin-url", default=os.environ.get("SPECQ_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--poll-interval", type=float, default=0.1, help="SPECQ_BROKER_POLL_INTERVAL for the embedded broker")
    ap.add_argument("--client-poll", type=float, default=0.02, help="seconds between the client's GETs")
    ap.add_argument("--gap", type=float, default=0.25, help="random pause before each job, uniform in [0, gap] s")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    from specq.testing.synthetic import write_qwen2_gguf

    mdir = Path(tempfile.mkdtemp(prefix="specq-bench-models-"))
    models = {"target": str(write_qwen2_gguf(mdir / "target.gguf", "tiny", seed=0, n_layer=4)),
              "speculator": str(write_qwen2_gguf(mdir / "speculator.gguf", "tiny", seed=0, n_layer=2))}
    stacks = ["redis", "embedded"] if args.stack == "both" else [args.stack]
    results = [bench_stack(s, args, models) for s in stacks]
    print(f"{'stack':<9} {'metric':<14} {'p50':>9} {'p95':>9} {'mean':>9} {'max':>9}   (ms, {args.jobs} jobs)")
    for r in results:
        for metric in ("queue_wait_ms", "submit_ms", "turnaround_ms"):
            m = r[metric]
            print(f"{r['stack']:<9} {metric:<14} {m['p50']:>9.1f} {m['p95']:>9.1f} {m['mean']:>9.1f} {m['max']:>9.1f}")
    if args.json:
        args.json.write_text(json.dumps({"cpu_count": os.cpu_count(), "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
