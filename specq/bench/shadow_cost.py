"""`specq bench shadow-cost`: what shadow checks (SPECQ_SHADOW_RATE) cost the jobs that arrive while they run
(issue 48 "Measure"; docs/quality.md "Shadow checks").

One run is `specq bench serve` (bench/serve.py, chat path, mode auto, greedy) with Poisson arrivals against
a service started with one shadow rate; the comparison is two runs of the identical seeded job list, one
against a service at rate 0 and one at the rate measured, same host, back to back (bench/gpu/serve.sh
`calshadow`). Only jobs that mode auto sends to one-off specprefill get checks; the random-weight shapes
have no passing evidence row, so the service runs with the operator's override
(SPECQ_AUTO_QUALITY_MIN_TOKENS, the supported route for benchmarks: no evidence row is posted); the report's
`routing` says so, and `modes` shows what auto chose.

**The arrival rate.** A shadow check only runs while the worker process has no job live, so the cost is a
matter of how often real work lands on a running check: the rate should keep the worker busy most of the
time but not all (`utilization`, default 0.7). The first run measures it: `probe` jobs one after the other
(their own documents, never the run's), the rate = utilization / their median client time (send -> done);
the second run takes the first's rate (`rate_from`), so both send the identical job list at the same offsets.
`busy_fraction` is what the client saw: the union of the jobs' send -> done intervals over the makespan.

**Shadow work inside the window.** /metrics is scraped every `scrape_s` seconds during the run
(`specq_shadow_jobs_total`, `specq_shadow_cancelled_total`, `specq_shadow_seconds_total`: counted as each
check is stored); `window` is the last scrape at or before the last job's `finished_at` minus the scrape just
before the run (after `settle_s` of quiet, so a check the probe left pending is not counted), `settled` the same after the worker has been idle `settle_s` (checks that started
inside the window and ended after it). A check's seconds are its baseline's wall time, a cancelled one to
its cut: on one GPU that is the engine time the checks held.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from dataclasses import replace
from typing import Any

from .serve import Workload, run_serve_bench
from .stats import percentile

#: the /metrics counters read (name -> report key)
COUNTERS = {"specq_shadow_jobs_total": "checks", "specq_shadow_cancelled_total": "cancelled",
            "specq_shadow_seconds_total": "seconds"}
#: the probe's documents' seed offset (never one of the run's documents: a prompt-cache hit is baseline)
PROBE_SEED_OFFSET = 104729


def scrape(base_url: str, api_key: str = "") -> dict[str, float]:
    """The shadow counters of /metrics (0 for one not present)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    text = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=30.0).text
    out = {}
    for name, key in COUNTERS.items():
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[key] = float(m.group(1)) if m else 0.0
    return out


class Scraper:
    """/metrics every `every_s` seconds in a thread: (time.time(), counters) samples."""

    def __init__(self, base_url: str, api_key: str = "", every_s: float = 0.5) -> None:
        self.base_url, self.api_key, self.every_s = base_url, api_key, every_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="shadow-cost-scrape")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), scrape(self.base_url, self.api_key)))
            except Exception:  # noqa: BLE001 - a missed scrape leaves a gap, the next one counts
                pass
            self._stop.wait(self.every_s)

    def __enter__(self) -> "Scraper":
        self.samples.append((time.time(), scrape(self.base_url, self.api_key)))
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> dict[str, float]:
        """The last sample taken at or before `t` (the first one if none)."""
        best = self.samples[0]
        for s in self.samples:
            if s[0] <= t:
                best = s
        return best[1]


def _epoch(iso: str | None) -> float | None:
    from datetime import datetime

    return None if not iso else datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round(b[k] - a[k], 3) for k in COUNTERS.values()}


