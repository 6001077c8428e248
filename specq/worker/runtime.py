"""One worker process's Engine, and running one job with it.

A job's life in the worker (`WorkerRuntime.execute`):

1. Claim a job (`claims.claim_next`): the message's job when it is a redelivery of a job whose worker
   died or this worker's own interrupted job; otherwise the queue's next job in claim order
   (interactive before batch, fair between tenants), which may be another one than the message names.
   When no job is runnable the message does nothing, so a redelivered message is harmless.
2. Run the engine; the answer's text is published as it is decoded (`stream.DeltaPublisher`) for
   event streams and the OpenAI routes' `stream=true`. A watcher thread writes progress and a heartbeat every `progress_interval`
   seconds (and at each phase change) and polls the store for a cancel request. The job runs under a
   `Stop` (engine/llama/stop.py) with the deadline `time_limit` from its start: a cancel request seen by the
   watcher trips it, which ends even a running llama_decode (within a graph node on the CPU; between
   bounded calls elsewhere), and the deadline is read in C the same way. The engine then raises
   `RunCancelled` or `JobTimeLimit` (as does the progress callback, between phases and tokens).
3. Finish: the result and its phase timings in one transaction (`results.save_result`, idempotent);
   or `failed` with the engine's one-line message for bad input (InputError, never retried), the time
   limit, model errors and errors a retry cannot cure (`failure_kind`: a ValueError, an OverflowError,
   …); an out-of-memory is retried once, then failed with a message; anything else (transient: a
   decode failure, a lost database connection, …) goes back to `queued` with a backoff until
   `max_attempts`, then `failed`. These writes are
   repeated through a database restart for up to `store_retry_for` seconds (`storage.retry`), so a
   computed result is not dropped.

With serving slots (SPECQ_SLOTS > 1, Celery's threads pool) several deliveries run this at once in
one process: each task thread claims its job, then submits it to the one engine loop
(`specq.engine.serving.loop.ServingEngine`) and waits on its handle, forwarding a cancel request or the
time limit to it; every per-job store write (progress, heartbeat, result, failure) stays in the
job's own thread, through the same storage functions. A message naming a job live in this process
never claims it again (`claims.claim_next(live=...)`). SIGTERM drains (`drain`): no job takes a
slot any more, waiting ones go back to the queue at once, running ones get SPECQ_DRAIN_GRACE seconds
to finish, then go back too.

With one slot (no engine loop) a second delivery in the process waits for the slot as well: on the
embedded broker Celery's solo pool runs a message with a countdown on its timer thread, beside the
task on the main thread, and two runs of one Engine at once corrupt each other (docs/reliability.md,
"The embedded broker").

**Group claims** (SPECQ_GROUP_CLAIMS, on by default; storage.groups): right after a task thread
claims a job that asks about a stored document, still under the claim lock, it claims the queued jobs
of the same tenant and document up to the slots left free and runs each in a thread of its own
(`_run_member`: the same `_run_claimed` as a delivery, with its own watcher, token and writes; a
retry or a store error re-sends the job's id to the broker, since no delivery of its own is there to
retry). It logs `group claim: job L took N more of its document: ids`. A member's own message that
arrives here while the member runs is acknowledged and does nothing (`grouped`); anywhere else, or
later, it is an ordinary ticket (claims.claim_next). Since group members run outside Celery's
threads, a delivery that finds every slot taken waits for one before it claims (it returns to the
broker if the worker drains meanwhile), so the process never runs more than SPECQ_SLOTS jobs.
With SPECQ_GROUP_HOLD > 0 a delivery that finds fewer slots free than the next job's document has
queued questions (up to the slots), while others are busy, waits up to that long for them to free
before it claims, so the questions start together as one group (`_group_wants`). Each job of a group
claim tells the engine loop how many were claimed together (`submit(group_hint=N)`): mode auto's rule
1a (engine/policy/auto.py) may run them as one group-sparse prefill before every member has reached the loop.

**Calibration units** (jobs of kind `calibration`, POST /v1/calibrations; worker/calibration.py) are claimed
like any job, at the lowest priority, and run through the same watcher, fencing and failure handling; their
three passes drive the engine directly, so with the engine loop a unit waits until the other jobs running here
have ended and no job is claimed here meanwhile (`exclusive`). Its outcome is saved with the job's result
(results.save_result's `also`); then the rows of the groups it completed are written (exactly once).

Each worker process also runs the reconciler (`specq.reconciler`) in a thread: jobs whose worker died
go back to the queue from there.

**Fencing.** The claim returns an attempt token, and every write above (progress, heartbeat, streamed
text on the embedded default, the result, failed, cancelled, requeued) is conditional on it
(storage.jobs, "Fencing"). When one is refused (`contracts.Fenced`: the reconciler requeued or failed
the job, or another worker claimed it, after this worker's heartbeats stopped reaching the store),
the watcher marks the run fenced, the engine's next progress callback raises Fenced and the run
ends; the worker then writes nothing more about the job — not even clearing its stream, which is
the new attempt's now — and the delivery ends as "fenced".
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..contracts import Drained, EngineError, Fenced, InputError, JobTimeLimit, ModelError, RunCancelled
from ..engine.options import RunParams
from ..engine.llama.stop import Stop
from ..settings import ServiceSettings
from ..storage import calibrations, claims, db, groups, jobs, results
from ..storage.retry import retry_transient
from . import calibration
from .evidence import EvidenceWatch
from .shadow import ShadowRunner
from .stream import DeltaPublisher

log = logging.getLogger("specq.worker")


@dataclass
class Outcome:
    """What happened to one delivery of a job."""

    status: str  # succeeded | failed | cancelled | retry | skipped | fenced
    message: str = ""
    retry_in: float = 0.0
    #: the job this delivery ran (claims may pick another than the message names)
    job_id: str = ""


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _Watcher(threading.Thread):
    """Writes progress + heartbeat and polls for cancel requests while a job runs."""

    def __init__(self, job_id: str, token: str, interval: float, deadline: float, time_limit: float) -> None:
        super().__init__(name=f"specq-watch-{job_id}", daemon=True)
        self.job_id = job_id
        self.token = token
        #: the first refused write (contracts.Fenced): the run must end, and nothing more be written
        self.fenced: Fenced | None = None
        self.interval = interval
        self.deadline = deadline
        self.time_limit = time_limit
        self.latest: tuple[str, int, int] | None = None
        self.cancelled = threading.Event()
        #: the job's Stop, handed to Engine.run: tripped here once a cancel request is seen
        self.run_stop = Stop(cancelled=self.cancelled.is_set, deadline=deadline, limit_message=self._limit_message())
        self._stop_event = threading.Event()
        self._wake = threading.Event()

    def _limit_message(self) -> str:
        return f"job exceeded the time limit of {self.time_limit:g}s (SPECQ_TIME_LIMIT)"

    # called by the engine, in the job's thread, between phases, per window and per token
    def progress(self, phase: str, done: int, total: int) -> None:
        if self.fenced is not None:
            raise self.fenced
        if self.cancelled.is_set():
            raise RunCancelled("cancelled")
        if time.monotonic() > self.deadline:
            raise JobTimeLimit(self._limit_message())
        prev = self.latest
        self.latest = (phase, int(done), int(total))
        if prev is None or prev[0] != phase:
            self._wake.set()

    def run(self) -> None:
        written = None
        failures = 0
        with db.session() as s:
            while not self._stop_event.is_set():
                self._wake.wait(self.interval)
                self._wake.clear()
                if self._stop_event.is_set():
                    break
                try:
                    cur = self.latest
                    if cur is not None and cur != written:
                        jobs.update_progress(s, self.job_id, *cur, token=self.token)
                        written = cur
                    else:
                        jobs.heartbeat(s, self.job_id, token=self.token)
                    if jobs.is_cancel_requested(s, self.job_id):
                        self.cancelled.set()
                        self.run_stop.cancel("cancelled")  # cuts a running llama_decode
                    if failures:
                        log.warning("job %s: progress writes work again after %d failed", self.job_id, failures)
                        failures = 0
                except Fenced as e:  # the claim was taken over: stop the run, write nothing more
                    self.fence(e)
                    break
                except Exception as e:  # the store is briefly unreachable: keep running, try again
                    failures += 1
                    if failures == 1:  # once per outage, not every interval
                        log.warning("job %s: progress write failed (retrying every %gs): %s", self.job_id,
                                    self.interval, str(e).splitlines()[0] if str(e) else type(e).__name__)
                    try:
                        s.rollback()  # a dropped connection leaves the session needing one
                    except Exception:
                        pass

    def fence(self, e: Fenced) -> None:
        """A write about the job was refused (here or by the stream publisher): end the run."""
        if self.fenced is None:
            self.fenced = e
            log.warning("job %s: %s; stopping the run", self.job_id, e)
            self.run_stop.cancel("fenced", e)  # cuts a running llama_decode too; the run ends with e

    def stop(self) -> None:
        self._stop_event.set()
        self._wake.set()
        self.join(timeout=10)


class WorkerRuntime:
    """The models of one worker process and the job loop body."""

    def __init__(self, settings: ServiceSettings | None = None, engine: Any = None, seams: Any = None, *,
                 select_override: Callable | None = None) -> None:
        """`seams`: the engine loop's test seams (engine/serving/seams.py), from a test's launcher only."""
        self.settings = settings or ServiceSettings.from_env()
        self.engine = engine
        self.seams = seams
        #: handed to the Engine load() builds: a benchmark's selection emulation (`specq bench worker`), else None
        self.select_override = select_override
        self.name = worker_name()
        self.jobs_done = 0
        #: the queue this worker consumes (`specq worker --queue`), reported in its heartbeat
        self.queue = self.settings.queue
        self.current_job: str | None = None
        #: jobs claimed and running in this process now (its serving slots), guarded by _claim_lock
        self.live: set[str] = set()
        self._claim_lock = threading.Lock()
        #: notified whenever a job leaves `live` (a delivery waits on it for a free slot)
        self._slot_free = threading.Condition(self._claim_lock)
        #: jobs in `live` that a group claim took (storage.groups) whose own message has not arrived here
        self.grouped: set[str] = set()
        #: the store's evidence revision the engine's rows were loaded at (worker/evidence.py)
        self.evidence = EvidenceWatch()
        #: shadow checks of mode auto's specprefill answers in idle time (SPECQ_SHADOW_RATE; worker/shadow.py)
        self.shadow = ShadowRunner(self.settings.shadow_rate)
        if engine is not None:
            self.shadow.bind(engine, None)
        #: jobs taken by group claims since the worker started (its heartbeat reports it)
        self.group_claimed = 0
        #: job -> the size of the group claim it was part of (leader included), until its run submits it
        #: to the engine loop (mode auto's rule 1a counts the group before every member has reached the loop)
        self.claimed_with: dict[str, int] = {}
        #: a calibration unit holds the engine alone (worker/calibration.py): no job is claimed here meanwhile
        self.exclusive = False
        #: calibration units live in this process (they wait for the engine one at a time: `_unit_lock`)
        self.units_live: set[str] = set()
        self._unit_lock = threading.Lock()
        #: jobs this process runs at once (load(): SPECQ_SLOTS; 1 without the engine loop)
        self.slots = 1
        #: the engine loop (built by load(); None when a test hands in an engine: it then runs in the
        #: task's thread)
        self.serving = None
        #: SIGTERM was received (drain): no group claims, and no delivery waits for a slot any more
        self.draining = False
        self.ready = False
        self.warm_up_s: float | None = None
        self.heartbeat = None
        self.reconciler = None
        #: exits the process when the engine is stuck past a job's deadline (watchdog.py; started by load())
        self.watchdog = None
        #: the engine's progress calls with one slot (no engine loop, whose step counter the watchdog reads)
        self.engine_steps = 0
        self._channel = None

    @property
    def channel(self):
        """Where running jobs' text is published (Redis pub/sub or the store: worker.stream)."""
        if self._channel is None:
            from .stream import make_channel

            self._channel = make_channel(self.settings)
        return self._channel

    def load(self) -> None:
        """Load the models (and warm them up); call after CUDA_VISIBLE_DEVICES is set and after any fork."""
        if self.engine is not None:
            return
        from ..engine.llama.binding import backend_name
        from ..engine.pipeline import Engine
        from ..engine.serving.loop import ServingEngine
        from .model_wait import wait_for_models

        t0 = time.perf_counter()
        slots = self.settings.resolved_slots(backend_name())
        opts = self.settings.engine_options(slots)
        # a missing model file: a not-ready heartbeat says which (and, with SPECQ_PULL_MODELS off, this waits)
        not_ready = wait_for_models(self.settings, {"target": opts.target, "speculator": opts.speculator}, self.queue)
        self.engine = Engine(opts, select_override=self.select_override)
        with db.session() as s:  # mode auto's evidence: shipped + the store's (worker/evidence.py)
            self.evidence.refresh(s, self.engine)
        # one slot: the single-job pipeline in the task's thread (its Stop cuts a running llama_decode,
        # and the target's prompt cache serves mode auto); several: the engine loop of serving.py
        if slots > 1:
            self.serving = ServingEngine(self.engine, prefill_chunk=self.settings.prefill_chunk,
                                         score_thread=self.settings.score_thread,
                                         group_sparse=self.settings.group_sparse, seams=self.seams).start()
            self.slots = slots
        self.shadow.bind(self.engine, self.serving)
        if self.settings.warm_up:
            t1 = time.perf_counter()
            doc, params = self.engine.warm_up_job()
            res = (self.serving or self.engine).run(doc, params)
            self.warm_up_s = time.perf_counter() - t1
            log.warning("specq worker warm-up: a specprefill job of %d tokens in %d windows (n_ubatch %d) took %.2fs",
                        res.usage.prompt_tokens, res.spec.windows, self.engine.n_ubatch, self.warm_up_s)
        self.name = worker_name()
        info = self.engine.info
        groups_on = "" if slots == 1 else (f", group claims {'on' if self.settings.group_claims else 'off'}, "
                                           f"group-sparse prefill {'on' if self.serving.group_sparse else 'off'}, scoring on "
                                           + ("its own thread" if self.serving.scoring is not None else "the engine thread"))
        log.warning(
            "specq worker %s ready: target %s, speculator %s%s, backend %s, n_gpu_layers %s, n_ctx %s, %d slot%s%s (%.1fs)",
            self.name, info.target, info.speculator or "(on first use)",
            f" run by {'its PyTorch forward' if info.speculator_impl == 'torch' else 'llama.cpp'}"
            + (f" ({self.engine.speculator_impl_reason})" if self.engine.speculator_impl_reason else "")
            if info.speculator_impl else "", info.backend, info.n_gpu_layers,
            self.engine.n_ctx, slots, "" if slots == 1 else "s", groups_on, time.perf_counter() - t0,
        )
        self.ready = True
        if not_ready is not None:
            not_ready.stop()
        self._start_watchdog()
        self._start_heartbeat(info)
        self._start_reconciler()

    def _start_watchdog(self) -> None:
        """The engine's own progress, watched (watchdog.py); SPECQ_WATCHDOG_GRACE < 0 = none."""
        if self.settings.watchdog_grace < 0 or self.watchdog is not None:
            return
        from .watchdog import Watchdog

        serving = self.serving
        steps = (lambda: serving.steps) if serving is not None else (lambda: self.engine_steps)
        self.watchdog = Watchdog(steps, self.settings.watchdog_grace)
        self.watchdog.start()

    def _start_heartbeat(self, info) -> None:
        """Write this process's heartbeat (specq.monitor) every few seconds, for /metrics."""
        import atexit

        from ..monitor import Heartbeat

        started = time.time()
        meta = {"host": socket.gethostname(), "pid": os.getpid(), "gpu": self.settings.gpu,
                "target": str(info.target), "backend": str(info.backend), "started_at": started,
                "speculator": str(info.speculator or self.settings.speculator or ""),
                "n_ctx": int(getattr(self.engine, "n_ctx", 0) or 0)}

        def state() -> dict[str, Any]:
            live = sorted(self.live)
            extra = self.serving.stats() if self.serving is not None else {"slots": 1}
            wd = self.watchdog
            extra["engine_steps"] = wd.steps() if wd is not None else None
            extra["engine_stalled_s"] = wd.stalled_s() if wd is not None else None
            return {"name": self.name, "queue": self.queue, "jobs_done": self.jobs_done,
                    "current_job": live[0] if live else None, "current_jobs": live, "busy": len(live),
                    "group_claimed": self.group_claimed,
                    "ready": self.ready, "warm_up_s": self.warm_up_s, **extra, **meta}

        self.heartbeat = Heartbeat(self.settings, state)
        self.heartbeat.start()
        atexit.register(self.heartbeat.stop)

    def _start_reconciler(self) -> None:
        """Sweep for jobs of dead workers every `reconcile_interval` seconds (0 = not here)."""
        if self.settings.reconcile_interval <= 0 or self.reconciler is not None:
            return
        from ..reconciler import ReconcilerThread

        self.reconciler = ReconcilerThread(self.settings)
        self.reconciler.start()

    def execute(self, job_id: str) -> Outcome:
        """Run one delivery of job `job_id` to the end. Job errors end in the store; only the store's
        own errors (e.g. the database is unreachable) escape, and the task re-sends the job.
        A job of a batch then moves its batch on (counts; completed or cancelled once all are done)."""
        outcome = self._execute(job_id)
        if outcome.status != "retry" and outcome.job_id:
            self._advance_batch(outcome.job_id)
        return outcome

    def _advance_batch(self, job_id: str) -> None:
        from ..storage import batches

        try:
            with db.session() as s:
                job = jobs.get_job(s, job_id)
                if job is not None and job.batch_id:
                    batch = batches.advance_batch(s, job.batch_id)
                    if batch is not None and batch.status in ("completed", "cancelled"):
                        log.info("batch %s: %s (%d/%d completed, %d failed)", batch.id, batch.status,
                                 batch.request_completed, batch.request_total, batch.request_failed)
        except Exception as e:  # the job itself is saved; the API's reads advance the batch as well
            log.warning("job %s: could not update its batch: %s", job_id, e)

    def _execute(self, job_id: str) -> Outcome:
        if self.engine is None:
            self.load()
        s_ = self.settings
        with db.session() as s:
            self.evidence.refresh(s, self.engine)  # rows written since the last claim count from this job on
            s.commit()  # end the refresh's read: no snapshot held while this delivery waits for a slot
            with self._claim_lock:  # one claim at a time: two messages of one job never both claim it
                hold_until: float | None = None
                waited = False
                while True:
                    if job_id in self.grouped:  # a group claim took this message's job: it runs here now
                        self.grouped.discard(job_id)
                        log.info("job %s: its message arrived while it runs here (group claim); nothing to do",
                                 job_id)
                        return Outcome("skipped", "group-claimed")
                    if len(self.live) < self.slots and not self.exclusive:  # one slot without the engine loop (see below)
                        free = self.slots - len(self.live)
                        want = self._group_wants(s, job_id, free)  # 0 without serving slots or a hold
                        if want <= free:
                            break
                        # a group hold (SPECQ_GROUP_HOLD): more of the next job's document's questions
                        # are queued than slots are free, and busy slots will free
                        now = time.monotonic()
                        if hold_until is None:
                            hold_until = now + self.settings.group_hold
                            log.info("message of job %s: holding the claim up to %.1fs until %d slots are free "
                                     "(%d now) for the next job's document's queued questions", job_id,
                                     self.settings.group_hold, want, free)
                        if now >= hold_until:
                            break
                        self._slot_free.wait(min(0.5, hold_until - now))
                        continue
                    # group claims can fill every slot: wait for one rather than claim a job that
                    # would wait in the loop (another worker's free slot may take it meanwhile).
                    # One slot (no engine loop) waits too: on the embedded broker Celery's solo pool
                    # runs a countdown's message (a retry, a store error's re-send) on its timer
                    # thread, beside the task running on the main thread, and two runs of the one
                    # Engine at once corrupt each other (llama_decode -1, a hang; docs/reliability.md)
                    if self.draining:
                        return Outcome("retry", "the worker is shutting down", retry_in=0.0, job_id=job_id)
                    if not waited:
                        waited = True
                        log.info("message of job %s: waiting for a free slot (running here: %s)", job_id,
                                 ",".join(sorted(self.live)))
                    self._slot_free.wait(0.5)
                claim = claims.claim_next(s, job_id, self.name, queue=self.queue, stale_after_s=s_.stale_after,
                                          live=self.live)
                group: list[claims.Claim] = []
                if claim is not None:
                    self.live.add(claim.job_id)
                    self.current_job = claim.job_id
                    group = self._claim_group(s, claim.job_id)
            if claim is not None and self.shadow.preempt():  # real work: a shadow check gives way at once
                log.info("job %s: claimed; the running shadow check was cancelled", claim.job_id)
            self._start_group(claim.job_id if claim else "", group)
            if claim is None:
                job = jobs.get_job(s, job_id)
                state = job.status if job is not None else "missing"
                log.info("job %s: not runnable (%s) and no other job queued, skipped", job_id, state)
                return Outcome("skipped", state)
            if claim.job_id != job_id:
                log.info("message of job %s: ran job %s (claim order)", job_id, claim.job_id)
            try:
                outcome = self._run_claimed(s, claim.job_id, claim.token)
            except Exception as e:  # a store error: the task re-sends the job that ran, not the message's
                e.specq_job_id = claim.job_id  # type: ignore[attr-defined]
                raise
            finally:
                self._release(claim.job_id)
            outcome.job_id = claim.job_id
            return outcome

    def _group_wants(self, s, job_id: str, free: int) -> int:
        """Under _claim_lock, with `free` slots free: how many slots the group the next claim would
        take asks for (the job claims.pick_next picks and its document's queued questions, up to the
        slots), when that is worth holding the claim for (SPECQ_GROUP_HOLD > 0, group claims on, some
        slots busy: they will free); else 0 (claim now)."""
        if (self.serving is None or not self.settings.group_claims or self.settings.group_hold <= 0
                or self.draining or free >= self.slots):
            return 0
        try:
            pick = claims.pick_next(s, self.queue, job_id)
            if pick is None:
                return 0
            mates = groups.group_candidates(s, pick, queue=self.queue, limit=self.slots - 1)
        except Exception as e:  # the store failed: claim now; the claim itself handles the store's errors
            log.warning("job %s: could not look at the queue for a group hold (%s: %s)", job_id, type(e).__name__, e)
            try:
                s.rollback()
            except Exception:
                pass
            return 0
        return min(1 + len(mates), self.slots)

    def _release(self, job_id: str) -> None:
        """The job's run in this process ended: its slot is free."""
        with self._claim_lock:
            self.live.discard(job_id)
            self.grouped.discard(job_id)
            self.claimed_with.pop(job_id, None)
            self.current_job = next(iter(self.live), None)
            self._slot_free.notify_all()
            idle = not self.live
        if idle:
            self.shadow.idle()

    def _claim_group(self, s, job_id: str) -> list[claims.Claim]:
        """Under _claim_lock, right after claiming `job_id`: claim the queued jobs of its tenant and
        document up to the slots left free (storage.groups); each is added to `live` and `grouped`."""
        if self.serving is None or not self.settings.group_claims or self.draining:
            return []
        free = self.slots - len(self.live)
        if free <= 0:
            return []
        got: list[claims.Claim] = []
        try:
            groups.claim_group(s, job_id, self.name, queue=self.queue, limit=free, into=got)
        except Exception as e:  # the store failed: run what was claimed; the leader's own run decides the rest
            log.warning("job %s: group claim failed after %d job(s) (%s: %s)", job_id, len(got), type(e).__name__, e)
            try:
                s.rollback()
            except Exception:
                pass
        for c in got:
            self.live.add(c.job_id)
            self.grouped.add(c.job_id)
        if got:
            for j in [job_id, *(c.job_id for c in got)]:
                self.claimed_with[j] = 1 + len(got)
        self.group_claimed += len(got)
        return got

    def _start_group(self, leader: str, group: list[claims.Claim]) -> None:
        """Run each group-claimed job in a thread of its own, as a delivered job (module doc)."""
        if not group:
            return
        log.info("group claim: job %s took %d more of its document: %s", leader, len(group),
                 ",".join(c.job_id for c in group))
        for c in group:
            # not a daemon: a stopping worker's process waits for the run to end (the drain requeues it)
            threading.Thread(target=self._run_member, args=(c,), name=f"specq-group-{c.job_id}").start()

    def _run_member(self, claim: claims.Claim) -> None:
        """One group-claimed job, from its claim to its last store write; what the task does after a
        delivery (a retry message, a store error's re-send, the batch's counts) is done here."""
        job_id = claim.job_id
        outcome: Outcome | None = None
        error: Exception | None = None
        try:
            with db.session() as s:
                outcome = self._run_claimed(s, job_id, claim.token)
        except Exception as e:  # a store error (as a task's, which re-sends the job)
            error = e
        finally:
            self._release(job_id)
        if error is not None:
            delay = self.settings.backoff(1)
            log.warning("job %s (group claim): store error (%s: %s); re-sent in %.1fs", job_id, type(error).__name__,
                        error, delay)
            self._resend(job_id, delay)
        elif outcome.status == "retry":
            self._resend(job_id, outcome.retry_in)
        else:
            log.info("job %s (group claim): %s", job_id, outcome.status)
            self._advance_batch(job_id)

    def _resend(self, job_id: str, countdown: float) -> None:
        """Send the job's id to the broker again (a group-claimed job has no delivery of its own to retry)."""
        from ..broker import enqueue_job

        try:
            enqueue_job(job_id, self.settings, queue=self.queue, countdown=countdown)
        except Exception as e:
            log.warning("job %s: could not re-send it (%s: %s); `specq reconcile --republish-queued` sends it",
                        job_id, type(e).__name__, e)

    def _run_claimed(self, s, job_id: str, token: str) -> Outcome:
        """Run the claimed attempt; a refused write (Fenced), wherever it happens, ends it as "fenced"
        with nothing more written (module doc, "Fencing")."""
        try:
            return self._run_attempt(s, job_id, token)
        except Fenced as e:
            log.warning("job %s: fenced (%s): this worker's attempt ended, nothing more is written", job_id, e)
            return Outcome("fenced", str(e))

    def _run_attempt(self, s, job_id: str, token: str) -> Outcome:
        s_ = self.settings
        job = jobs.get_job(s, job_id)
        inp = jobs.get_input(s, job_id)
        try:
            if job is None or inp is None:
                raise InputError("job input is missing")
            params = RunParams.from_dict({**(job.params or {}), "question": inp.question})
            source = engine_input(job.kind, inp)
            unit = job.kind == calibration.KIND  # a calibration's question: worker/calibration.py
        except InputError as e:
            jobs.mark_failed(s, job_id, str(e), token=token)
            return Outcome("failed", str(e))

        t0 = time.monotonic()
        watcher = _Watcher(job_id, token, s_.progress_interval, t0 + s_.time_limit, s_.time_limit)
        watcher.start()
        publisher = DeltaPublisher(self.channel, job_id, job.attempts, token=token, on_fenced=watcher.fence)
        if self.watchdog is not None:  # the engine holds the job from here until it returns
            self.watchdog.enter(job_id, watcher.deadline)
        engine_start = time.time()  # the job's trace (storage.trace)
        try:
            try:
                reuse = {"scope": job.tenant, "reused_document": inp.document_id is not None}
                if unit:
                    result = self._run_unit(s, job_id, inp.text, params, watcher)
                elif self.serving is None:
                    def progress(phase: str, done: int, total: int) -> None:
                        self.engine_steps += 1  # one slot: the engine's progress calls are its steps
                        watcher.progress(phase, done, total)

                    result = self.engine.run(inp.text, params, progress=progress, on_text=publisher.feed,
                                             stop=watcher.run_stop, **reuse, **source)
                else:
                    with self._claim_lock:
                        together = self.claimed_with.pop(job_id, 0)
                    handle = self.serving.submit(inp.text, params, watcher.progress, on_text=publisher.feed,
                                                 group_hint=together, **reuse, **source)
                    result = self._wait(handle, watcher)
            finally:
                if self.watchdog is not None:
                    self.watchdog.leave(job_id)
                publisher.finish()
        except Fenced:
            watcher.stop()
            raise
        except JobTimeLimit as e:
            watcher.stop()
            return self._fail(s, job_id, token, str(e))
        except Drained as e:
            watcher.stop()
            return self._requeue_drained(s, job, token, str(e))
        except RunCancelled as e:
            watcher.stop()
            if watcher.fenced is not None:  # the Stop tripped by the fence, not a cancel request
                raise watcher.fenced
            why = str(e) if isinstance(e, calibration.UnitSkipped) else "cancelled while running"
            self._store(s, f"job {job_id}: marking it cancelled",
                        lambda: jobs.mark_cancelled(s, job_id, why, token=token))
            log.info("job %s: cancelled (%s)", job_id, why)
            self._clear_stream(job_id)
            return Outcome("cancelled")
        except (InputError, ModelError) as e:
            watcher.stop()
            return self._fail(s, job_id, token, str(e))
        except Exception as e:  # DecodeError, a lost connection: worth another try; see failure_kind
            watcher.stop()
            kind = failure_kind(e)
            if kind == "deterministic":  # the same input fails the same way: retrying only wastes time
                return self._fail(s, job_id, token, f"internal error: {_describe(e)}")
            if kind == "oom":
                message = f"{OOM_PREFIX}: {_describe(e)}"
                if (job.error or "").startswith(OOM_PREFIX):  # the previous attempt ran out of memory too
                    return self._fail(s, job_id, token, f"{message} (twice): the job needs more memory than this "
                                                        "worker has; lower max_tokens, window or the document size, "
                                                        "or run it on a bigger worker")
                return self._retry_or_fail(s, job, token, message)
            return self._retry_or_fail(s, job, token, f"{_describe(e)}")
        watcher.stop()
        ms = (time.monotonic() - t0) * 1000.0
        stamps = {"engine_start": engine_start, "first_token": publisher.first_at, "engine_done": time.time()}
        stored = {**(result.to_dict() if hasattr(result, "to_dict") else dict(result)), "trace": stamps}
        try:
            if watcher.fenced is not None:  # refused after the engine's last progress call
                raise watcher.fenced
            also = calibrations.store_record(job_id, stored["calibration"]) if unit else None
            saved = self._store(s, f"job {job_id}: saving the result",
                                lambda: results.save_result(s, job_id, stored, token=token, also=also))
        except Fenced as e:  # ran to the end, but the job is another attempt's now (reliability_figures)
            log.warning("job %s: finished but not saved (%s)", job_id, e)
            raise
        except Exception as e:  # not a lost connection, or still lost after store_retry_for: nothing was kept
            return self._retry_or_fail(s, job, token, f"saving the result failed: {_describe(e)}")
        with self._claim_lock:
            self.jobs_done += 1
        self._clear_stream(job_id)
        if unit:  # the rows of the groups this unit completed (exactly once: storage/calibrations.write_groups)
            try:
                self._store(s, f"job {job_id}: writing its calibration's rows",
                            lambda: calibration.write_rows(s, self.name, job_id))
            except Exception as e:  # the unit is saved; the next unit's worker or an API read writes the rows
                log.warning("job %s: its calibration's rows were not written (%s: %s)", job_id, type(e).__name__, e)
        else:  # the engine's result object (its spec and token ids), not the stored dict
            self.shadow.offer(job_id, inp.text, params, source, result)  # runs once the process is idle (_release)
        if not saved:
            log.info("job %s: result saved before (a repeated write)", job_id)
        log.info("job %s: succeeded in %.0f ms (queue wait %.0f ms)", job_id, ms, job.queue_wait_ms or 0.0)
        self._housekeeping()
        return Outcome("succeeded")

    def _run_unit(self, s, job_id: str, text: str, params: RunParams, watcher: _Watcher) -> dict[str, Any]:
        """A calibration unit (worker/calibration.py) on the engine itself; with the engine loop, only once every
        other job running here has ended, no job being claimed here meanwhile (`exclusive`)."""
        def progress(phase: str, done: int, total: int) -> None:
            self.engine_steps += 1
            watcher.progress(phase, done, total)

        if self.serving is None:
            return calibration.run(self.engine, s, job_id, text, params, progress, watcher.run_stop)
        with self._claim_lock:
            self.units_live.add(job_id)
        try:
            with self._unit_lock:
                try:
                    with self._claim_lock:
                        self.exclusive = True
                        while any(j not in self.units_live for j in self.live) or self.serving.live():
                            watcher.progress("waiting for the engine", 0, 0)  # a cancel or the time limit ends the wait
                            self._slot_free.wait(0.2)
                    return calibration.run(self.engine, s, job_id, text, params, progress, watcher.run_stop)
                finally:
                    with self._claim_lock:
                        self.exclusive = False
                        self._slot_free.notify_all()
        finally:
            with self._claim_lock:
                self.units_live.discard(job_id)

    def _wait(self, handle, watcher: _Watcher):
        """The job's RunResult from the engine loop; a cancel request or the time limit seen by the
        watcher is handed to the loop (which drops the job at its next step, even one still waiting
        for a slot)."""
        from concurrent.futures import TimeoutError as FutureTimeout

        while True:
            try:
                return handle.result(timeout=0.2)
            except FutureTimeout:
                if watcher.fenced is not None:  # the job is another attempt's now: drop it from the loop
                    handle.cancel(watcher.fenced)
                elif watcher.cancelled.is_set():
                    handle.cancel(RunCancelled("cancelled"))
                elif time.monotonic() > watcher.deadline:
                    handle.cancel(JobTimeLimit(f"job exceeded the time limit of {watcher.time_limit:g}s (SPECQ_TIME_LIMIT)"))

    def drain(self) -> None:
        """SIGTERM (Celery's warm shutdown): no job takes a slot any more, jobs waiting for one go back
        to the queue now, running ones get drain_grace seconds, then go back too. Returns at once."""
        with self._claim_lock:  # one slot too: a delivery waiting for the slot goes back to the broker
            self.draining = True
            self._slot_free.notify_all()
        if self.serving is None:
            return
        grace = self.settings.drain_grace
        log.warning("specq worker %s: draining (%d job(s) live; %.0fs grace)", self.name, len(self.live), grace)
        self.serving.stop_admitting()
        timer = threading.Timer(grace, self.serving.drop_running)
        timer.daemon = True
        timer.start()

    def _requeue_drained(self, s, job, token: str, message: str) -> Outcome:
        """The worker stopped before this job ran to the end: back to the queue without a backoff."""
        job_id = job.id
        if self._store(s, f"job {job_id}: requeueing it",
                       lambda: jobs.requeue(s, job_id, message, token=token, delay_s=0.0)):
            log.warning("job %s: %s; requeued", job_id, message)
            self._clear_stream(job_id)
            return Outcome("retry", message, retry_in=0.0)
        return self._retry_or_fail(s, job, token, message)

    def _store(self, s, what: str, write: Callable[[], Any]) -> Any:
        """A store write after the job ran, repeated through a database restart (storage.retry)."""
        return retry_transient(s, write, what=what, give_up_after=self.settings.store_retry_for)

    def _clear_stream(self, job_id: str) -> None:
        """The job ended: its published text is no longer needed (the store holds the result)."""
        try:
            self.channel.clear(job_id)
        except Exception as e:  # best effort: rows of ended jobs are only clutter
            log.warning("job %s: could not clear its stream: %s", job_id, e)

    def _fail(self, s, job_id: str, token: str, message: str) -> Outcome:
        self._store(s, f"job {job_id}: marking it failed", lambda: jobs.mark_failed(s, job_id, message, token=token))
        log.info("job %s: failed: %s", job_id, message)
        self._clear_stream(job_id)
        self._housekeeping()
        return Outcome("failed", message)

    def _retry_or_fail(self, s, job, token: str, message: str) -> Outcome:
        job_id = job.id
        attempt = job.attempts  # this attempt's number (mark_running counted it)
        delay = self.settings.backoff(attempt, jitter=random.uniform(-1, 1))
        if self._store(s, f"job {job_id}: requeueing it",
                       lambda: jobs.requeue(s, job_id, message, token=token, delay_s=delay)):
            log.warning("job %s: attempt %d failed (%s); retrying in %.1fs", job_id, attempt, message, delay)
            return Outcome("retry", message, retry_in=delay)
        if jobs.is_cancel_requested(s, job_id):
            jobs.mark_cancelled(s, job_id, "cancelled", token=token)
            return Outcome("cancelled")
        final = f"failed after {attempt} attempt{'s' if attempt != 1 else ''}: {message}"
        return self._fail(s, job_id, token, final)

    def _housekeeping(self) -> None:
        """Every 50 jobs on the embedded broker: delete delivered messages kombu keeps forever."""
        if not self.settings.embedded_broker or self.jobs_done % 50:
            return
        from ..broker import purge_delivered

        try:
            purge_delivered(self.settings)
        except Exception as e:  # pragma: no cover - best effort
            log.warning("embedded broker cleanup failed: %s", e)


