"""The speculator's scoring on a thread of its own, beside the serving loop's target batches (#15).

Why. The serving loop (serving.py) ran every llama.cpp call on its one thread, so while a job was
scored — the 0.5B speculator reading a 32K-token document, ~0.3 s of the ~1 s of serial work of
each such job on the H200 — the target only decoded in the short batches the scorer let through
between its calls, and prefilled nothing (docs/history.md, 2026-12-02: "the speculator's scoring
running beside the target's batches is the next step"). The speculator and the target are separate
models in separate llama.cpp contexts, and on a GPU each context computes on its own CUDA stream, so
a scoring window's prefill can run while the target decodes and prefills other jobs.

What runs here: one job's scoring and selection (`Engine.select`) at a time. While it runs, the
speculator's contexts belong to this thread; the loop keeps off them (no job whose drafter decodes
on the speculator's context, `draft model`, is set up or decoded meanwhile, and a job is only
handed here while no such job is live: serving.py `_speculator_shared`). Everything of the target
stays on the loop's thread.

Cancel: the job's `Stop` (engine/llama/stop.py) is current in this thread while it scores, so a cancel
lands before the window's next llama_decode call and, on the CPU, inside one.

`auto` (the default, SPECQ_SCORE_THREAD) turns it on only when the target is not on the CPU: there
two threads of llama.cpp's CPU kernels would share the same cores, and the batch-invariant CPU
configuration keeps its one-thread order of work.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable

SCORE_THREAD_CHOICES = ("auto", "on", "off")


def resolve_score_thread(choice: str, *, on_cpu: bool) -> bool:
    """Whether to score on a thread of its own: `on`, `off`, or `auto` = when the target is not on the CPU."""
    if choice not in SCORE_THREAD_CHOICES:
        raise ValueError(f"score_thread must be {', '.join(SCORE_THREAD_CHOICES)}, not {choice!r}")
    return choice == "on" or (choice == "auto" and not on_cpu)


#: the name of this thread (the score math's per-layer pool is scoring.MATH_THREAD_PREFIX, apart)
THREAD_PREFIX = "specq-score"


class ScoreThread:
    """One job's scoring at a time on the `specq-score` thread; `wake` runs (on that thread) when it ends.
    The thread starts with the first job handed here (a loop that never scores beside starts none)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._wake = wake
        self._job: Any = None
        self._future: Future | None = None
        #: jobs whose scoring ran here
        self.jobs_scored = 0
        #: the thread, once it has run a job
        self.thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A job is being scored, or its outcome was not collected (`take`) yet."""
        return self._future is not None

    @property
    def finished(self) -> bool:
        """The job handed here has an outcome to collect."""
        return self._future is not None and self._future.done()

    def start(self, job: Any, work: Callable[[], Any]) -> None:
        if self._future is not None:
            raise RuntimeError("the score thread is busy")
        def run():
            self.thread = threading.current_thread()
            return work()

        self._job, self._future = job, self._executor().submit(run)
        self.jobs_scored += 1
        self._future.add_done_callback(lambda _f: self._wake())

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_PREFIX)
            return self._pool

    def take(self) -> tuple[Any, Future] | None:
        """(job, its future) once its scoring has ended (the future holds the outcome or the error); else None."""
        if not self.finished:
            return None
        got = (self._job, self._future)
        self._job = self._future = None
        return got

    def close(self, timeout: float | None = None) -> None:
        """Wait for a scoring in flight (its job's Stop makes a dropped one end at its next call), then end the thread."""
        if self._future is not None:
            wait([self._future], timeout)
        with self._pool_lock:
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=timeout is None)


__all__ = ["SCORE_THREAD_CHOICES", "THREAD_PREFIX", "ScoreThread", "resolve_score_thread"]
