#!/usr/bin/env python
"""Throughput of one batch: N tiny-model jobs submitted as one JSONL batch, POST to `completed`.

Starts a real API and real worker process(es) (tiny random-weight models on the CPU), like
scripts/bench_queue.py, submits one batch of `--jobs` requests (small code documents, `--max-tokens`
each), polls GET /v1/batches/{id} until it is completed, then reads GET /v1/batches/{id}/stats
(computed in SQL). Reports:

* submit_ms — POST /v1/batches round trip (validation, all jobs inserted in one transaction, one
  broker message per job);
* wall_s / jobs_per_s — client POST to the client seeing `completed` (includes polling, `--poll`);
* the batch's own numbers: first job start -> last job end, per-phase p50/p95 of the jobs.

Stacks: `redis` (Redis broker + throwaway PostgreSQL database, the default) or `embedded`
(`specq up` on SQLite + the SQLAlchemy broker).

    .venv/bin/python scripts/bench_batch.py --jobs 50 [--stack redis|embedded] [--workers 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_queue import REPO, _free_port, _pg_database, _processes, _wait_healthy  # noqa: E402


def run_batch(url: str, n: int, max_tokens: int, poll: float) -> dict:
    lines = []
    for i in range(n):
        doc = f"def f{i}(x):\n    \"\"\"Scale x by {i}.\"\"\"\n    return x * {i}\n\n\nRESULT_{i} = f{i}({i})\n"
        lines.append(json.dumps({"custom_id": f"req-{i:03d}", "text": doc, "question": f"What does f{i} return?",
                                 "params": {"max_tokens": max_tokens, "seed": i}}))
    body = ("\n".join(lines) + "\n").encode()
    with httpx.Client(base_url=url, timeout=120) as c:
        t0 = time.perf_counter()
        r = c.post("/v1/batches", files={"input": ("bench.jsonl", body, "application/jsonl")},
                   data={"metadata": json.dumps({"name": "bench"})})
        t1 = time.perf_counter()
        r.raise_for_status()
        batch = r.json()
        if batch["status"] != "in_progress":
            raise SystemExit(f"batch {batch['status']}: {batch.get('errors')}")
        while batch["status"] not in ("completed", "failed", "cancelled"):
            time.sleep(poll)
            batch = c.get(f"/v1/batches/{batch['id']}").json()
        t2 = time.perf_counter()
        stats = c.get(f"/v1/batches/{batch['id']}/stats").json()
        n_results = len(c.get(f"/v1/batches/{batch['id']}/results").text.splitlines())
    if batch["status"] != "completed" or batch["request_counts"]["completed"] != n or n_results != n:
        raise SystemExit(f"batch {batch['id']} {batch['status']} {batch['request_counts']}, {n_results} results")
    wall = t2 - t0
    return {"batch_id": batch["id"], "jobs": n, "max_tokens": max_tokens, "submit_ms": round((t1 - t0) * 1000, 1),
            "wall_s": round(wall, 2), "jobs_per_s": round(n / wall, 2),
            "batch_wall_s": round(stats["wall_s"], 2), "batch_jobs_per_s": round(stats["jobs_per_s"], 2),
            "completion_tokens_mean": stats["completion_tokens_mean"], "prompt_tokens_mean": stats["prompt_tokens_mean"],
            "phases_ms": {p: {"p50": round(v["p50"], 2), "p95": round(v["p95"], 2)} for p, v in stats["phases"].items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--workers", type=int, default=1, help="worker processes (redis stack), each with its own models")
    ap.add_argument("--threads", type=int, default=2, help="SPECQ_THREADS per worker")
    ap.add_argument("--stack", choices=["redis", "embedded"], default="redis")
    ap.add_argument("--redis-url", default=os.environ.get("SPECQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/13"))
    ap.add_argument("--pg-admin-url", default=os.environ.get("SPECQ_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between the client's GETs")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    from specq.testing.synthetic import write_qwen2_gguf

    mdir = Path(tempfile.mkdtemp(prefix="specq-bench-models-"))
    home = Path(tempfile.mkdtemp(prefix=f"specq-bench-batch-{args.stack}-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(SPECQ_HOME=str(home), SPECQ_API_PORT=str(port),
               SPECQ_TARGET=str(write_qwen2_gguf(mdir / "target.gguf", "tiny", seed=0, n_layer=4)),
               SPECQ_SPECULATOR=str(write_qwen2_gguf(mdir / "speculator.gguf", "tiny", seed=0, n_layer=2)),
               SPECQ_N_GPU_LAYERS="0", SPECQ_N_CTX="512", SPECQ_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
    print(f"{args.stack}: starting (logs in {home})", file=sys.stderr)
    with contextlib.ExitStack() as es:
        if args.stack == "redis":
            pg = es.enter_context(_pg_database(args.pg_admin_url))
            env.update(SPECQ_DATABASE_URL=pg, SPECQ_BROKER_URL=args.redis_url,
                       SPECQ_QUEUE=f"specq-bench-{secrets.token_hex(4)}")
            subprocess.run([sys.executable, "-m", "specq", "db", "upgrade"], env=env, cwd=REPO, check=True,
                           capture_output=True)
            cmds = [["api", "--loglevel", "warning"]] + [["worker", "--loglevel", "WARNING"]] * args.workers
            procs = es.enter_context(_processes(env, cmds, home))
        else:
            procs = es.enter_context(_processes(env, [["up", "--loglevel", "WARNING"]], home))
        _wait_healthy(url, procs)
        time.sleep(1.0)  # the worker(s) finish loading + warm-up after the API is healthy
        out = run_batch(url, args.jobs, args.max_tokens, args.poll)
    out.update(stack=args.stack, workers=args.workers if args.stack == "redis" else 1, cpu_count=os.cpu_count())
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