#: the error of an attempt that ran out of memory (the next attempt reads it to retry only once)
OOM_PREFIX = "out of memory"
#: exceptions that a retry cannot cure: the same job raises them again (a bug or an input the checks
#: missed); they fail the job at once instead of using up its attempts
DETERMINISTIC = (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, AssertionError, RecursionError,
                 NotImplementedError)


def failure_kind(e: BaseException) -> str:
    """How the worker treats an error of the engine: "oom" (out of memory: retried once, then failed),
    "deterministic" (failed at once) or "transient" (retried with backoff up to max_attempts)."""
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower():
        return "oom"
    if isinstance(e, DETERMINISTIC):
        return "deterministic"
    return "transient"


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, EngineError):
        return text or type(e).__name__
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _message(m: dict[str, Any]) -> tuple:
    """A stored chat message as the engine takes it: (role, content), or (role, content, calls) for an
    assistant's tool calls (engine/prompt/tools.py; the API stored them with their arguments parsed)."""
    role, content = str(m.get("role", "user")), str(m.get("content") or "")
    calls = m.get("tool_calls")
    if not calls:
        return (role, content)
    if not isinstance(calls, list):
        raise InputError("a stored message's tool_calls is not a list")
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), dict):
            raise InputError("a stored tool call needs function.name and function.arguments (an object)")
        out.append({"name": fn["name"], "arguments": fn["arguments"]})
    return (role, content, tuple(out))


def engine_input(kind: str, inp) -> dict[str, Any]:
    """Engine.run's keyword arguments for a job of `kind`: a chat's messages, a raw prompt, or none (a
    native job, or a chat request that gave specq.document)."""
    if kind == "chat" and inp.messages is not None:  # without messages: an explicit document + question
        messages = inp.messages
        if not isinstance(messages, list) or not messages:
            raise InputError("the chat job has no messages")
        return {"messages": [_message(m) for m in messages]}
    if kind == "completion":
        return {"raw": True}
    return {}


ProgressFn = Callable[[str, int, int], None]

__all__ = ["WorkerRuntime", "Outcome", "JobTimeLimit", "worker_name", "failure_kind", "OOM_PREFIX"]
