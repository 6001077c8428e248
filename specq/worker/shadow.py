"""Shadow checks in the worker (SPECQ_SHADOW_RATE; the policy is engine/policy/shadow.py).

After a job is saved, `offer` keeps it as the pending check when the policy picks it (mode auto ran
one-off specprefill, greedy, sampled at the rate). When the job's slot is released and no other job is
live in this process (`idle`), a thread answers it again in baseline — on the single-job engine with a
`Stop` of its own, or through the engine loop (a handle it can cancel) with serving slots — and stores
the outcome: agree or disagree (storage/shadow.py). The moment this process claims a job, `preempt`
trips that Stop (it cuts a running llama_decode) or cancels the handle, waits for the thread to end,
and the check is stored as `cancelled`: real work waits only for the cut, never for a shadow's answer.

At most one check runs at a time, and a newer pick replaces a pending one: the checks take idle time,
not a queue of their own. The baseline run uses its own cache scope (`SCOPE`), so its saved prompt is
never a prompt-cache hit for a real job (which would turn mode auto's later answers about the same
document into baseline).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from ..contracts import RunCancelled
from ..engine.llama.stop import Stop
from ..engine.options import RunParams
from ..engine.policy import shadow as policy
from ..storage import db, shadow as store

log = logging.getLogger("specq.worker")

#: the cache scope of shadow runs (real jobs' scopes are tenants)
SCOPE = "specq:shadow"
#: longest wait for a cancelled shadow run to end before a real job goes on anyway (engine loop only;
#: the single-job engine is never shared, so there the claim waits for the thread)
LOOP_CANCEL_WAIT_S = 5.0


@dataclass
class Pending:
    job_id: str
    text: str
    params: RunParams
    source: dict[str, Any]
    answer: str
    tokens: list[int]
    positions: str


class ShadowRunner:
    """One worker process's shadow checks (module doc). `engine`: the loaded Engine; `serving`: the engine
    loop, or None (single-job engine, run in the check's thread)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.engine = None
        self.serving = None
        self._lock = threading.Lock()
        self._pending: Pending | None = None
        self._thread: threading.Thread | None = None
        self._stop: Stop | None = None
        self._handle = None
        #: set once the running check no longer uses the engine (its answer is in, or it was cut): what a
        #: claim waits for; the check's store write may still follow
        self._engine_free = threading.Event()
        self._engine_free.set()
        #: checks started / cancelled by this process (its log and tests; /metrics reads the store)
        self.started = 0
        self.cancelled = 0

    def bind(self, engine, serving) -> None:
        self.engine, self.serving = engine, serving

    def offer(self, job_id: str, text: str, params: RunParams, source: dict[str, Any], result) -> bool:
        """After `job_id` was saved: keep it as the pending check if the policy picks it; whether it did."""
        if self.rate <= 0 or self.engine is None:
            return False
        spec = result.spec
        if not (policy.eligible(params.mode, spec.mode, spec.reason, params.temperature)
                and policy.sampled(job_id, self.rate)):
            return False
        if params.keep is None:  # the job set no keep: its key is the keep that ran (a certified one, or the default)
            params = replace(params, keep=spec.keep)
        with self._lock:
            self._pending = Pending(job_id, text, params, dict(source), result.text, list(result.tokens), spec.positions)
        return True

    def idle(self) -> None:
        """No job is live in this process: start the pending check, if any and none runs."""
        with self._lock:
            if self._pending is None or (self._thread is not None and self._thread.is_alive()):
                return
            p, self._pending = self._pending, None
            self._stop = Stop()
            self._handle = None
            self._engine_free.clear()
            self._thread = threading.Thread(target=self._check, args=(p, self._stop), name=f"specq-shadow-{p.job_id}",
                                            daemon=True)
            self.started += 1
            self._thread.start()
        log.info("job %s: shadow check started (baseline, while idle)", p.job_id)

    def preempt(self) -> bool:
        """Real work was claimed: drop the pending check, cancel a running one and wait until it no longer
        uses the engine; whether one was running."""
        with self._lock:
            self._pending = None
            thread, stop, handle = self._thread, self._stop, self._handle
        if thread is None or not thread.is_alive() or self._engine_free.is_set():
            return False
        stop.cancel("shadow check: real work arrived")
        if handle is not None:
            handle.cancel(RunCancelled("shadow check: real work arrived"))
        self._engine_free.wait(timeout=LOOP_CANCEL_WAIT_S if self.serving is not None else None)
        return True

    def _check(self, p: Pending, stop: Stop) -> None:
        t0 = time.monotonic()
        try:
            try:
                key = self._key(p)
                outcome = "cancelled"
                base = self._baseline(p, stop)
                outcome = "agree" if policy.agrees(p.answer, base.text, p.tokens, base.tokens) else "disagree"
            except RunCancelled:
                with self._lock:
                    self.cancelled += 1
            finally:
                self._engine_free.set()
            ms = (time.monotonic() - t0) * 1000.0
            with db.session() as s:
                store.record(s, job_id=p.job_id, key_id=policy.key_id(key), key=key.as_dict(), outcome=outcome,
                             shadow_ms=ms)
            log.info("job %s: shadow check %s in %.0f ms", p.job_id, outcome, ms)
        except Exception as e:  # noqa: BLE001 - a check is best effort: the job itself is saved
            log.warning("job %s: shadow check failed (%s: %s)", p.job_id, type(e).__name__, e)

    def _key(self, p: Pending):
        """The job's EvidenceKey, as mode auto made it (engine.evidence_key)."""
        messages, raw = p.source.get("messages"), bool(p.source.get("raw"))
        prompt = self.engine.tokenize_prompt(p.text, p.params, messages=messages, raw=raw)
        shape = "chat" if messages is not None else "completion" if raw else "native"
        return self.engine.evidence_key(prompt, p.params, p.positions, shape)

    def _baseline(self, p: Pending, stop: Stop):
        params = replace(p.params, mode="baseline")
        if self.serving is None:
            return self.engine.run(p.text, params, stop=stop, scope=SCOPE, **p.source)

        def progress(phase: str, done: int, total: int) -> None:
            if stop.cancelled:
                raise RunCancelled("shadow check: real work arrived")

        handle = self.serving.submit(p.text, params, progress, scope=SCOPE, **p.source)
        with self._lock:
            self._handle = handle
        if stop.cancelled:  # preempted between submit and here
            handle.cancel(RunCancelled("shadow check: real work arrived"))
        return handle.result()


__all__ = ["ShadowRunner", "SCOPE"]
