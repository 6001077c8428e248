#!/usr/bin/env python
"""What idle event streams cost one API process: /healthz and GET /v1/jobs latency with N streams open.

Starts a real `specq api` on the embedded default (SQLite, no worker: the followed jobs stay queued, so
the streams are idle), or on the store and broker of SPECQ_DATABASE_URL / SPECQ_BROKER_URL when they are
set (run `specq db upgrade` first there). For each N it opens N event streams (GET /v1/jobs/{id}/events,
raw sockets, one connection each) on one job (`--jobs one`) or on N different jobs (`--jobs each`, the
worst case: a poller per job), waits 2 s, then times `--probes` requests of each kind, one at a time.

    .venv/bin/python scripts/measure_idle_streams.py --streams 0 100 300 1000 --jobs one
    .venv/bin/python scripts/measure_idle_streams.py --streams 0 100 300 --jobs each --json out.json

The numbers in docs/reliability.md ("Idle streams") came from this script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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


async def _open(port: int, job_id: str) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
                 .encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"stream refused: {head[:200]!r}")
    return writer


def _times(client: httpx.Client, path: str, n: int) -> dict[str, float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get(path)
        out.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
        time.sleep(0.02)
    out.sort()
    return {"median_ms": round(statistics.median(out), 1), "p95_ms": round(out[int(len(out) * 0.95) - 1], 1),
            "max_ms": round(out[-1], 1)}


async def _measure(port: int, n: int, jobs: str, probes: int) -> dict:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
        ids = [c.post("/v1/jobs", json={"text": "x = 1\n", "question": "What?"}).json()["id"]
               for _ in range(n if jobs == "each" and n else 1)]
        writers = []
        try:
            for i in range(n):
                writers.append(await _open(port, ids[i % len(ids)]))
            await asyncio.sleep(2.0)
            health = await asyncio.to_thread(_times, c, "/healthz", probes)
            listing = await asyncio.to_thread(_times, c, "/v1/jobs?limit=50", probes)
        finally:
            for w in writers:
                w.close()
            for i in ids:
                c.delete(f"/v1/jobs/{i}")
        await asyncio.sleep(1.0)
    return {"streams": n, "jobs": len(ids) if n else 0, "healthz": health, "list_jobs": listing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[0, 100, 300, 1000])
    ap.add_argument("--jobs", choices=["one", "each"], default="one")
    ap.add_argument("--probes", type=int, default=40)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    port = _free_port()
    home = tempfile.mkdtemp(prefix="specq-streams-")
    env = dict(os.environ, SPECQ_HOME=home, SPECQ_API_PORT=str(port), SPECQ_MAX_STREAMS=str(max(args.streams) + 8),
               SPECQ_MAX_CONNECTIONS=str(max(2048, 2 * max(args.streams) + 64)))
    api = subprocess.Popen([sys.executable, "-m", "specq", "api"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or api.poll() is not None:
                raise SystemExit("the API did not start")
            time.sleep(0.2)
        rows = []
        for n in args.streams:
            row = asyncio.run(_measure(port, n, args.jobs, args.probes))
            rows.append(row)
            print(f"{n:5d} streams on {row['jobs']:4d} job(s): /healthz median {row['healthz']['median_ms']:7.1f} ms "
                  f"p95 {row['healthz']['p95_ms']:7.1f} ms | GET /v1/jobs median {row['list_jobs']['median_ms']:7.1f} "
                  f"ms p95 {row['list_jobs']['p95_ms']:7.1f} ms", flush=True)
        report = {"command": "scripts/measure_idle_streams.py " + " ".join(sys.argv[1:]), "cpus": os.cpu_count(),
                  "load_before": os.getloadavg(), "store": os.environ.get("SPECQ_DATABASE_URL", "sqlite (embedded)"),
                  "rows": rows}
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
    finally:
        api.terminate()
        api.wait(timeout=30)


if __name__ == "__main__":
    main()
