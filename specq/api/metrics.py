"""`GET /metrics`: the service in Prometheus text format, gathered at scrape time.

Everything comes from the shared job store and broker, so any API process reports the whole
deployment (every worker, every API process):

| metric | type | labels | from |
|---|---|---|---|
| `specq_jobs` | gauge | status | jobs by status (job store) |
| `specq_batches` | gauge | status | batches by status |
| `specq_queue_depth` | gauge | queue | messages waiting in the broker, per queue (the API's and every queue a live worker consumes) |
| `specq_phase_duration_seconds` | histogram | phase | `timings_ms` of every stored result |
| `specq_queue_wait_seconds` | histogram | | submission to first claim, per job |
| `specq_prompt_tokens_total`, `specq_kept_tokens_total`, `specq_completion_tokens_total` | counter | | sums over stored results |
| `specq_kept_ratio` | gauge | | kept / prompt tokens over all results |
| `specq_jobs_stale` | gauge | | running jobs without a heartbeat for SPECQ_STALE_AFTER: their worker is gone, the reconciler requeues or fails them (docs/reliability.md) |
| `specq_workers` | gauge | queue | workers with a fresh heartbeat |
| `specq_worker_heartbeat_timestamp_seconds` | gauge | worker, queue | each live worker's last heartbeat (unix time) |
| `specq_worker_busy` | gauge | worker, queue | jobs it is running (1 while a one-slot worker runs one) |
| `specq_worker_slots` | gauge | worker, queue | jobs it can run at once (SPECQ_SLOTS) |
| `specq_worker_kv_cells_used` | gauge | worker, queue | target KV cells its running jobs hold |
| `specq_worker_interleave_wait_seconds` | counter | worker, queue | its jobs' phase time spent while the engine ran other jobs' work |
| `specq_worker_slot_wait_seconds` | counter | worker, queue | its jobs' time waiting for a free slot (apart from `specq_queue_wait_seconds`) |
| `specq_worker_jobs_done` | gauge | worker, queue | jobs finished by that worker process |
| `specq_shadow_agreement` | gauge | key, target, speculator | shadow checks' agreement with baseline (agreed / answered; engine/policy/shadow.py) per evidence key (sha256 of its fields, 12 digits), and over all keys (`key="all"`) |
| `specq_shadow_jobs_total`, `specq_shadow_cancelled_total` | counter | | shadow checks started, and those cancelled because real work arrived (SPECQ_SHADOW_RATE) |
| `specq_shadow_seconds_total` | counter | | the shadow checks' baseline wall time, summed as each check is stored (a cancelled one to its cut): the engine time the checks took |
| `specq_scrape_errors` | gauge | source | 1 when the database or the broker could not be read |

The numbers are aggregates (no documents, answers or ids) but span every tenant, so with
SPECQ_AUTH=keys only admin keys may read them (the app mounts this router behind `admin_only`).
"""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter
from fastapi.responses import Response

from ..settings import ServiceSettings
from .errors import responses
from .health import worker_view

log = logging.getLogger("specq.api")

