"""Serving slots: one engine thread runs many jobs at once on one loaded target + speculator.

`ServingEngine(engine)` starts one thread (`specq-engine`) that owns every llama.cpp call of the
engine from then on. Other threads `submit()` jobs and get a `JobHandle` (a future: `result()`,
`cancel(exc)`); `run()` is `Engine.run`'s signature, blocking, callable from any thread.

The target's context holds one sequence per slot (`Engine.slots`, EngineOptions.slots), slot s =
sequence s, each in a KV stream of its own of n_ctx cells (not one unified cache: there one job's
rolled-back draft cells leave holes that another job's later tokens fill out of position order, which
changes flash attention's summation order and so its rounding; measured on the tiny models: sampled
output changed). A job's prompt + max_tokens must fit n_ctx (Engine.tokenize_prompt), so admission
is by free slot.

Each step of the loop:

1. cancels and time limits (`JobHandle.cancel`) drop their jobs: the job's cells are removed
   (seq_rm of its sequence), its future gets the exception, nothing else changes;
2. waiting jobs take free slots (FIFO);
3. one unit of preparation of the oldest admitted job that is not decoding: its mode decision (the
   prompt was tokenized by `submit()` in the submitting thread, beside the loop; a baseline job's
   set-up follows in the same step), or its whole
   scoring + selection, or setting up its prefill (drafter, kept tokens). During the scoring the
   decoding jobs get one decode batch after each of the speculator's llama_decode calls of a window's
   prefill (at most call_tokens tokens each: `select(between_calls=...)`, scoring.py "Between
   calls") and between two window groups, so their inter-token gap is bounded by one scoring call
   (or one lookahead + score math), not one window; the scoring job's progress callback runs per
   window group, and its cancel (`JobHandle.cancel`) lands at the next call. A full prefill restores
   the longest prefix the target's prompt cache holds into the job's own sequence and prefills only
   the rest, and leaves the whole prompt in its slot for the prompt cache to take when the slot is reused
   ("Prompt saves" below; prefix_cache.py, entries keyed by the slots' layout "streams"); one whose prompt
   shares a longer prefix with a job prefilling now than the cache holds sets up after that job's prefill
   and copies its cells (`_prefix_owner`: questions about one document arriving together prefill the
   document once). Before the host cache, a full prefill looks at its own slot:
   a slot keeps the prompt cells of the last full prefill it served (its "resident" prompt; the
   answer's cells are removed), admission gives a job the free slot whose resident shares the
   longest prefix with its prompt, and setup then removes only the cells past that prefix — a
   document's next question prefills only the question, with no copy from host memory (llama-server
   picks its slot by prompt similarity for the same reason; `slot_prefix_hits`). When another slot
   holds more of the prompt than the job's own slot and the host cache do (a question of the same
   document decoding there, e.g. the owner a `_prefix_owner` wait was for, or another free slot's
   resident), setup copies that slot's KV stream on the device (`seq_cp`: llama.cpp copies whole
   streams, ~1.8 GB for 32K tokens of the 7B, in a device-to-device copy at the next llama_decode)
   and removes the cells past the shared prefix (`slot_copy_hits`, `spec.cache.target.from_other_slot`).
   Residents are kept only with one KV stream per slot (a unified cache would lend their cells to no one);
4. one target batch (one `llama_decode`, at most n_batch rows): the next tokens of every decoding
   job (its last token + its draft, at its own positions, in its own sequence) plus a chunk of at
   most `prefill_chunk` kept tokens of one job being prefilled (by default the room the decode rows leave
   in n_batch on a GPU, as llama-server fills its batch: fewer llama_decode calls per prefill, 8 documents'
   first questions of 32K done at 19.5 s instead of 21.0 and per-doc jobs/min 102.3 against 96.2 on an
   H100, bench/results/h100-2026-12-07c/; n_ubatch on the CPU, where a call's cost is its tokens' and a
   longer step only delays the decoding jobs). Each decoding job then verifies its
   own rows (`decode.SeqDecoder.absorb`): acceptance, sampling and KV rollback are per sequence.
   If that batch fails, every job in it is rolled back and decoded alone, so only the job whose
   tokens fail gets the error.

Prompt saves: where slots keep their residents (step 3), a full prefill's prompt is not copied to the
prompt cache when its first token is out but when its slot is about to be reused for another prompt
(`_before_reuse`, at that job's set-up), and at close when the cache has a disk copy. Why: the save is
a device-to-host copy on this thread with every other job waiting (0.66 s per 32K-token document on
the 7B, H100, bench/results/h100-2026-12-07-goals/), and a document's next questions find its prompt
in the slot anyway; 8 documents' first questions spent ~5 s of a 43.5 s run saving. A job that keeps
nearly all of an unsaved resident (its document's next question) takes the save over (`owes_save`);
`spec.cache.target.save_deferred` says a job's prompt was left for later, `saves_on_reuse` counts the
saves made at reuse.

Drafters: n-gram lookup is per job; the model drafter drafts on a speculator context of its slot's
own (Engine.draft_cache: with several slots; a scored job's drafter starts from a copy of the window
its scoring left in the scorer's context), so jobs decoding together never draft on one another's
KV (issue 44 item 10: with one shared context a copy-of-the-target drafter's acceptance fell from 1.0
alone to 0.04 beside another job). With one slot it drafts on the scorer's context (sequence 0,
re-synchronised with its job's history at each proposal); capture is armed only inside the scorer's
own lookahead decodes, which never run while a drafter decodes (one thread). A job whose drafter
decodes on the context a window is being prefilled into sits out the batches between that window's
calls (`_drafts_on`: only a drafter on the scorer's context, i.e. one slot). MTP / EAGLE3 need slots = 1.

Scoring on its own thread (score_thread.py; `score_thread`, SPECQ_SCORE_THREAD: auto = with a GPU
target): step 3's scoring + selection is handed to the `specq-score` thread (stage `scoring`) and the
loop goes on with the target's batches, prefill chunks included; a later step collects the outcome
(`_collect_scored`). One job is scored at a time; while a job drafting with the speculator (`draft
model`) is live, scoring stays on this thread as described above.

Group-sparse prefill (serving_group.py; `group_sparse`, SPECQ_GROUP_SPARSE): at step 3's set-up a
scored specprefill job whose document other admitted jobs ask about too waits for their scoring, then
the oldest prefills head + the union of their kept chunks and the others copy it from its slot
(`seq_cp`) and prefill only their own tail.

Speculator cache saves: a scoring job's window prefixes are saved to the speculator cache after
their prefill, on this thread, with every other job waiting (no decode batch between the saves). With
EngineOptions.spec_cache_save `repeat` (SPECQ_SPEC_CACHE_SAVE; default `always`) only a stored
document's windows (`submit(reused_document=True)`) and windows seen once before are saved, so a
one-off 32K-token document no longer copies ~400 MB from the device (docs/serving.md "Where the time
goes"); `timings_ms.cache_save` is the time a job spent saving.

Timings (`timings_ms`, per job): each phase's wall-clock span (`tokenize`, `score`, `select`,
`sparse_prefill`, `decode`) and the engine time of this job's own work in it (`<phase>_engine`:
its units, and the batches that held its tokens); `interleave_wait` = the spans minus the engine
times (other jobs' work in between); `slot_wait` = tokenized (in `submit`) to a free slot;
`tokenize` = the submitting thread's tokenization + the loop's mode-decision step; `ttft` and
`total` count from submission.

Where a job's time to first token goes (`ft_*`, ms, together `ttft`; `specq bench serve` reports their
p50s as `first_token_ms`): `ft_tokenize` the submitting thread's tokenization (and grammar), `ft_admit`
handed to the loop -> admitted to a slot (the loop finishing its current step, or no free slot),
`ft_pick` choosing the slot (resident prefixes compared), `ft_decide` the mode decision (host cache
looked up), `ft_setup` the set-up (prefix match in the slots and the host cache, KV kept, copied or
restored, the prefill's plan), `ft_fill` the target batches that held its prefill tokens (other jobs'
decode rows in them too), `ft_sample` its first token (logits copied, sampled, emitted), `ft_between`
the rest: other jobs' batches and units between its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import llama_cpp  # noqa: F401  # isort: skip  (before numpy, as everywhere in the engine)
import numpy as np

from ...contracts import DecodeError, Drained, RunCancelled
from ..decode.loop import SeqDecoder
from ..decode.grammar import guide_for
from ..policy.auto import chose_group
from ..llama.invariance import MAX_INVARIANT_BATCH, on_cpu
from ..options import RunParams
from ..decode.prefill import prefill_plan
from ..cache.prefix import PrefixUse, common_prefix
from ..result import RunResult
from ..decode.sampling import Sampler
from .seams import LoopSeams
from .score_thread import ScoreThread, resolve_score_thread
from .groups import form as form_group
from .groups import GroupedDocuments, groupable, mates, still_pending
from ..llama.stop import Stop, running

log = logging.getLogger("specq.engine")

PHASES = ("tokenize", "score", "sparse_prefill", "decode")
#: batch-invariant mode: most rows of one decode batch for K-quant weights (engine/llama/invariance.py: the
#: CPU's tiled K-quant matmul starts at 8 rows; batches of 1-7 rows give bit-identical logits)
INVARIANT_ROWS = MAX_INVARIANT_BATCH
#: llama.cpp's general.file_type values of K-quant models (Q2_K … Q6_K)
KQUANT_FILE_TYPES = frozenset(range(10, 19))


def invariant_rows(model) -> int:
    """Rows of several jobs that may share a decode batch in batch-invariant mode: INVARIANT_ROWS for
    a K-quant model; 0 (one job per batch) otherwise: F16/F32 weights take another matmul kernel for
    2+ rows than for 1 (measured on the tiny F16 models: two jobs' tokens in one batch changed
    sampled output), so only a job's own rows, as it decodes them alone, are batched together."""
    import ctypes

    import llama_cpp

    buf = ctypes.create_string_buffer(32)
    try:
        n = llama_cpp.llama_model_meta_val_str(model.ptr, b"general.file_type", buf, len(buf))
        ftype = int(buf.value) if n > 0 else -1
    except (ValueError, AttributeError):
        ftype = -1
    return INVARIANT_ROWS if ftype in KQUANT_FILE_TYPES else 0


