"""What a waiting CLI shows of a running job: its phase under a display label, done/total with their
unit (scoring windows, prefill tokens, decoded tokens), the time spent in the phase and an estimate
of the time left from the rate seen since the phase began.

The API's phase names stay as docs/result.md defines them (`sparse_prefill` is the target's prefill
in every mode; while it runs the CLI does not know yet whether it is sparse, so it says "prefill").
The clock is the client's: a phase entered before the CLI started waiting counts from then."""

from __future__ import annotations

import time
from typing import Callable

#: display labels of the phases a running job reports
LABELS = {"score": "scoring", "sparse_prefill": "prefill"}
#: what `done`/`total` count in each phase
UNITS = {"score": "windows", "sparse_prefill": "tokens", "decode": "tokens"}


def duration(seconds: float) -> str:
    """`41 s`, `2 min 5 s`, `1 h 3 min`."""
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


class PhaseClock:
    """Turns a job's successive (phase, done, total) reports into `prefill 12,288/32,768 tokens ·
    41 s · ~1 min 6 s left`."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self.phase: str | None = None
        self.t0 = 0.0
        self.done0 = 0

    def text(self, phase: str | None, done: int, total: int) -> str:
        now = self._now()
        done = done if isinstance(done, int) else 0
        if phase != self.phase or done < self.done0:
            self.phase, self.t0, self.done0 = phase, now, done
        label = LABELS.get(phase or "", phase or "starting")
        elapsed = now - self.t0
        if not isinstance(total, int) or total <= 1:
            return f"{label} · {duration(elapsed)}"
        parts = [f"{label} {done:,}/{total:,} {UNITS.get(phase or '', '')}".rstrip(), duration(elapsed)]
        rate = (done - self.done0) / elapsed if elapsed > 0 else 0.0
        if rate > 0 and done < total:
            parts.append(f"~{duration((total - done) / rate)} left")
        return " · ".join(parts)

    def job_text(self, job: dict) -> str:
        """The line for a job object (GET /v1/jobs/{id}): its progress while running, else its status."""
        p = job.get("progress") or {}
        if job.get("status") != "running" or not p.get("phase"):
            return str(job.get("status"))
        return self.text(p["phase"], p.get("done") or 0, p.get("total") or 0)


__all__ = ["PhaseClock", "duration", "LABELS", "UNITS"]
