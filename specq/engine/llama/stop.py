"""When a run must end early: a cancel request or a deadline, checked inside long llama.cpp work.

A `Stop` is handed to `Engine.run` (the worker makes one per job), which runs under it
(`running()`: every context decoding in that thread sees it). It is checked

* in Python before every `llama_decode` call (`Context` in llama.py), and prefill and scoring are
  split into calls of at most `EngineOptions.call_tokens` tokens (docs/engine.md: about 0.5 s of
  work each), so a cancel or the deadline is seen between them;
* in C during a call: each context's abort callback (patches/0003) reads a flag and a deadline after
  every graph node the CPU backend computes — one atomic load, plus a clock read while a deadline is
  set; no Python and no GIL. `cancel()` (any thread) sets that flag on the contexts decoding at that
  moment, so a long call ends within one graph node. llama.cpp's abort callback works only with CPU
  execution: on a GPU the bounded calls are the bound.

An aborted call returns 2; `Context` then removes every cell the call wrote (llama.cpp removes only
the aborted ubatch's) and raises `reason()`: `RunCancelled`, or `JobTimeLimit` past the deadline.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

from ...contracts import JobTimeLimit, RunCancelled


class Stop:
    """A cancel request (set with `cancel()`, or polled from `cancelled`) and/or a deadline.

    deadline: a `time.monotonic()` value (None: none); limit_message: the JobTimeLimit's message.
    """

    def __init__(self, *, cancelled: Callable[[], bool] | None = None, deadline: float | None = None,
                 limit_message: str = "") -> None:
        self._poll = cancelled
        self.deadline = deadline
        self.limit_message = limit_message or "the run exceeded its time limit"
        self._cancelled = threading.Event()
        self._message = "cancelled"
        self._error: RunCancelled | None = None
        self._lock = threading.Lock()
        #: contexts decoding right now (Context.decode registers itself around each llama_decode)
        self._active: set = set()

    @classmethod
    def after(cls, seconds: float, **kw) -> "Stop":
        """A Stop whose deadline is `seconds` from now."""
        return cls(deadline=time.monotonic() + seconds, **kw)

    # -- the cancel side (any thread) ----------------------------------------------------------------
    def cancel(self, message: str = "cancelled", error: RunCancelled | None = None) -> None:
        """Request the stop; a llama_decode running on a registered context ends within a graph node
        (CPU) or at the end of its call (other backends). `error`: the exception the run then ends
        with (default RunCancelled(message); the worker passes its Fenced)."""
        with self._lock:
            if not self._cancelled.is_set():
                self._message = message
                self._error = error
            self._cancelled.set()
            for ctx in list(self._active):
                ctx.trip_stop()

    @property
    def cancelled(self) -> bool:
        if not self._cancelled.is_set() and self._poll is not None and self._poll():
            self._cancelled.set()
        return self._cancelled.is_set()

    # -- the run side ----------------------------------------------------------------------------------
    def remaining(self) -> float | None:
        """Seconds to the deadline (may be negative); None without one."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def reason(self) -> RunCancelled | None:
        """The exception the run must end with now, or None to go on."""
        if self.cancelled:
            return self._error or RunCancelled(self._message)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return JobTimeLimit(self.limit_message)
        return None

    def check(self) -> None:
        """Raise `reason()` if there is one."""
        why = self.reason()
        if why is not None:
            raise why

    def enter(self, ctx) -> None:
        """`ctx` runs a llama_decode under this stop now (Context.decode): a cancel trips it."""
        with self._lock:
            self._active.add(ctx)
            if self._cancelled.is_set():  # cancelled between the check and the call
                ctx.trip_stop()

    def leave(self, ctx) -> None:
        """`ctx`'s call under this stop ended."""
        with self._lock:
            self._active.discard(ctx)


_CURRENT = threading.local()


@contextlib.contextmanager
def running(stop: Stop | None) -> Iterator[Stop | None]:
    """Within the block, every Context decoding in this thread (one without its own `stop`) runs
    under `stop` — the contexts an Engine builds during a run included."""
    prev = getattr(_CURRENT, "stop", None)
    _CURRENT.stop = stop
    try:
        yield stop
    finally:
        _CURRENT.stop = prev


def current() -> Stop | None:
    """The Stop of this thread's running block (None outside one)."""
    return getattr(_CURRENT, "stop", None)


def checked_progress(progress: Callable[[str, int, int], None] | None,
                     stop: Stop | None) -> Callable[[str, int, int], None]:
    """The caller's progress callback (or none), with `stop.check()` before each report: cancel and the
    deadline then also land at every phase step of a run."""
    user_report = progress or (lambda phase, done, total: None)

    def report(phase: str, done: int, total: int) -> None:
        if stop is not None:
            stop.check()
        user_report(phase, done, total)

    return report


__all__ = ["Stop", "checked_progress", "current", "running"]
