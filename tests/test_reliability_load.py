"""Load: 1,000 small jobs submitted concurrently over REST, one worker, tiny models, throwaway
Redis + PostgreSQL. All complete exactly once; the API's submit latency (p50/p95/max) and the worker's
resident memory are measured, and the memory must not grow with the number of jobs run.
The figures go to docs/reliability-figures.*.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fault_helpers import (all_finished, api_on_throwaway_servers, percentile, rss_mib, start_worker, statuses, wait_for,
                           worker_logs)
from fault_servers import servers_available
from reliability_figures import record, tally

pytestmark = [pytest.mark.load, pytest.mark.timeout(1500)]

N_JOBS = 1000
CLIENTS = 16
DOC = "def add(a, b):\n    return a + b\n"
PARAMS = {"max_tokens": 1, "seed": 1}
#: the worker's memory is compared between these numbers of finished jobs (after allocator and cache warm-up)
RSS_FROM, RSS_TO = 200, N_JOBS
#: allowed growth over those 800 jobs: 16 MiB (20 KiB per job) covers allocator noise, not a leak
RSS_GROWTH_LIMIT_MIB = 16.0


def test_1000_concurrent_small_jobs(tiny_models, tmp_path):
    reason = servers_available()
    if reason:
        pytest.skip(reason)
    with api_on_throwaway_servers(tmp_path, tiny_models) as (st, _redis, _pg):
        # no KV caches: the target's prompt cache keeps up to SPECQ_CACHE_BYTES of saved states by
        # design (LRU; test_doc_cache); what this test bounds is every other growth per job
        st.env["SPECQ_CACHE_BYTES"] = "0"
        worker = start_worker(st, "worker")
        st.wait_healthy()
        wait_for(lambda: "ready: target" in st.log("worker"), 180, "worker ready")
        _run(st, worker.pid)


def _run(st, worker_pid: int) -> None:
    latencies: list[float] = []
    ids: list[str] = []
    lock = threading.Lock()
    rss: dict[int, float] = {}  # jobs finished -> worker RSS (MiB), sampled
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                done = statuses(st, ids[:]).get("succeeded", 0) if ids else 0
                rss[done] = rss_mib(worker_pid)
            except Exception:  # a sample lost to a busy store is fine
                pass
            stop.wait(1.0)

    def submit(i: int, client: httpx.Client) -> None:
        t = time.perf_counter()
        r = client.post("/v1/jobs", json={"text": DOC, "question": f"what does add return? ({i})", "params": PARAMS})
        dt = (time.perf_counter() - t) * 1000.0
        assert r.status_code == 202, r.text
        with lock:
            latencies.append(dt)
            ids.append(r.json()["id"])

    rss[0] = rss_mib(worker_pid)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    with httpx.Client(base_url=st.url, timeout=120, limits=limits) as client, ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda i: submit(i, client), range(N_JOBS)))
    submit_s = time.monotonic() - t0
    try:
        wait_for(lambda: all_finished(st, ids), 1200, f"{N_JOBS} jobs finished", interval=1.0)
    finally:
        stop.set()
        sampler.join(timeout=10)
    wall = time.monotonic() - t0
    rss_end = rss_mib(worker_pid)
    rss[N_JOBS] = rss_end
    from specq.storage import db

    with db.session(st.database_url) as s:
        counts = tally(s, ids, worker_logs(st))
    warm = min((n for n in rss if n >= RSS_FROM), default=N_JOBS)
    growth = rss_end - rss[warm]
    per_job_kib = growth * 1024.0 / max(1, N_JOBS - warm)
    figures = dict(
        clients=CLIENTS,
        submit_p50_ms=round(percentile(latencies, 0.50), 1),
        submit_p95_ms=round(percentile(latencies, 0.95), 1),
        submit_max_ms=round(max(latencies), 1),
        submit_all_s=round(submit_s, 1),
        all_done_s=round(wall, 1),
        jobs_per_s=round(N_JOBS / wall, 1),
        worker_rss_mib={"start": round(rss[0], 1), f"after {warm}": round(rss[warm], 1),
                        f"after {N_JOBS}": round(rss_end, 1)},
        rss_growth_kib_per_job=round(per_job_kib, 2),
    )
    record("load_1000", counts, **figures)
    assert counts == {"submitted": N_JOBS, "completed": N_JOBS, "failed": 0, "duplicated": 0, "lost": 0}, counts
    assert growth < RSS_GROWTH_LIMIT_MIB, figures
