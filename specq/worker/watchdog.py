"""The worker's watchdog: a process whose engine thread is stuck exits, so that its jobs are run again.

Why: a job's heartbeat is written by its watcher thread (runtime._Watcher), not by the engine, so a
loop stuck in a C call (a hung llama_decode, a driver that never returns) kept its jobs `running`
with fresh heartbeats for ever, and the time limit only re-issued cancels that nobody read. A
thread stuck in C cannot be stopped from Python; the process can end.

How: the runtime tells the watchdog which jobs the engine holds and their deadlines (`enter` /
`leave`); `steps()` is the engine's own progress (the serving loop's step counter, or with one slot
the number of the engine's progress calls). Every `interval` seconds the watchdog samples it. When
some job the engine holds is past its deadline + `grace` (SPECQ_WATCHDOG_GRACE) and the engine has
not stepped for `grace` seconds either (a job past its deadline is dropped at the loop's next step,
and with one slot the engine's next progress call raises the time limit: an engine that steps is not
stuck, one that holds such a job without stepping is), it logs why and exits the process with EXIT_CODE (`os._exit`: no
cleanup can wait on the stuck thread). Its supervisor starts it again (`specq up` restarts a worker
that exits with EXIT_CODE; Compose's `restart: unless-stopped`); its jobs' heartbeats stop, and
after SPECQ_STALE_AFTER the reconciler of any worker requeues them if attempts remain, else fails
them with "failed after N attempts: worker W stopped heartbeating during P".
tests/test_watchdog.py::test_a_stuck_engine_loop_exits_the_worker_and_its_job_is_requeued_then_failed
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

log = logging.getLogger("specq.worker")

#: the exit status of a worker ended by its watchdog (EX_SOFTWARE); `specq up` restarts on it
EXIT_CODE = 70


class Watchdog(threading.Thread):
    def __init__(self, steps: Callable[[], int], grace: float, *, interval: float = 1.0,
                 exit: Callable[[int], None] = os._exit, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name="specq-watchdog", daemon=True)
        self.steps, self.grace, self.interval = steps, float(grace), float(interval)
        self._exit, self._clock = exit, clock
        self._lock = threading.Lock()
        self._held: dict[str, float] = {}  # job -> its deadline (monotonic), while the engine holds it
        self._last_steps = -1
        self.last_step_at = clock()  # when the step counter was last seen to change
        self._stop_event = threading.Event()

    def enter(self, job_id: str, deadline: float) -> None:
        with self._lock:
            self._held[job_id] = deadline

    def leave(self, job_id: str) -> None:
        with self._lock:
            self._held.pop(job_id, None)

    def stalled_s(self) -> float:
        """Seconds since the engine last stepped (0 while it holds no job): for the process heartbeat."""
        with self._lock:
            held = bool(self._held)
        return round(self._clock() - self.last_step_at, 1) if held else 0.0

    def check(self) -> str | None:
        """One sample; why the process must exit, or None."""
        now = self._clock()
        n = self.steps()
        if n != self._last_steps:
            self._last_steps, self.last_step_at = n, now
        with self._lock:
            held = sorted(self._held.items(), key=lambda kv: kv[1])
        for job_id, deadline in held:
            if now > deadline + self.grace and now - self.last_step_at > self.grace:
                return (f"the engine has not stepped for {now - self.last_step_at:.0f}s, and job {job_id} is "
                        f"{now - deadline:.0f}s past its time limit (grace {self.grace:g}s, SPECQ_WATCHDOG_GRACE): "
                        f"its thread is stuck; exiting (status {EXIT_CODE}) so the worker is restarted and the "
                        "reconciler runs its jobs again")
        return None

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            why = self.check()
            if why:
                log.critical("watchdog: %s", why)
                for h in logging.getLogger().handlers + log.handlers:
                    try:
                        h.flush()
                    except Exception:
                        pass
                self._exit(EXIT_CODE)
                return

    def stop(self) -> None:
        self._stop_event.set()


__all__ = ["EXIT_CODE", "Watchdog"]
