"""Pipelined SpecPrefill: the target prefills each scoring window's kept chunks while the speculator
scores the next window.

With per-window selection (selection.select_window) a window's kept chunks depend on its own scores
only, so they are final as soon as the window is scored. The stages, in prompt order:

    head (protected, before any score)  →  window 1's kept chunks (+ pinned indices in it)  →  …
    →  window k's  →  the question and template tail (protected; the last prompt token's logits)

Every index of a stage is larger than every index of the one before, so the target's positions stay
original (or compressed: renumbered in the same order) and strictly increasing, exactly as one
`sparse_prefill` of the same kept set would place them.

threaded=True: the speculator scores on the calling thread (its progress callback, and a cancel
raised from it, stay there) and a second thread runs the target's decodes, fed through a queue.
llama.cpp's `llama_decode` runs with the GIL released (ctypes foreign calls), so the two overlap
when they are on two devices; on one device they compete for it. threaded=False runs the same
stages in series (the target's stage right after each window): the same kept set and decodes,
without overlap, which gives each stage's uncontended prefill time.

`align`: the target decodes only whole multiples of `align` kept tokens per call, holding the rest
back for the next stage, so with align = n_ubatch every micro-batch is the one a single
`sparse_prefill` of the kept set would run: the KV cache, and so the answer, are bit for bit the
serial path's (the engine does this where the numerics are batch-invariant, on the CPU). align=1
decodes each stage as soon as it is chosen (a GPU build, where per-batch-size kernels differ anyway).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..llama.binding import Context
from ..decode.prefill import PrefillResult
from ..prompt.build import Prompt
from .selection import DEFAULT_CHUNK_RULE, select_window, window_cap


@dataclass
class Stage:
    """One stage of the pipeline: the tokens it chose, and when (seconds from the run's start)."""

    name: str  # head, window, tail
    a: int = 0  # document slice [a, b) (windows)
    b: int = 0
    n_tokens: int = 0  # kept prompt tokens this stage hands the target
    ready_s: float = 0.0  # its tokens were chosen (the window scored)
    select_ms: float = 0.0
    prefill_start_s: float = 0.0  # the target started / finished this stage's decodes
    prefill_end_s: float = 0.0
    decoded: int = 0  # tokens actually decoded in this stage's turn (align holds some back)


@dataclass
class PipelineTrace:
    threaded: bool
    align: int
    stages: list[Stage] = field(default_factory=list)
    score_end_s: float = 0.0
    end_s: float = 0.0

    @property
    def prefill_busy_ms(self) -> float:
        return sum(s.prefill_end_s - s.prefill_start_s for s in self.stages) * 1000.0

    def to_dict(self) -> dict:
        return {"threaded": self.threaded, "align": self.align, "score_end_s": round(self.score_end_s, 6),
                "end_s": round(self.end_s, 6), "stages": [vars(s) for s in self.stages]}


class IncrementalPrefill:
    """The target's sparse prefill fed in increasing pieces (`feed`), ended by `finish`."""

    def __init__(self, ctx: Context, tokens: Sequence[int], positions: str, *, align: int = 1,
                 observe: Callable | None = None) -> None:
        if positions not in ("original", "compressed"):
            raise ValueError(f"unknown positions mode {positions!r}")
        self.ctx, self.positions, self.observe = ctx, positions, observe
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.align = max(1, int(align))
        self.last = -1  # largest prompt index handed in so far
        self.n_fed = 0  # kept tokens decoded so far (= the next compressed position)
        self._held = np.zeros(0, dtype=np.int64)
        ctx.clear()

    def feed(self, indices: Sequence[int], *, final: bool = False) -> int:
        """Hand over the next kept prompt indices (sorted, all above those fed before); decodes whole
        multiples of `align` of what is pending (everything when `final`). Returns tokens decoded."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size:
            if idx[0] <= self.last or (idx.size > 1 and np.any(np.diff(idx) <= 0)):
                raise ValueError("pipelined prefill: kept indices must be sorted, unique and above those fed before")
            self.last = int(idx[-1])
        pending = np.concatenate([self._held, idx]) if self._held.size else idx
        n_now = pending.size if final else (pending.size // self.align) * self.align
        now, self._held = pending[:n_now], pending[n_now:]
        if final and (not now.size or int(now[-1]) != self.tokens.size - 1):
            raise ValueError("the kept indices must include the last prompt token")
        step = self.ctx.n_batch if self.observe is not None else max(1, now.size)
        for s in range(0, now.size, step):
            part = now[s : s + step]
            toks = self.tokens[part]
            pos = part.astype(np.int32) if self.positions == "original" else \
                np.arange(self.n_fed, self.n_fed + part.size, dtype=np.int32)
            last_part = final and s + step >= now.size
            self.ctx.decode(toks, pos, logits="last" if last_part else "none")
            self.n_fed += int(part.size)
            if self.observe is not None:
                self.observe(self.ctx, range(part.size), toks.tolist(), pos.tolist())
        return int(now.size)

    def finish(self) -> PrefillResult:
        n = int(self.tokens.size)
        return PrefillResult(next_pos=n if self.positions == "original" else self.n_fed, n_kept=self.n_fed,
                             logits=self.ctx.logits_row(-1))


class _Target(threading.Thread):
    """The target's side: decodes the stages handed to it, in order, on its own thread."""

    def __init__(self, pre: IncrementalPrefill, t0: float) -> None:
        super().__init__(name="specq-pipelined-prefill", daemon=True)
        self.pre, self.t0 = pre, t0
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._stop_now = threading.Event()

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None or self._stop_now.is_set():
                return
            stage, indices, final = job
            if self.error is not None:
                continue
            try:
                _run_stage(self.pre, stage, indices, final, self.t0)
            except BaseException as e:  # noqa: BLE001  handed to the scoring thread, which raises it
                self.error = e
            if final:
                return

    def stop(self) -> None:
        self._stop_now.set()
        self.jobs.put(None)


def _run_stage(pre: IncrementalPrefill, stage: Stage, indices: list[int], final: bool, t0: float) -> None:
    stage.prefill_start_s = time.perf_counter() - t0
    stage.decoded = pre.feed(indices, final=final)
    stage.prefill_end_s = time.perf_counter() - t0


def pipelined_prefill(
    scorer,
    ctx: Context,
    prompt: Prompt,
    *,
    keep: float,
    chunk: int,
    max_keep: int,
    positions: str,
    score_kwargs: dict,
    rule: str = DEFAULT_CHUNK_RULE,
    pieces: Sequence[bytes] | None = None,
    threaded: bool = True,
    align: int = 1,
    observe: Callable | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[int], object, PrefillResult, PipelineTrace]:
    """Score `prompt` with `scorer` (a SpecPrefillScorer; score_kwargs: scorer, lookahead, pool,
    window) and prefill the target's `ctx` stage by stage as windows finish (module docstring).
    `pieces`: the document tokens' bytes, for a chunk rule that reads the text (selection.select_kept).
    Returns (kept prompt indices, the ScoreResult, the PrefillResult, the trace)."""
    t0 = time.perf_counter()
    trace = PipelineTrace(threaded=threaded, align=max(1, int(align)))
    pre = IncrementalPrefill(ctx, prompt.tokens, positions, align=align, observe=observe)
    pinned = np.asarray(sorted(prompt.pinned), dtype=np.int64)
    n_doc = prompt.doc_end - prompt.doc_start
    kept: list[int] = []
    target = _Target(pre, t0) if threaded else None

    def hand(stage: Stage, indices: list[int], final: bool = False) -> None:
        stage.n_tokens = len(indices)
        stage.ready_s = time.perf_counter() - t0
        trace.stages.append(stage)
        kept.extend(indices)
        if target is None:
            _run_stage(pre, stage, indices, final, t0)
        else:
            if target.error is not None:
                raise target.error
            target.jobs.put((stage, indices, final))

    def on_window(a: int, b: int, scores: np.ndarray) -> None:
        ts = time.perf_counter()
        start = prompt.doc_start + a
        chosen = select_window(scores, start=start, keep=keep, chunk=chunk, max_keep=window_cap(max_keep, b - a, n_doc),
                               rule=rule, pieces=None if pieces is None else pieces[a:b])
        lo, hi = np.searchsorted(pinned, [start, prompt.doc_start + b])
        indices = sorted(set(chosen).union(int(i) for i in pinned[lo:hi]))
        hand(Stage("window", a=a, b=b, select_ms=(time.perf_counter() - ts) * 1000.0), indices)

    if target is not None:
        target.start()
    try:
        hand(Stage("head"), list(range(prompt.doc_start)))
        scored = scorer.score(prompt, progress=progress, on_window=on_window, **score_kwargs)
        trace.score_end_s = time.perf_counter() - t0
        hand(Stage("tail"), list(range(prompt.doc_end, prompt.n)), final=True)
        if target is not None:
            target.join()
            if target.error is not None:
                raise target.error
    except BaseException:
        if target is not None:
            target.stop()
            target.join()
        raise
    trace.end_s = time.perf_counter() - t0
    return kept, scored, pre.finish(), trace


def pipeline_bound(score_s: Sequence[float], prefill_s: Sequence[float]) -> float:
    """Shortest time the stages allow with scoring and prefill on separate devices: stage i's prefill
    starts once its window is scored and stage i-1's prefill is done (score_s[i]: window i's scoring
    time, prefill_s[i]: its prefill time, both measured alone). For k equal stages of S/k and P/k this
    is S/k + (k-1)·max(S, P)/k + P/k."""
    t_scored, t_done = 0.0, 0.0
    for s, p in zip(score_s, prefill_s):
        t_scored += s
        t_done = max(t_scored, t_done) + p
    return t_done
