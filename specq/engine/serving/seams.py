"""Test seams of the engine loop (serving.py), handed to `ServingEngine(seams=...)` by whoever builds
the loop — a test, or a test's worker launcher (tests/seamed_worker.py) through `run_worker(seams=...)`.
Production code builds no seams and reads none from the environment (issue 44 item 12: the former
SPECQ_SERVING_FAULT variable was read on every submit of every production worker).

* `fails(params)`: True for a job whose decode batches must fail (after its third token, as if
  llama_decode failed on its rows): the others in the same batches must finish unharmed.
* `before_step(params)`: runs on the loop's thread at the start of every step with the admitted
  jobs' RunParams; a test blocks in it to stand for a thread stuck in a C call (the worker's
  watchdog must notice: worker/watchdog.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..options import RunParams


@dataclass(frozen=True)
class LoopSeams:
    fails: Callable[[RunParams], bool] | None = None
    before_step: Callable[[Sequence[RunParams]], None] | None = None


__all__ = ["LoopSeams"]