def _now() -> float:
    return time.perf_counter()


@dataclass
class _Job:
    document: str
    params: RunParams
    progress: Callable[[str, int, int], None]
    on_text: Callable[[str], None] | None
    messages: list | None
    raw: bool
    scope: str = ""  # the tenant: the speculator cache reuses KV only within one scope
    reused_document: bool = False
    #: questions about this document submitted together, this one included (a worker's group claim): mode
    #: auto's rule 1a counts them before they all reach the loop (`_auto_group`)
    group_hint: int = 0
    #: mode auto chose rule 1a's group path for this job (auto.chose_group): only then may it join a group
    auto_group: bool = False
    future: Future = field(default_factory=Future)
    t_submit: float = field(default_factory=_now)
    t_queued: float = 0.0  # tokenized (in the submitting thread, from t_submit) and handed to the loop
    cancel_exc: BaseException | None = None
    slot: int = -1
    stage: str = "waiting"  # waiting, tokenize, score, scoring (on the score thread), setup, prefill, decode
    stop: Stop | None = None  # while it is scored on the score thread: its cancel there
    # filled as it runs
    prompt: Any = None
    mode: str = ""
    positions: str = ""
    warnings: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    spec: Any = None
    kept: Any = None
    doc_scores: Any = None
    drafter: Any = None
    pre_toks: Any = None
    pre_pos: Any = None
    next_pos: int = 0
    offset: int = 0
    dec: SeqDecoder | None = None
    guide: Any = None  # the grammar of its json_schema (decode/grammar.py), made at submit
    text: Any = None
    first: list = field(default_factory=list)
    t_admit: float = 0.0
    t_phase: float = 0.0  # when the current phase's span began
    engine_ms: dict = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    span_ms: dict = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    faulty: bool = False
    prefix_use: PrefixUse | None = None  # a full prefill through the target's prompt cache
    #: its prompt, left resident in its slot, is not in the prompt cache yet ("Prompt saves")
    owes_save: bool = False
    wait_for: "_Job | None" = None  # the job whose prompt (sharing this one's prefix) is being prefilled
    # group-sparse prefill (serving_group.py)
    group: Any = None  # the SlotGroup this job is a member of
    group_pending: list = field(default_factory=list)  # mates still being scored that this job waits for
    group_copied_from: int = -1  # the slot whose head + union this member copied (-1: prefilled by itself)
    t_group: float = 0.0  # when it began waiting for its mates (a group member: set)
    ft: dict = field(default_factory=dict)  # seconds of its first-token path's own steps (module doc, `ft_*`)

    def token_array(self) -> np.ndarray:
        """The prompt's tokens as int32 (Prompt.array: made once per prompt)."""
        return self.prompt.array

    def shares(self, tokens: np.ndarray) -> int:
        """Tokens of this job's prompt (at most n-1: the last is decoded again for its logits) that a
        sequence holding `tokens` in cells 0.. already has."""
        return min(common_prefix(tokens, self.token_array()), self.prompt.n - 1)

    def end_phase(self, phase: str, t: float) -> None:
        self.span_ms[phase] += (t - self.t_phase) * 1000.0
        self.t_phase = t


def _drafts_with_speculator(job: _Job) -> bool:
    """`draft model`: the job's drafter decodes on the scorer's speculator context."""
    return job.params.draft == "model"


