"""The reconciler: jobs left `running` by a worker that stopped heartbeating are run again, or failed.

Why it exists: a worker killed mid-job (SIGKILL, the OOM killer, a lost host) leaves its job `running`
in the store. Redis would hand the job's unacknowledged message out again only after the visibility
timeout (above the job time limit, an hour by default), and the embedded broker never does: kombu's
SQLAlchemy transport marks a message delivered when a worker takes it. The store knows better: a
running job's heartbeat stops when its worker dies.

One sweep (`reconcile_once`) also expires batches whose completion window ended; and every `running`
job whose heartbeat is older than SPECQ_STALE_AFTER is

* **cancelled** if a cancel was requested (its worker died before honouring it);
* **requeued** if it has attempts left: back to `queued` (its `error` says which worker stopped and
  when) and its id sent to the broker again; the next claim counts the next attempt;
* **failed** otherwise: `failed after N attempts: worker W stopped heartbeating during P (last heartbeat T)`.

Each of these is a conditional UPDATE (`specq.storage.stale`), the claim that makes several reconcilers
safe: only the one whose UPDATE changes the row publishes. A message that cannot be sent (broker down)
is undone in the store, so the next sweep tries again; a stray duplicate message (Redis redelivering
the dead worker's message later) finds the job claimed or finished and does nothing.

A database outage is not a dead worker: while the store is unreachable no worker can heartbeat, so
when it comes back every running job looks stale. A reconciler thread whose sweep failed therefore
holds back the stale-job transitions for SPECQ_STALE_AFTER seconds after its first sweep that reaches
the store again ("outage grace"): a live worker heartbeats or saves its result in that time, a dead
one is still found, stale_after later. (A reconciler that swept on neither side of a short outage
does not know of it; SPECQ_RECONCILE_INTERVAL well below SPECQ_STALE_AFTER makes that rare.)

Where it runs: in every worker process, a daemon thread sweeping every SPECQ_RECONCILE_INTERVAL seconds
(so `specq up` and Compose need no extra service), and once with `specq reconcile`. Jobs are re-sent to
the queue each job was first sent to (`jobs.queue`; SPECQ_QUEUE of the process that reconciles for
rows from before queues were recorded).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field

from .settings import ServiceSettings
from .storage import db, stale

log = logging.getLogger("specq.reconciler")


@dataclass
class Sweep:
    """What one sweep did (job ids)."""

    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    #: requeued in the store, but the broker refused the message: undone, tried again next sweep
    unsent: list[str] = field(default_factory=list)
    #: queued jobs whose message was sent again (`republish_queued`)
    republished: list[str] = field(default_factory=list)
    #: batches whose completion window ended (storage.batches.expire_due)
    expired: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.requeued or self.failed or self.cancelled or self.unsent or self.republished or self.expired)

    def summary(self) -> str:
        return ", ".join(f"{len(ids)} {name}" for name, ids in vars(self).items() if ids) or "nothing to do"


def _why(job: stale.StaleJob) -> str:
    when = job.heartbeat_at.isoformat(timespec="seconds").replace("+00:00", "Z") if job.heartbeat_at else "never"
    during = f" during {job.phase}" if job.phase else ""
    return f"worker {job.worker or '?'} stopped heartbeating{during} (last heartbeat {when})"


def reconcile_once(settings: ServiceSettings, *, limit: int = 200, act_on_stale: bool = True) -> Sweep:
    """One sweep over the stale running jobs (see the module doc). Raises if the store is unreachable.
    `act_on_stale=False` (outage grace) only expires batches."""
    from .broker import enqueue_job

    sweep = Sweep()
    before = stale.cutoff(settings.stale_after)
    finished_batches: set[str] = set()
    with db.session() as s:
        for job in (stale.find_stale(s, before, limit=limit) if act_on_stale else []):
            why = _why(job)
            if job.cancel_requested:
                if stale.cancel_stale(s, job.id, before, f"cancelled ({why})"):
                    sweep.cancelled.append(job.id)
                    finished_batches.update([job.batch_id] if job.batch_id else [])
            elif job.attempts >= job.max_attempts:
                n = job.attempts
                if stale.fail_stale(s, job.id, before, f"failed after {n} attempt{'s' if n != 1 else ''}: {why}"):
                    sweep.failed.append(job.id)
                    finished_batches.update([job.batch_id] if job.batch_id else [])
            elif stale.requeue_stale(s, job.id, before, f"attempt {job.attempts} lost: {why}; requeued"):
                try:
                    enqueue_job(job.id, settings, queue=job.queue)
                    sweep.requeued.append(job.id)
                except Exception as e:
                    log.warning("job %s: could not re-send it (%s: %s); next sweep tries again", job.id,
                                type(e).__name__, e)
                    stale.undo_requeue(s, job)
                    sweep.unsent.append(job.id)
        _advance_batches(s, sorted(finished_batches))
        try:  # batches whose completion window ended are expired even when nobody reads them
            sweep.expired = batches_expire_due(s)
        except Exception as e:
            log.warning("expiring batches failed: %s", e)
    for name in ("requeued", "failed", "cancelled"):
        for job_id in getattr(sweep, name):
            log.warning("reconciler: job %s %s (its worker stopped heartbeating)", job_id, name)
    return sweep


def republish_queued(settings: ServiceSettings, *, older_than_s: float = 0.0) -> Sweep:
    """Send every queued job's id to the broker again (after a broker lost its messages, e.g. a Redis
    restarted without persistence). Duplicates are harmless: the first delivery claims the job, the
    others find it claimed or finished and do nothing."""
    from .broker import enqueue_job

    sweep = Sweep()
    with db.session() as s:
        for job_id in stale.queued_ids(s, stale.cutoff(older_than_s)):
            enqueue_job(job_id, settings)
            sweep.republished.append(job_id)
    return sweep


def batches_expire_due(s) -> list[str]:
    from .storage import batches

    return batches.expire_due(s)


def _advance_batches(s, batch_ids: list[str]) -> None:
    from .storage import batches

    for batch_id in batch_ids:
        try:
            batches.advance_batch(s, batch_id)
        except Exception as e:  # the API's reads advance the batch as well
            log.warning("batch %s: could not update it: %s", batch_id, e)


class ReconcilerThread(threading.Thread):
    """Runs `sweep()` every `settings.reconcile_interval` seconds (±20% so that the workers of a
    deployment do not sweep in step) until stopped."""

    def __init__(self, settings: ServiceSettings) -> None:
        super().__init__(name="specq-reconciler", daemon=True)
        self.settings = settings
        self.sweeps = 0
        self._stop_event = threading.Event()
        #: the last sweep could not finish (store or broker unreachable)
        self._failed = False
        #: monotonic time until which stale jobs are left alone (module doc, "outage grace")
        self.grace_until = 0.0

    def run(self) -> None:
        interval = self.settings.reconcile_interval
        while not self._stop_event.wait(interval * random.uniform(0.8, 1.2)):
            self.sweep()

    def sweep(self) -> Sweep | None:
        """One sweep; None when it failed (the next one tries again)."""
        # after a failed sweep, the next one that reaches the store starts the grace: it holds back too
        hold = self._failed or time.monotonic() < self.grace_until
        try:
            done = reconcile_once(self.settings, act_on_stale=not hold)
        except Exception as e:  # the store or broker is briefly unreachable: the next sweep tries again
            log.warning("reconciler sweep failed: %s: %s", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            self._failed = True
            return None
        finally:
            self.sweeps += 1
        if self._failed:
            self._failed = False
            self.grace_until = time.monotonic() + self.settings.stale_after
            log.warning("reconciler: the store is reachable again; running jobs get %.0fs (SPECQ_STALE_AFTER) to "
                        "heartbeat before any is taken as lost", self.settings.stale_after)
        return done

    def stop(self) -> None:
        self._stop_event.set()


__all__ = ["Sweep", "reconcile_once", "republish_queued", "ReconcilerThread"]