def busy_fraction(jobs: list[dict]) -> float | None:
    """The share of the makespan in which at least one job was between its send and its end (client view)."""
    spans = sorted((j["sent_s"], j["end_s"]) for j in jobs if j.get("end_s") is not None)
    if not spans:
        return None
    t0, t1 = spans[0][0], max(e for _, e in spans)
    busy, lo, hi = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > hi:
            busy += hi - lo
            lo, hi = s, e
        else:
            hi = max(hi, e)
    busy += hi - lo
    return round(busy / (t1 - t0), 4) if t1 > t0 else None


def probe_job_s(base_url: str, w: Workload, n: int, *, api_key: str = "") -> list[float]:
    """`n` jobs of the run's shape, one after the other (own documents): each one's client send -> done, s."""
    out = []
    for i in range(n):
        pw = replace(w, docs=1, questions=1, arrival="t0", seed=w.seed + PROBE_SEED_OFFSET + i)
        rep = run_serve_bench(base_url, pw, api_key=api_key, label="probe")
        row = rep["jobs"][0]
        if row.get("error") or row.get("end_s") is None:
            raise RuntimeError(f"probe job failed: {row.get('error')}")
        out.append(round(row["end_s"] - row["sent_s"], 3))
    return out


def run(base_url: str, w: Workload, *, shadow_rate: float, arrival_rate: float | None, utilization: float = 0.7,
        probe: int = 3, api_key: str = "", scrape_s: float = 0.5, settle_s: float = 5.0, label: str = "") -> dict[str, Any]:
    """One run (module doc): probe (always, so both runs start from the same state), then the Poisson run
    at `arrival_rate` (None: utilization / the probe's median). The report's `run` is bench serve's report."""
    probe_s = probe_job_s(base_url, w, probe, api_key=api_key) if probe else []
    if arrival_rate is None:
        if not probe_s:
            raise ValueError("no arrival rate given and no probe jobs to derive one from")
        arrival_rate = round(utilization / statistics.median(probe_s), 3)
    w = replace(w, arrival=f"poisson:{arrival_rate}")
    time.sleep(settle_s)  # a check the probe's jobs left pending runs now, before the window
    with Scraper(base_url, api_key, scrape_s) as sc:
        before = sc.at(time.time())
        rep = run_serve_bench(base_url, w, api_key=api_key, label=label or f"shadow rate {shadow_rate:g}")
        jobs = rep["jobs"]
        # the window ends with the last job's finished_at (the service's stamp, the same host's clock)
        ends = [_epoch(j.get("finished_at")) for j in jobs]
        t_end = max((e for e in ends if e), default=time.time())
        time.sleep(settle_s)
        settled = scrape(base_url, api_key)
    inside = delta(before, sc.at(t_end))
    s = rep["summary"]
    ttft = [j["ttft_ms"] for j in jobs if j.get("ttft_ms") is not None and not j.get("error")]
    return {
        "shadow_rate": shadow_rate, "arrival_rate": arrival_rate, "utilization_target": utilization,
        "probe_job_s": probe_s,
        "jobs": s["jobs"], "succeeded": s["succeeded"], "makespan_s": s["makespan_s"], "jobs_per_min": s["jobs_per_min"],
        "client_ttft_ms_p50": percentile(ttft, 0.5), "client_ttft_ms_p90": percentile(ttft, 0.9),
        "busy_fraction": busy_fraction(jobs), "modes": s.get("modes"),
        "shadow_window": inside, "shadow_settled": delta(before, settled),
        "shadow_seconds_share_of_makespan": round(inside["seconds"] / s["makespan_s"], 4) if s["makespan_s"] else None,
        "run": rep,
    }


def ratio(a: Any, b: Any) -> float | None:
    return round(b / a, 4) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None


def compare(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """With / without shadows: jobs/min and client TTFT p50/p90 ratios (with / without)."""
    return {k: ratio(off.get(k), on.get(k)) for k in ("jobs_per_min", "client_ttft_ms_p50", "client_ttft_ms_p90")}


__all__ = ["COUNTERS", "Scraper", "scrape", "delta", "busy_fraction", "probe_job_s", "run", "compare", "ratio"]