#: histogram bounds of phase durations and queue waits, seconds
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class _Collector:
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        from .. import monitor
        from ..storage import db
        from ..storage import metrics as m
        from ..storage import shadow, stale
        from ..storage.models import BATCH_STATUSES, JOB_STATUSES, Batch, Job

        errors = GaugeMetricFamily("specq_scrape_errors", "1 when a source could not be read for this scrape",
                                   labels=["source"])
        bounds_ms = [b * 1000.0 for b in BUCKETS_S]
        db_ok = True
        try:
            with db.session() as s:
                by_job = m.count_by_status(s, Job)
                by_batch = m.count_by_status(s, Batch)
                tokens = m.token_sums(s)
                phases = m.phase_histograms(s, bounds_ms)
                wait = m.queue_wait_histogram(s, bounds_ms)
                n_stale = stale.count_stale(s, stale.cutoff(self.settings.stale_after))
                checks = shadow.by_key(s)
        except Exception as e:
            log.warning("/metrics: database: %s", e)
            db_ok = False
        errors.add_metric(["database"], 0 if db_ok else 1)
        if db_ok:
            g = GaugeMetricFamily("specq_jobs", "Jobs by status", labels=["status"])
            for status in JOB_STATUSES:
                g.add_metric([status], by_job.get(status, 0))
            yield g
            g = GaugeMetricFamily("specq_jobs_stale", "Running jobs without a heartbeat for SPECQ_STALE_AFTER "
                                  "(their worker is gone; the reconciler requeues or fails them)")
            g.add_metric([], n_stale)
            yield g
            g = GaugeMetricFamily("specq_batches", "Batches by status", labels=["status"])
            for status in BATCH_STATUSES:
                g.add_metric([status], by_batch.get(status, 0))
            yield g
            h = HistogramMetricFamily("specq_phase_duration_seconds", "Duration of each phase of finished jobs "
                                      "(timings_ms of the stored results)", labels=["phase"])
            for phase, hist in sorted(phases.items()):
                h.add_metric([phase], _buckets(hist), hist["sum"] / 1000.0)
            yield h
            h = HistogramMetricFamily("specq_queue_wait_seconds", "Submission to first claim by a worker")
            h.add_metric([], _buckets(wait), wait["sum"] / 1000.0)
            yield h
            for key, help_ in (("prompt_tokens", "Prompt tokens of finished jobs"),
                               ("kept_tokens", "Prompt tokens the target prefilled (kept by SpecPrefill)"),
                               ("completion_tokens", "Generated tokens of finished jobs")):
                c = CounterMetricFamily(f"specq_{key}", help_)
                c.add_metric([], tokens[key])
                yield c
            g = GaugeMetricFamily("specq_kept_ratio", "Kept / prompt tokens over all finished jobs")
            g.add_metric([], tokens["kept_tokens"] / tokens["prompt_tokens"] if tokens["prompt_tokens"] else 0.0)
            yield g
            yield from _shadow_metrics(checks)

        broker_ok = True
        try:
            beats = monitor.read_heartbeats(self.settings)
            queues = sorted({self.settings.queue} | {str(b.get("queue")) for b in beats if b.get("queue")})
            depth = {q: monitor.queue_depth(self.settings, q) for q in queues}
        except Exception as e:
            log.warning("/metrics: broker: %s", e)
            broker_ok = False
        errors.add_metric(["broker"], 0 if broker_ok else 1)
        if broker_ok:
            g = GaugeMetricFamily("specq_queue_depth", "Messages waiting in the broker", labels=["queue"])
            for q, n in depth.items():
                g.add_metric([q], n)
            yield g
            g = GaugeMetricFamily("specq_workers", "Workers with a fresh heartbeat", labels=["queue"])
            for q in queues:
                g.add_metric([q], sum(1 for b in beats if b.get("queue") == q))
            yield g
            ts = GaugeMetricFamily("specq_worker_heartbeat_timestamp_seconds", "Last heartbeat of each live worker "
                                   "(unix time)", labels=["worker", "queue"])
            busy = GaugeMetricFamily("specq_worker_busy", "1 while the worker runs a job", labels=["worker", "queue"])
            done = GaugeMetricFamily("specq_worker_jobs_done", "Jobs finished by the worker process",
                                     labels=["worker", "queue"])
            slots = GaugeMetricFamily("specq_worker_slots", "Jobs the worker can run at once (serving slots)",
                                      labels=["worker", "queue"])
            cells = GaugeMetricFamily("specq_worker_kv_cells_used", "Target KV cells its running jobs hold",
                                      labels=["worker", "queue"])
            inter = CounterMetricFamily("specq_worker_interleave_wait_seconds", "Time its finished jobs' phases "
                                        "waited while the engine ran other jobs' work", labels=["worker", "queue"])
            swait = CounterMetricFamily("specq_worker_slot_wait_seconds", "Time its jobs waited for a free slot "
                                        "(after the broker's queue wait)", labels=["worker", "queue"])
            shits = CounterMetricFamily("specq_worker_slot_prefix_hits", "Full prefills that began after the "
                                        "prompt prefix still in their serving slot (no restore from host memory)",
                                        labels=["worker", "queue"])
            scopies = CounterMetricFamily("specq_worker_slot_copy_hits", "Full prefills that began after a "
                                          "prompt prefix copied on the device from another serving slot",
                                          labels=["worker", "queue"])
            now = time.time()
            for b in beats:  # records of workers of any version: read through worker_view, defensively
                w = worker_view(b, now, admin=False)
                labels = [w["name"], str(w["queue"])]
                ts.add_metric(labels, now - w["heartbeat_age_s"])
                busy.add_metric(labels, w["busy"])
                done.add_metric(labels, w["jobs_done"])
                slots.add_metric(labels, w["slots"])
                cells.add_metric(labels, _num(b.get("kv_cells_used")))
                inter.add_metric(labels, _num(b.get("interleave_wait_ms_total")) / 1000.0)
                swait.add_metric(labels, _num(b.get("slot_wait_ms_total")) / 1000.0)
                shits.add_metric(labels, _num(b.get("slot_prefix_hits")))
                scopies.add_metric(labels, _num(b.get("slot_copy_hits")))
            yield ts
            yield busy
            yield done
            yield slots
            yield cells
            yield inter
            yield swait
            yield shits
            yield scopies
        yield errors