class JobHandle:
    """A submitted job: `result()` waits for its RunResult (or raises its error); `cancel(exc)`
    drops it at the loop's next step (default RunCancelled)."""

    def __init__(self, loop: "ServingEngine", job: _Job) -> None:
        self._loop, self._job = loop, job

    @property
    def future(self) -> Future:
        return self._job.future

    def done(self) -> bool:
        return self._job.future.done()

    def result(self, timeout: float | None = None) -> RunResult:
        return self._job.future.result(timeout)

    def cancel(self, exc: BaseException | None = None) -> None:
        job = self._job
        if job.cancel_exc is None:
            job.cancel_exc = exc or RunCancelled("cancelled")
        stop = job.stop
        if stop is not None:  # being scored on the score thread: end its llama_decode there too
            stop.cancel(error=job.cancel_exc)
        self._loop._wake()


class ServingEngine:
    """The engine loop over an `Engine` (module doc). `start()` it, then `submit()` / `run()`."""

    def __init__(self, engine, *, prefill_chunk: int = 0, score_thread: str = "auto", group_sparse: bool = False,
                 seams: LoopSeams | None = None) -> None:
        """`seams`: test seams (seams.py); None in production."""
        self.engine = engine
        self.seams = seams or LoopSeams()
        self.ctx = engine.ctx
        self.slots = int(getattr(engine, "slots", 1))
        #: batch-invariant target numerics: decode batches of <= INVARIANT_ROWS rows, prefill apart
        self.invariant = bool(getattr(getattr(engine, "numerics", None), "batch_invariant", False))
        self.invariant_rows = invariant_rows(engine.target) if self.invariant else 0
        #: rows one slot's verification may take (its token + drafts): all slots' together leave room
        #: for a prefill chunk in one batch of at most n_batch rows (more rows: llama.cpp splits the
        #: batch and the rows of the first part are lost)
        self._draft_rows = max(2, min(65, self.ctx.n_batch // (2 * self.slots)))
        cap = self.ctx.n_batch - self.slots * self._draft_rows
        cpu = on_cpu(engine.options, engine.info.backend)
        self.prefill_chunk = max(1, min(prefill_chunk or (engine.n_ubatch if cpu else cap), cap))
        self._cond = threading.Condition()
        self._inbox: deque[_Job] = deque()
        self._waiting: deque[_Job] = deque()
        self._active: list[_Job] = []  # admitted, in admission order
        self._free = list(range(self.slots))
        self._admitting = True
        self._closed = False
        self._thread: threading.Thread | None = None
        #: for /metrics and the heartbeat (read without a lock: plain ints/floats)
        self.busy = 0
        self.waiting = 0
        self.kv_cells_used = 0
        self.interleave_wait_ms_total = 0.0
        self.slot_wait_ms_total = 0.0
        self.jobs_finished = 0
        self.steps = 0
        #: set-ups deferred because another job was prefilling the same prompt prefix (_prefix_owner)
        self.prefix_waits = 0
        #: slot -> (scope, prompt tokens) whose cells 0..n-1 that idle slot still holds (module doc, step 3)
        self._resident: dict[int, tuple[str, np.ndarray]] = {}
        self._resident_at: dict[int, float] = {}  # when each slot's resident was left there
        #: slot -> (scope, prompt tokens) of a resident prompt the prompt cache does not hold yet ("Prompt saves")
        self._unsaved: dict[int, tuple[str, np.ndarray]] = {}
        #: prompt saves made when a slot holding an unsaved resident was about to be reused
        self.saves_on_reuse = 0
        self._keep_residents = engine.prefix_cache() is not None and (
            self.slots == 1 or not getattr(getattr(engine, "options", None), "kv_unified", False))
        #: full prefills that started after their own slot's resident prefix (no restore from host memory)
        self.slot_prefix_hits = 0
        #: full prefills that started after a prefix copied on the device from another slot
        self.slot_copy_hits = 0
        #: the speculator's scoring on a thread of its own, beside the target's batches (score_thread.py;
        #: None: scored on this loop's thread, between its decode batches)
        beside = resolve_score_thread(score_thread, on_cpu=on_cpu(engine.options, engine.info.backend))
        self.scoring: ScoreThread | None = ScoreThread(self._wake) if beside else None
        #: specprefill questions about one document in the loop together share one sparse prefill of the
        #: target (serving_group.py); groups formed, and members that copied the union from another slot
        self.group_sparse = bool(group_sparse) and self.slots > 1
        self.groups_formed = 0
        #: documents whose questions ran as a group here (mode auto's rule 1a keeps their later questions on it)
        self.grouped_documents = GroupedDocuments()
        self.group_copies = 0

    # -- other threads ---------------------------------------------------------------------------
    def start(self) -> "ServingEngine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="specq-engine", daemon=True)
            self._thread.start()
        return self

    def submit(self, document: str, params: RunParams | None = None, progress=None, *, on_text=None,
               messages: list | None = None, raw: bool = False, scope: str = "",
               reused_document: bool = False, group_hint: int = 0) -> JobHandle:
        """`group_hint`: how many questions about this stored document the caller submits together, this one
        included (the worker's group claim; mode auto's rule 1a, `_auto_group`)."""
        job = _Job(document, params or RunParams(), progress or (lambda phase, done, total: None), on_text,
                   messages, raw, scope, reused_document, group_hint)
        job.faulty = self.seams.fails is not None and bool(self.seams.fails(job.params))
        # tokenized here, in the submitting thread (llama_tokenize reads only the vocabulary, and ctypes
        # lets go of the GIL), beside the loop's model work rather than as a step of the loop with every
        # other job waiting (~0.16 s for a 32K-token document; docs/serving.md "Where the time goes");
        # a prompt that does not fit fails here, before it takes a slot
        try:
            job.params.validate()
            job.prompt = self.engine.tokenize_prompt(document, job.params, messages=messages, raw=raw)
            job.prompt.array  # noqa: B018  (made here, beside the loop: admission compares it with the slots')
            job.guide = guide_for(self.engine.target, job.params.json_schema)
        except BaseException as e:
            job.future.set_exception(e)
            return JobHandle(self, job)
        job.t_queued = _now()
        with self._cond:
            if not self._admitting or self._closed:
                job.future.set_exception(Drained("the worker is shutting down"))
            else:
                self._inbox.append(job)
                self._cond.notify()
        return JobHandle(self, job)

    def run(self, document: str, params: RunParams | None = None, progress=None, *, messages=None,
            raw: bool = False, on_text=None) -> RunResult:
        """`Engine.run`, through the loop (blocks the calling thread)."""
        return self.submit(document, params, progress, on_text=on_text, messages=messages, raw=raw).result()

    def stop_admitting(self) -> None:
        """Drain begins: no job takes a slot from now on; jobs waiting for one get Drained."""
        with self._cond:
            self._admitting = False
            self._cond.notify()

    def drop_running(self, exc: BaseException | None = None) -> None:
        """Drop every admitted job (the drain's grace period is over)."""
        for job in list(self._active):
            if job.cancel_exc is None:
                job.cancel_exc = exc or Drained("the worker is shutting down: not finished within its grace period (SPECQ_DRAIN_GRACE)")
        self._wake()

    def close(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._closed = True
            self._admitting = False
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def live(self) -> int:
        return len(self._active) + len(self._waiting) + len(self._inbox)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    # -- the engine thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self._has_work() and not (
                        self._waiting and (self._free or not self._admitting)):
                    if self._closed and not self._active:
                        break
                    # closed with a job still on the score thread: look again soon (its end wakes us too)
                    self._cond.wait(0.02 if self._closed else 0.5)
                    if any(j.cancel_exc is not None for j in self._waiting):
                        break
                closing = self._closed and not self._active
                if closing:
                    pending = list(self._inbox) + list(self._waiting)
                    self._inbox.clear()
                    self._waiting.clear()
                    for job in pending:
                        job.future.set_exception(Drained("the engine loop was closed"))
                self._waiting.extend(self._inbox)
                self._inbox.clear()
                admitting = self._admitting
            if closing:
                if self.scoring is not None:  # a dropped job's scoring ends at its next call (outside the
                    self.scoring.close()      # lock: the thread's end wakes the loop through it)
                self._save_residents_to_disk()
                return
            try:
                self._step(admitting)
            except BaseException as e:  # a bug of the loop itself: fail every job, never hang them
                log.exception("engine loop: step failed; failing every job in it")
                for job in list(self._active) + list(self._waiting):
                    self._drop(job, e)
            self.busy = len(self._active)
            self.waiting = len(self._waiting)

    def _has_work(self) -> bool:
        """Whether a step would do something for the admitted jobs; without a score thread, any
        admitted job. A job on the score thread, or waiting for it, is not this loop's work."""
        if self.scoring is None or not self._active:
            return bool(self._active)
        if self.scoring.finished:
            return True
        return any(j.cancel_exc is not None or j.stage in ("prefill", "decode") or self._preparable(j)
                   for j in self._active)

    def _step(self, admitting: bool) -> None:
        self.steps += 1  # the loop's own progress: the worker's watchdog reads it (worker/watchdog.py)
        if self.seams.before_step is not None:
            self.seams.before_step([j.params for j in self._active])
        self._collect_scored()
        for job in list(self._waiting):
            if job.cancel_exc is not None or not admitting:
                self._waiting.remove(job)
                self._drop(job, job.cancel_exc or Drained("the worker is shutting down"))
        for job in list(self._active):
            if job.cancel_exc is not None:
                self._drop(job, job.cancel_exc)
        while admitting and self._free and self._waiting:
            job = self._waiting.popleft()
            t_pick = _now()
            job.slot = self._pick_slot(job)
            self._free.remove(job.slot)
            job.t_admit = job.t_phase = _now()
            job.ft["pick"] = job.t_admit - t_pick
            job.stage = "tokenize"
            self._active.append(job)
            self.slot_wait_ms_total += (job.t_admit - job.t_queued) * 1000.0
        prep = next((j for j in self._active if self._preparable(j)), None)
        if prep is not None:
            decided = prep.stage == "tokenize"
            if self._guard(prep, self._prepare, prep) and decided and prep.stage == "setup" and self._preparable(prep):
                # a full prefill sets up in the same step as its mode decision (both cheap beside a batch):
                # a cached follow-up's first token then waits for one batch of the others fewer
                self._guard(prep, self._prepare, prep)
        self._batch()
        self.kv_cells_used = self._cells()

    def _guard(self, job: _Job, fn, *args) -> bool:
        try:
            fn(*args)
            return True
        except BaseException as e:
            self._drop(job, e)
            return False

    def _prepare(self, job: _Job) -> None:
        eng = self.engine
        t0 = _now()
        if job.stage == "tokenize":
            job.progress("tokenize", 0, 1)
            job.prompt, job.mode, job.positions, job.warnings, job.timings, job.spec = eng.prepare(
                job.document, job.params, messages=job.messages, raw=job.raw, scope=job.scope,
                reused_document=job.reused_document, prompt=job.prompt,
                slot_tokens=max(self._resident_prefix(job, forget=False), self._other_slot_prefix(job)[1]),
                **self._auto_group(job))
            job.auto_group = job.params.mode == "auto" and job.mode == "specprefill" and chose_group(job.spec.reason)
            t1 = _now()
            job.engine_ms["tokenize"] += (t1 - t0) * 1000.0
            job.ft["decide"] = t1 - t0
            job.end_phase("tokenize", t1)
            job.stage = "score" if job.mode == "specprefill" else "setup"
            return
        if job.stage == "score" and self.scoring is not None and not self._speculator_shared():
            self._score_beside(job)
            return
        if job.stage == "score":
            nested = [0.0]

            def interleave(busy=None) -> None:
                if job.cancel_exc is not None:  # this job's own cancel: its scoring ends here
                    raise job.cancel_exc
                t = _now()
                self._interleave(busy)
                nested[0] += _now() - t

            def report(phase: str, done: int, total: int) -> None:
                job.progress(phase, done, total)
                if phase == "score" and 0 < done < total:  # between scoring window groups: the others decode
                    interleave()

            # and after each speculator call of a window's prefill (`busy`: the context holding it)
            job.kept, job.doc_scores = eng.select(job.prompt, job.params, job.timings, job.spec, report,
                                                  scope=job.scope, between_calls=interleave,
                                                  reused_document=job.reused_document)
            t1 = _now()
            job.engine_ms["score"] += (t1 - t0 - nested[0]) * 1000.0
            job.end_phase("score", t1)
            job.stage = "setup"
            return
        if job.stage == "group":
            source = job.group.holder(job)
            if source is not None:
                self._copy_union(job, source, t0)
                return
            job.stage = "setup"  # no member holds or computes the union any more (dropped): prefill it here
        if self.group_sparse and job.group is None and job.mode == "specprefill" and groupable(job):
            if not self._join_or_wait(job, t0):
                return
        # setup: the drafter, the kept tokens of the prefill, an empty sequence
        owner = self._prefix_owner(job)
        if owner is not None:  # another job is prefilling this prompt's prefix: wait for it
            job.wait_for = owner
            self.prefix_waits += 1
            job.ft["setup"] = job.ft.get("setup", 0.0) + _now() - t0
            return
        job.drafter = eng.drafter_for(job.params, job.prompt, scored=(job.mode == "specprefill"), seq=job.slot)
        if job.kept is None:  # a full prefill: prefill_plan's of every index, without its O(n) list work
            n = job.prompt.n
            job.kept = list(range(n))
            job.pre_toks, job.pre_pos, job.next_pos = job.token_array(), np.arange(n, dtype=np.int32), n
        elif job.group is None:  # a group's members got their plans when it formed
            job.pre_toks, job.pre_pos, job.next_pos = prefill_plan(job.token_array(), job.kept, job.positions)
        job.progress("sparse_prefill", 0, len(job.pre_toks))
        resident = self._resident_prefix(job)
        job.offset = 0
        cache = eng.prefix_cache()
        full = job.mode == "baseline" and cache is not None and getattr(job.drafter, "observe", None) is None
        other, copied = self._other_slot_prefix(job) if full else (-1, 0)
        local = max(resident, copied)
        # the host cache is looked up only when a slot's prefix qualifies (one lookup per set-up)
        in_slots = full and local >= cache.min_reuse and local >= self._host_prefix(job, cache)
        self._before_reuse(job, resident if in_slots and resident >= copied else 0)
        if in_slots and resident >= copied:
            # the slot still holds this prompt's first `resident` tokens: keep them, prefill the rest
            self.ctx.seq_rm(job.slot, resident, -1)
            job.prefix_use = PrefixUse(hit=True, reused_tokens=resident, from_slot=True)
            job.offset = resident
            self.slot_prefix_hits += 1
        elif in_slots:
            # another slot holds more of it: copy that slot's KV stream on the device (llama.cpp copies
            # whole streams, at the next llama_decode, which this job's first prefill chunk is part of
            # or follows), then drop the cells past the shared prefix (the other job's answer, or
            # the rest of another prompt)
            self.ctx.seq_cp(other, job.slot)
            self.ctx.seq_rm(job.slot, copied, -1)
            job.prefix_use = PrefixUse(hit=True, reused_tokens=copied, from_other_slot=True)
            job.offset = copied
            self.slot_copy_hits += 1
        elif full:
            # a full prefill (tokens 0..n-1 in order): the longest cached prefix goes into this slot's
            # sequence and the prefill starts after it; the whole prompt is saved when it is prefilled
            self.ctx.seq_rm(job.slot, -1, -1)
            job.prefix_use = PrefixUse()
            job.offset = cache.restore(self.ctx, job.slot, job.scope, job.token_array(), job.prefix_use)
            job.timings["cache_restore"] += job.prefix_use.restore_ms
        else:
            self.ctx.seq_rm(job.slot, -1, -1)
        job.stage = "prefill"
        if job.group is not None:
            job.timings["group_wait"] = (t0 - job.t_group) * 1000.0
        job.engine_ms["sparse_prefill"] += (_now() - t0) * 1000.0
        job.ft["setup"] = job.ft.get("setup", 0.0) + _now() - t0

    def _auto_group(self, job: _Job) -> dict:
        """Mode auto's rule 1a (engine/policy/auto.py), as `prepare`'s keywords: `group`, how many questions about
        this job's stored document this loop serves as one group-sparse prefill, this one included — the
        caller's count (a group claim, whose members may not all have reached the loop yet) or the
        groupable mates admitted now, whichever is larger; `grouped_before`, whether earlier questions
        about it ran as a group here. Nothing where no group can form (group-sparse off, one slot, a
        drafter or option that groups refuse, not mode auto, not a stored document)."""
        if not (self.group_sparse and job.reused_document and job.params.mode == "auto" and groupable(job)):
            return {}
        pending, ready = mates(job, self._active)
        return {"group": max(job.group_hint, 1 + len(pending) + len(ready)),
                "grouped_before": job in self.grouped_documents}

    def _join_or_wait(self, job: _Job, t0: float) -> bool:
        """A scored specprefill job about to set up (serving_group.py): wait while a mate (same
        document) is still being scored (False); else form a group with the scored mates. True: this
        job sets up now (alone, or as the group's first member, which prefills head + union)."""
        pending, ready = mates(job, self._active)
        if pending:
            job.group_pending = pending
            job.t_group = job.t_group or t0
            return False
        job.group_pending = []
        if not ready:
            return True
        members = [m for m in self._active if m is job or m in ready]  # admission order: the oldest first
        form_group(members)
        self.groups_formed += 1
        self.grouped_documents.add(job)
        for m in members:
            m.group_pending = []
            m.t_group = m.t_group or t0
            if m is not members[0]:
                m.stage = "group"
        return job is members[0]

    def _copy_union(self, job: _Job, source: _Job, t0: float) -> None:
        """A group member set up on another member's head + union: that slot's KV stream copied on the
        device, the source's own tail and answer removed, and only this job's tail left to prefill."""
        group = job.group
        job.drafter = self.engine.drafter_for(job.params, job.prompt, scored=True, seq=job.slot)
        job.progress("sparse_prefill", 0, 1)
        self._resident_prefix(job)  # forgotten: the slot's cells are replaced
        self._before_reuse(job, 0)
        self.ctx.seq_rm(job.slot, -1, -1)
        self.ctx.seq_cp(source.slot, job.slot)  # the whole KV stream, at the next llama_decode
        self.ctx.seq_rm(job.slot, group.tail_from, -1)
        job.offset, job.group_copied_from = group.n_shared, source.slot
        self.group_copies += 1
        job.timings["group_wait"] = (t0 - job.t_group) * 1000.0
        job.stage = "prefill"
        job.engine_ms["sparse_prefill"] += (_now() - t0) * 1000.0

    def _speculator_shared(self) -> bool:
        """A live job drafts with the speculator (`draft model`: it decodes on the scorer's context),
        so scoring stays on this thread, between its batches (`_interleave`)."""
        return any(_drafts_with_speculator(j) for j in self._active)

    def _score_beside(self, job: _Job) -> None:
        """Hand the job's scoring and selection to the score thread; the loop goes on with the
        target's batches and collects the outcome at a later step (`_collect_scored`)."""
        eng = self.engine
        job.stage = "scoring"
        job.stop = stop = Stop(cancelled=lambda: job.cancel_exc is not None)

        def work():
            with running(stop):
                t0 = _now()
                kept, scores = eng.select(job.prompt, job.params, job.timings, job.spec, job.progress,
                                          scope=job.scope, reused_document=job.reused_document)
                return kept, scores, (_now() - t0) * 1000.0

        self.scoring.start(job, work)

    def _collect_scored(self) -> None:
        """A job the score thread has finished goes on to set-up (or is dropped with its error)."""
        got = self.scoring.take() if self.scoring is not None else None
        if got is None:
            return
        job, fut = got
        job.stop = None
        if job not in self._active or job.cancel_exc is not None:
            return  # dropped meanwhile, or dropped at this step
        try:
            job.kept, job.doc_scores, ms = fut.result()
        except BaseException as e:
            self._drop(job, e)
            return
        job.engine_ms["score"] += ms
        job.end_phase("score", _now())
        job.stage = "setup"

    def _pick_slot(self, job: _Job) -> int:
        """The free slot for `job`: the one whose resident prompt it would keep nearly all of (its
        document's next question), else an empty one, else the one whose resident shares the longest
        prefix with its prompt (at least the cache's min_reuse tokens), else the one whose resident was
        left there first. (An empty slot before a partial share: prompts share their template's first
        tokens, and taking another document's slot for those would evict that document.)"""
        best, best_n = -1, 0
        for slot in self._free:
            n = self._shared(slot, job)
            if n > best_n:
                best, best_n = slot, n
        cache = self.engine.prefix_cache()
        if best >= 0 and cache is not None and cache.covered(self._resident[best][1].size, best_n):
            return best
        empty = [slot for slot in self._free if slot not in self._resident]
        if empty:
            return empty[0]
        if best >= 0 and cache is not None and best_n >= cache.min_reuse:
            return best
        return min(self._free, key=lambda slot: self._resident_at.get(slot, 0.0))  # the least recently used

    def _resident_prefix(self, job: _Job, forget: bool = True) -> int:
        """How many of `job`'s prompt tokens its slot's resident prompt holds (at most n-1: the last
        token is decoded again for its logits). `forget`: the resident is forgotten here either way
        (at setup: the slot's cells past that prefix are about to be removed or replaced). 0 when the
        slot's cells are not the resident's any more (checked against llama.cpp's own position count)."""
        n = self._shared(job.slot, job)
        if forget:
            self._resident.pop(job.slot, None)
        return n

    def _shared(self, slot: int, job: _Job) -> int:
        """Tokens of `job`'s prompt (at most n-1) that `slot`'s resident prompt holds: 0 for another
        tenant's, or when the slot's cells are no longer the resident's (llama.cpp's position count)."""
        res = self._resident.get(slot)
        if res is None or job.prompt is None or res[0] != job.scope or self.ctx.seq_pos_max(slot) != res[1].size - 1:
            return 0
        return job.shares(res[1])

    def _other_slot_prefix(self, job: _Job) -> tuple[int, int]:
        """(slot, n): the other slot whose cells 0..n-1 hold the longest prefix of `job`'s prompt (at
        most n-1 tokens), in order: a same-tenant job that finished its full prefill and decodes there,
        or a free slot's resident prompt; (-1, 0) when there is none or the slots share one KV stream
        (no residents then: module doc, step 3)."""
        best, best_n = -1, 0
        if not self._keep_residents or job.prompt is None or self.slots < 2:
            return best, best_n
        for other in self._active:
            if (other is job or other.slot < 0 or other.stage != "decode" or other.prefix_use is None
                    or other.scope != job.scope):
                continue
            n = job.shares(other.token_array())
            if n > best_n:
                best, best_n = other.slot, n
        for slot in self._free:
            if slot != job.slot:
                n = self._shared(slot, job)
                if n > best_n:
                    best, best_n = slot, n
        return best, best_n

    def _host_prefix(self, job: _Job, cache) -> int:
        found = cache.lookup(job.scope, job.token_array())
        return found[1] if found else 0

    def _preparable(self, job: _Job) -> bool:
        if job.stage == "group":  # a member: once a member holds head + union, or none computes it any more
            return job.group.holder(job) is not None or job.group.computing(job) is None
        if job.stage not in ("tokenize", "score", "setup"):
            return False
        if job.group_pending and still_pending(job):
            return False  # a mate about the same document is still being scored
        if self.scoring is not None and self.scoring.busy and (
                job.stage == "score" or (job.stage == "setup" and _drafts_with_speculator(job))):
            return False  # the speculator's contexts are the score thread's until it is done
        if job.wait_for is not None:
            if job.wait_for.stage == "prefill" and job.wait_for in self._active:
                return False
            job.wait_for = None  # its prompt is in its slot now (or it is gone): look again
        return True

    def _prefix_owner(self, job: _Job) -> _Job | None:
        """A job prefilling (now, through the prompt cache) a prompt that shares a longer prefix with
        this full-prefill job's prompt than the cache holds: this one sets up after that one's prefill
        and then copies its cells from its slot, rather than computing the same cells a second time (several
        questions about one document arriving together). Prefill chunks run one job at a time anyway
        (`_batch`), so the wait costs the waiting job no time to first token."""
        cache = self.engine.prefix_cache()
        if cache is None or job.mode != "baseline" or job.params.draft in ("mtp", "eagle3"):
            return None
        found = cache.lookup(job.scope, job.token_array())
        have = found[1] if found else 0
        for other in self._active:
            if other is job or other.stage != "prefill" or other.prefix_use is None or other.scope != job.scope:
                continue
            shared = job.shares(other.token_array())
            if shared >= cache.min_reuse and shared > have + cache.min_reuse:
                return other
        return None

    def _interleave(self, busy=None) -> None:
        """One decode batch of the decoding jobs, run from inside another job's scoring: after each
        llama_decode call of a window's prefill (`busy`: the speculator context holding the window's
        partial KV) and between two window groups (`busy` None). The scorer's capture is not armed at
        either point, and these batches run on the target's context only, so their inter-token gap is
        bounded by one scoring call rather than a window or a whole document's scoring. No prefill
        chunk rides along (fill=False): a job being prefilled waits for the scoring to end."""
        for job in list(self._active):
            if job.cancel_exc is not None and job.stage == "decode":
                self._drop(job, job.cancel_exc)
        if any(j.stage == "decode" and not self._drafts_on(j, busy) for j in self._active):
            self._batch(fill=False, busy=busy)

    @staticmethod
    def _drafts_on(job: _Job, ctx) -> bool:
        """Whether `job`'s drafter decodes on `ctx` (a context a scoring window is being prefilled into).

        The model drafter drafts on the speculator context's sequence 0 and re-synchronises it with its
        job's history first (drafters.ModelDrafter._sync clears the context when its cells do not match
        `cached_tokens`, else removes them from the first token that differs from its view), so a
        proposal between two calls of a window's prefill would wipe the window's partial KV (without
        this check the scorer's next call fails: tests/test_serving_interleave.py, the model-drafter
        test with n_parallel 1). Such a job sits out those batches and keeps the one between window groups (as before),
        rather than being decoded there without a draft: that would make the shapes of its verify
        batches (F16 weights take another kernel for 1 row than for 2+) and, when it samples, its
        random draws depend on when other jobs score, so its output would differ from the job alone.
        When the windows are prefilled in the scorer's parallel-streams context (n_parallel > 1) its
        drafting context is not that one, and it decodes between those calls too; nor is it with
        several slots, where each drafts on its slot's own context (Engine.draft_cache)."""
        return ctx is not None and getattr(job.drafter, "ctx", None) is ctx

    # the target batch of one step
    def _batch(self, fill: bool = True, busy=None) -> None:
        """One step's target batch (module doc, step 4); from `_interleave`: decode rows only, without
        the jobs that draft on `busy`."""
        decoding = [j for j in self._active if j.stage == "decode" and not self._drafts_on(j, busy)]
        parts: list[tuple[_Job, list[int], list[int], list[bool], float]] = []  # job, toks, pos, logits, plan s
        for job in decoding:
            t0 = _now()
            try:
                toks, pos = job.dec.plan()
            except BaseException as e:
                self._drop(job, e)
                continue
            parts.append((job, toks, pos, [True] * len(toks), _now() - t0))
        room = self.ctx.n_batch - sum(len(p[1]) for p in parts)
        filling = next((j for j in self._active if j.stage == "prefill"), None) if fill else None
        fill = None
        if filling is not None and room > 0:
            n = len(filling.pre_toks)
            a = filling.offset
            b = min(a + min(self.prefill_chunk, room), n)
            if self.invariant and 0 < n - b < INVARIANT_ROWS + 1 and n - a <= room:
                b = n  # no tail of < 8 rows: it would run other kernels than the one batch of a job alone
            mask = [False] * (b - a)
            mask[-1] = b == n
            fill = (filling, filling.pre_toks[a:b].tolist(), filling.pre_pos[a:b].tolist(), mask, 0.0)
        # by sequence id: with one KV stream per slot llama.cpp cuts a batch into micro-batches of
        # consecutive sequence ids (split_equal), so slot order keeps the decode rows in one of them
        if fill is not None and not self.invariant:  # one batch with the decode rows
            parts.append(fill)
            fill = None
        parts.sort(key=lambda part: part[0].slot)
        for group in self._groups(parts, fill):
            for (job, toks, pos, mask, plan_s), base, dt in self._decode_parts(group):
                self._absorb(job, toks, base, plan_s + dt)

    def _groups(self, parts, fill):
        """The llama_decode calls of one step: everything in one batch; in batch-invariant mode decode
        rows in batches of at most `invariant_rows` rows (0: one job's rows per batch), so a token's
        logits do not depend on the others decoded with it, and the prefill chunk in a batch of its own."""
        if not self.invariant:
            return [parts + ([fill] if fill else [])] if parts or fill else []
        groups, cur, rows = [], [], 0
        for part in parts:
            if cur and rows + len(part[1]) > self.invariant_rows:
                groups.append(cur)
                cur, rows = [], 0
            cur.append(part)
            rows += len(part[1])
        if cur:
            groups.append(cur)
        if fill:
            groups.append([fill])
        return groups

    def _absorb(self, job: _Job, toks: list[int], base: int, seconds: float) -> None:
        """After the batch holding this job's rows: verify and emit (decode), or move its prefill on."""
        phase = "decode" if job.stage == "decode" else "sparse_prefill"
        t0 = _now()
        save_s = 0.0  # a prompt-cache save after the first token: the decode phase's time
        try:
            if job.stage == "decode":
                job.dec.absorb(self.ctx, base)
            else:
                job.offset += len(toks)
                job.ft["fill"] = job.ft.get("fill", 0.0) + seconds
                job.progress("sparse_prefill", job.offset, len(job.pre_toks))  # i/n after each prefill chunk
                if job.offset >= len(job.pre_toks):
                    # the first token first (sampled from this batch's logits and published by the
                    # job's stream thread while the save copies the KV out); then the prompt's KV,
                    # which the first token has not entered yet (`_prompt_prefilled`)
                    self._start_decode(job, base + len(toks) - 1)
                    t_save = _now()
                    self._prompt_prefilled(job)
                    save_s = _now() - t_save
        except BaseException as e:
            job.engine_ms[phase] += (seconds + _now() - t0) * 1000.0
            self._drop(job, e)
            return
        job.engine_ms[phase] += (seconds + _now() - t0 - save_s) * 1000.0
        job.engine_ms["decode"] += save_s * 1000.0
        if job.stage == "decode" and job.dec.done:
            self._finish(job)

    def _decode_parts(self, parts):
        """Decode the parts in one batch; returns [(part, its first row, seconds)] to absorb. If the
        batch fails, each part is rolled back and decoded (and absorbed) alone: only a part whose own
        decode fails is dropped."""
        toks: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        mask: list[bool] = []
        bases = []
        for job, t, p, m, _ in parts:
            bases.append(len(toks))
            toks += t
            pos += p
            seqs += [job.slot] * len(t)
            mask += m
        t0 = _now()
        try:
            self._fault_check(parts)
            self.ctx.decode(toks, pos, seq_ids=seqs, logits=mask)
            dt = _now() - t0
            return [(part, base, dt) for part, base in zip(parts, bases)]
        except DecodeError as e:
            if len(parts) == 1:
                self._rollback(parts[0])
                self._drop(parts[0][0], e)
                return []
            log.warning("engine loop: a batch of %d jobs failed (%s); decoding each alone", len(parts), e)
        for part in parts:
            self._rollback(part)
        for part in parts:
            job, t, p, m, plan_s = part
            t0 = _now()
            try:
                self._fault_check([part])
                self.ctx.decode(t, p, seq_ids=job.slot, logits=m)
            except DecodeError as e:
                self._rollback(part)
                self._drop(job, e)
                continue
            # absorbed before the next part's decode replaces the logits
            self._absorb(job, t, 0, plan_s + _now() - t0)
        return []

    def _rollback(self, part) -> None:
        job, pos = part[0], part[2]
        if pos:
            self.ctx.seq_rm(job.slot, int(min(pos)), -1)

    def _fault_check(self, parts) -> None:
        for job, *_ in parts:
            if job.faulty and job.stage == "decode" and len(job.dec.out) >= 3:
                raise DecodeError("llama_decode returned -1 (error): injected by the loop's `fails` test seam for this job")

    def _prompt_prefilled(self, job: _Job) -> None:
        """After a full prefill through the prompt cache: its record, and the prompt's KV saved now or, where
        slots keep their residents, owed until its slot is reused ("Prompt saves"). Called after
        `_start_decode`: the first token is sampled and emitted but not yet decoded, so the slot still holds
        exactly the prompt."""
        use = job.prefix_use
        if use is None:
            return
        use.prefilled_tokens = len(job.pre_toks) - use.reused_tokens
        cache = self.engine.prefix_cache()
        if self._keep_residents and cache.store.enabled:
            # owed: a prompt the cache does not cover, or one that kept an unsaved resident's cells
            job.owes_save = job.owes_save or not (use.hit and cache.covered(job.prompt.n, use.reused_tokens))
            use.save_deferred = job.owes_save
        else:
            cache.save(self.ctx, job.slot, job.scope, job.prompt.tokens, use)
        job.spec.cache["target"] = use.as_dict()
        job.spec.cache["bytes_restored"] += use.bytes_restored

    def _save_residents_to_disk(self) -> None:
        """At close, with a disk copy of the cache (SPECQ_CACHE_DIR): the residents it lacks, so that they
        outlive the process as eagerly saved prompts did. (Without one, saving into memory now is pointless.)"""
        cache = self.engine.prefix_cache() if self._unsaved else None
        if cache is None or getattr(cache.store, "disk", None) is None:
            return
        for slot, (scope, tokens) in sorted(self._unsaved.items()):
            try:
                if self.ctx.seq_pos_max(slot) == tokens.size - 1:
                    cache.save(self.ctx, slot, scope, tokens.tolist(), PrefixUse())
            except Exception:  # noqa: BLE001 - a cache is an optimisation; the loop is closing either way
                log.warning("engine loop: could not save slot %d's prompt at close", slot, exc_info=True)
        self._unsaved.clear()

    def _before_reuse(self, job: _Job, keep: int) -> None:
        """`job` is about to replace its slot's cells from `keep` on (0: all of them). If they hold a resident
        prompt the prompt cache lacks, it is saved first — unless the job keeps nearly all of it, and then
        the job owes the save instead (its own prompt holds that prefix)."""
        owed = self._unsaved.pop(job.slot, None)
        if owed is None:
            return
        scope, tokens = owed
        cache = self.engine.prefix_cache()
        if keep > 0 and cache.covered(tokens.size, keep):
            job.owes_save = True
            return
        if self.ctx.seq_pos_max(job.slot) != tokens.size - 1:
            return  # the cells are not that prompt's any more: nothing to save
        cache.save(self.ctx, job.slot, scope, tokens.tolist(), PrefixUse())
        self.saves_on_reuse += 1

    def _start_decode(self, job: _Job, row: int) -> None:
        eng, p = self.engine, job.params
        t0 = _now()
        logits = self.ctx.logits_row(row)
        n_draft = eng.draft_budget(p, job.drafter, job.warnings)
        job.text, on_token, accept = eng.text_callbacks(p, job.progress, job.on_text, job.first)
        job.stage = "decode"
        job.dec = SeqDecoder(eng.target, job.prompt.tokens, logits, job.next_pos, max_tokens=p.max_tokens,
                             sampler=Sampler(p.temperature, p.top_k, p.top_p, p.seed), n_batch=self._draft_rows,
                             drafter=job.drafter, n_draft=n_draft, draft_min=p.draft_min, progress=on_token,
                             accept=accept, seq=job.slot, ignore_eos=p.ignore_eos, guide=job.guide)
        job.end_phase("sparse_prefill", _now())  # the first token (sampled above) is the prefill's
        job.timings["sparse_prefill"] = max(0.0, job.span_ms["sparse_prefill"] - job.timings.get("cache_restore", 0.0))
        self._first_token_parts(job, t0)

    @staticmethod
    def _first_token_parts(job: _Job, t_sample: float) -> None:
        """`ft_*` (module doc): its first token was emitted during the sampling that began at t_sample."""
        t_first = job.first[0] if job.first else _now()
        ms = {"ft_tokenize": job.t_queued - job.t_submit, "ft_admit": job.t_admit - job.t_queued - job.ft.get("pick", 0.0),
              **{f"ft_{k}": job.ft.get(k, 0.0) for k in ("pick", "decide", "setup", "fill")},
              "ft_sample": t_first - t_sample}
        ms["ft_between"] = (t_first - job.t_submit) - sum(ms.values())
        job.timings.update({k: round(v * 1000.0, 3) for k, v in ms.items()})

    def _finish(self, job: _Job) -> None:
        t_end = _now()
        job.end_phase("decode", t_end)
        tm = job.timings
        # in the submitting thread + the loop's step
        tm["tokenize"] = (job.t_queued - job.t_submit) * 1000.0 + job.span_ms["tokenize"]
        if job.mode == "specprefill":
            tm["score"] = max(0.0, job.span_ms["score"] - tm.get("select", 0.0))
        tm["decode"] = job.span_ms["decode"]
        tm["ttft"] = ((job.first[0] if job.first else t_end) - job.t_submit) * 1000.0
        tm["total"] = (t_end - job.t_submit) * 1000.0
        tm["slot_wait"] = (job.t_admit - job.t_queued) * 1000.0
        if job.guide is not None:  # part of `decode` (and of `ttft` for the first token)
            tm["grammar"] = job.guide.ms
        wait = 0.0
        for ph in PHASES:
            tm[f"{ph}_engine"] = round(job.engine_ms[ph], 3)
            wait += max(0.0, job.span_ms[ph] - job.engine_ms[ph])
        tm["interleave_wait"] = wait
        self.interleave_wait_ms_total += wait
        self._release(job, keep_prompt=job.prefix_use is not None)
        try:
            res = self.engine.finish_result(job.document, job.prompt, job.params, job.dec.result(), job.text,
                                            job.on_text, tm, job.spec, job.warnings, job.kept, job.doc_scores)
            if job.group is not None:
                res.group = job.group.record(job)
        except BaseException as e:
            job.future.set_exception(e)
            return
        self.jobs_finished += 1
        job.future.set_result(res)

    def _release(self, job: _Job, keep_prompt: bool = False) -> None:
        """Free the job's slot. keep_prompt (a finished full prefill, cells 0..n-1 = its prompt): only
        the answer's cells go, and the prompt stays resident for a later job with the same prefix."""
        if job in self._active:
            self._active.remove(job)
        if job.slot >= 0:
            self._resident.pop(job.slot, None)
            self._unsaved.pop(job.slot, None)
            keep = keep_prompt and self._keep_residents
            try:
                self.ctx.seq_rm(job.slot, job.prompt.n if keep else -1, -1)
                if keep:
                    self._resident[job.slot] = (job.scope, job.token_array())
                    self._resident_at[job.slot] = _now()
                    if job.owes_save:
                        self._unsaved[job.slot] = self._resident[job.slot]
            except Exception:  # pragma: no cover - a context that cannot remove cells is beyond repair
                log.exception("engine loop: could not clear slot %d", job.slot)
            self._free.append(job.slot)
            self._free.sort()
            job.slot = -1

    def _drop(self, job: _Job, exc: BaseException) -> None:
        if job.stop is not None:  # on the score thread: its scoring ends at its next llama_decode
            job.stop.cancel(error=exc)
        self._release(job)
        if not job.future.done():
            job.future.set_exception(exc)

    def _cells(self) -> int:
        n = 0
        for job in self._active:
            if job.stage == "decode" and job.dec is not None:
                n += len(job.kept) + len(job.dec.out)
            elif job.stage == "prefill":
                n += job.offset
        return n

    def stats(self) -> dict[str, Any]:
        """What the heartbeat reports (and /metrics shows)."""
        return {"slots": self.slots, "slots_busy": self.busy, "slots_waiting": self.waiting,
                "kv_cells_used": self.kv_cells_used, "kv_cells": self.ctx.n_ctx,
                "interleave_wait_ms_total": round(self.interleave_wait_ms_total, 1),
                "slot_wait_ms_total": round(self.slot_wait_ms_total, 1), "jobs_finished": self.jobs_finished,
                "slot_prefix_hits": self.slot_prefix_hits, "slot_copy_hits": self.slot_copy_hits,
                "slots_resident": len(self._resident),
                "scored_beside": self.scoring.jobs_scored if self.scoring is not None else 0,
                "groups_formed": self.groups_formed, "group_copies": self.group_copies}


__all__ = ["ServingEngine", "JobHandle", "Drained", "LoopSeams"]