def _shadow_metrics(checks: list[dict]):
    """specq_shadow_*: from storage.shadow.by_key (a key with no answered check has no agreement)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    g = GaugeMetricFamily("specq_shadow_agreement", "Shadow checks whose baseline answer equals the specprefill "
                          "answer, over answered checks, per evidence key and over all (key=all)",
                          labels=["key", "target", "speculator"])
    agreed = answered = started = cancelled = 0
    seconds = 0.0
    for c in checks:
        n = c["agree"] + c["disagree"]
        key = c.get("key") or {}
        if n:
            g.add_metric([c["key_id"][:12], str(key.get("target", "")), str(key.get("speculator", ""))], c["agree"] / n)
        agreed += c["agree"]
        answered += n
        started += n + c["cancelled"]
        cancelled += c["cancelled"]
        seconds += float(c.get("ms", 0.0)) / 1000.0
    if answered:
        g.add_metric(["all", "", ""], agreed / answered)
    yield g
    c = CounterMetricFamily("specq_shadow_jobs", "Shadow checks started (SPECQ_SHADOW_RATE)")
    c.add_metric([], started)
    yield c
    c = CounterMetricFamily("specq_shadow_cancelled", "Shadow checks cancelled because the worker claimed real work")
    c.add_metric([], cancelled)
    yield c
    c = CounterMetricFamily("specq_shadow_seconds", "Shadow checks' baseline wall time (a cancelled one to its cut), "
                            "summed as each check is stored")
    c.add_metric([], seconds)
    yield c


def _num(value) -> float:
    """A heartbeat's number, 0 when missing or not a finite number (records of older workers)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return 0.0
    return x if x == x and abs(x) != float("inf") else 0.0


def _buckets(hist: dict) -> list[tuple[str, float]]:
    out = [(_fmt(b), float(c)) for b, c in zip(BUCKETS_S, hist["buckets"])]
    out.append(("+Inf", float(hist["count"])))
    return out


def _fmt(b: float) -> str:
    return repr(float(b))


def metrics_router(settings: ServiceSettings) -> APIRouter:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(settings))
    router = APIRouter()

    @router.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response, operation_id="metrics",
                responses={200: {"content": {"text/plain": {"schema": {"type": "string", "description":
                                 "Prometheus text exposition format"}}}, "description": "the metrics"},
                           **responses(401, 403)})
    def metrics() -> Response:
        return Response(content=generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router


__all__ = ["metrics_router", "BUCKETS_S"]
