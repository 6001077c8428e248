"""The engine loop in process (specq/engine/serving/loop.py) while one job scores: the decoding jobs get a
decode batch after each of the speculator's llama_decode calls of a scoring window (issue #15), not
only between windows, and nothing that must not change because of it does.

Tiny random-weight models on the CPU, one llama.cpp thread, small calls (CALL tokens) so a window is
several calls. The target runs batch-invariant (as tests/test_serving.py's stack): each job's logits
are then the same whoever shares the loop with it, so "the same text as alone" is exact.

How the tests see the interleaving: every job's progress callback runs on the engine thread, so the
recorded events are in the order the loop did the work. The scoring job reports ("score", g, W) before
window (group) g; a decoding job reports ("decode", ...) per emitted token; with draft none a decode
batch emits exactly one token.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from specq.contracts import RunCancelled  # noqa: E402
from specq.engine.options import RunParams  # noqa: E402
from specq.engine.scoring.scorer import plan_windows  # noqa: E402

from serving_text import CALL, DOC, SHORT, decoder_params, loop_engine, scorer_params  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def loop(tiny_models):
    from specq.engine.serving.loop import ServingEngine

    eng = loop_engine(tiny_models)
    sv = ServingEngine(eng).start()
    yield sv
    sv.close()
    eng.close()


class Events:
    """(job, phase, done, total) in the order the engine thread reported them."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, int, int]] = []
        self.hooks: dict[tuple[str, str], list] = {}

    def progress(self, name: str):
        def report(phase: str, done: int, total: int) -> None:
            self.items.append((name, phase, done, total))
            for fn in self.hooks.get((name, phase), []):
                fn(done, total)
        return report

    def wait(self, name: str, phase: str, n: int = 1, timeout: float = 120.0) -> None:
        t_end = time.monotonic() + timeout
        while sum(1 for e in list(self.items) if e[0] == name and e[1] == phase) < n:
            assert time.monotonic() < t_end, f"{name} never reached {phase}"
            time.sleep(0.005)

    def windows(self, scoring: str) -> list[list[tuple]]:
        """The events between the scoring job's ("score", g, W) and its next score event, per g."""
        idx = [i for i, e in enumerate(self.items) if e[0] == scoring and e[1] == "score"]
        return [self.items[a + 1 : b] for a, b in zip(idx, idx[1:])]


def _decoding(name: str, span: list[tuple]) -> list[tuple]:
    return [e for e in span if e[0] == name and e[1] == "decode"]


def _calls_per_window(eng, doc: str, p: RunParams, *, hit: bool) -> list[int]:
    """The speculator's prefill calls of each window (engine/scoring/scorer.py _prefill_window with a cache): a miss
    prefills head + slice by itself (then saves it), then the question tail; a hit only the tail."""
    prompt = eng.tokenize_prompt(doc, p)
    scorer = eng.scorer()
    ct = scorer.ctx.call_tokens
    h, t = len(prompt.head), len(prompt.tail)
    calls = []
    for a, b in plan_windows(len(prompt.document), scorer.window_tokens(prompt, p.lookahead, p.window)):
        prefix, n = h + (b - a), h + (b - a) + t
        calls.append((0 if hit else math.ceil(prefix / ct)) + math.ceil((n - 1 - prefix) / ct))
    return calls


def _together(loop, decoders: dict[str, tuple[str, RunParams]], scoring: tuple[str, RunParams], ev: Events,
              handles: dict | None = None) -> dict:
    """Start the decoding jobs, wait until each decodes, then submit the scoring job ("B"); their
    handles go into `handles` as they are submitted (a callback on the engine thread may look there)."""
    handles = {} if handles is None else handles
    for name, (doc, p) in decoders.items():
        handles[name] = loop.submit(doc, p, ev.progress(name))
        ev.wait(name, "decode")
    handles["B"] = loop.submit(scoring[0], scoring[1], ev.progress("B"))
    return handles


def test_scorer_calls_between_calls_after_each_prefill_call_with_capture_disarmed(loop):
    """The hook's contract (engine/scoring/scorer.py "Between calls"): after every llama_decode call of a window's
    prefill, with the window's partial KV in the context it is handed and the capture not armed; the
    scores are those of a run without it (miss and hit alike)."""
    eng = loop.engine
    p = scorer_params()
    prompt = eng.tokenize_prompt(DOC, p)
    scorer = eng.scorer()
    seen = []

    def between(ctx):
        assert not (scorer.capture.want_q or scorer.capture.want_k)
        seen.append((ctx is scorer.ctx, ctx.seq_pos_max(0)))

    kw = dict(scorer=p.scorer, lookahead=p.lookahead, pool=p.pool, window=p.window)
    with loop._cond:  # the loop thread idles (nothing submitted): the scorer is ours meanwhile
        eng.cache_store.clear()
        plain = scorer.score(prompt, cache=eng.spec_cache(), **kw).scores
        eng.cache_store.clear()
        miss = scorer.score(prompt, cache=eng.spec_cache(), between_calls=between, **kw)
        n_miss = len(seen)
        hit = scorer.score(prompt, cache=eng.spec_cache(), between_calls=between, **kw)
    assert n_miss == sum(_calls_per_window(eng, DOC, p, hit=False)) and miss.windows >= 3
    assert len(seen) - n_miss == sum(_calls_per_window(eng, DOC, p, hit=True))
    assert all(same for same, _ in seen)
    # the window's cells grow by at most one call between two hooks (a restore puts a prefix at once)
    first = seen[0][1]
    assert 0 < first + 1 <= CALL
    assert (miss.scores == plain).all() and (hit.scores == plain).all()
    assert scorer._between is None  # not kept past score()


def test_a_decoding_job_gets_a_batch_after_every_scoring_call_within_a_window(loop):
    """Issue #15: one job decoding while another scores: within each scoring window (between two of
    its progress events) the decoding job gets at least one token per speculator call of that window
    (before: none inside a window, one between two windows). Both jobs return what they return alone,
    and the scoring job's kept tokens are the same on a speculator-cache miss and hit."""
    eng = loop.engine
    a_params, b_params = decoder_params(), scorer_params()
    alone_a = loop.run(SHORT, a_params)
    eng.cache_store.clear()
    alone_b = loop.run(DOC, b_params)

    for hit in (False, True):  # the second pass restores the window prefixes the first one saved
        if not hit:
            eng.cache_store.clear()
        ev = Events()
        h = _together(loop, {"A": (SHORT, a_params)}, (DOC, b_params), ev)
        rb, ra = h["B"].result(120), h["A"].result(120)
        calls = _calls_per_window(eng, DOC, b_params, hit=hit)
        spans = ev.windows("B")
        assert len(spans) == len(calls) == rb.spec.windows >= 3
        got = [len(_decoding("A", span)) for span in spans]
        # window g: one token after each of its calls (+ one batch between windows g-1 and g)
        assert all(n >= c >= 2 for n, c in zip(got, calls)), (got, calls)
        assert sum(got) >= sum(calls) > rb.spec.windows
        assert ra.text == alone_a.text and ra.tokens == alone_a.tokens
        assert rb.text == alone_b.text and rb.kept_indices == alone_b.kept_indices
        cache = rb.spec.cache["speculator"]
        assert cache["hits"] == (rb.spec.windows if hit else 0), cache
        # the other job's batches are interleave_wait of the scoring job, not speculator time
        assert rb.timings_ms["score_engine"] < rb.timings_ms["score"] + rb.timings_ms["select"]
        assert rb.timings_ms["interleave_wait"] > 0


def test_cancels_land_between_two_scoring_calls(loop):
    """A cancel of the scoring job lands at its next call (here: within its first window), one of a
    decoding job at the next batch; the other job goes on unharmed, and the scorer scores the next
    job as before (its context is cleared per window)."""
    eng = loop.engine
    a_params, b_params = decoder_params(), scorer_params()
    alone_a = loop.run(SHORT, a_params)
    eng.cache_store.clear()
    alone_b = loop.run(DOC, b_params)

    # the scoring job cancelled from the decoding job's 3rd token after scoring began
    eng.cache_store.clear()
    ev = Events()
    box: dict = {}
    counted, at_cancel = [0], []

    def on_token(done, total):
        scored = [e for e in ev.items if e[0] == "B" and e[1] == "score"]
        if "B" in box and scored:
            counted[0] += 1
            if counted[0] == 3:
                at_cancel.append(len(scored))
                box["B"].cancel()

    ev.hooks[("A", "decode")] = [on_token]
    h = _together(loop, {"A": (SHORT, a_params)}, (DOC, b_params), ev, box)
    with pytest.raises(RunCancelled):
        h["B"].result(120)
    assert h["A"].result(120).text == alone_a.text
    scored = [e for e in ev.items if e[0] == "B" and e[1] == "score"]
    # cut inside the window it was cancelled in: no later window began (nor selection)
    assert at_cancel and len(scored) == at_cancel[0] < scored[0][3], (at_cancel, scored)
    assert not any(e[0] == "B" and e[1] != "score" for e in ev.items if e[1] != "tokenize")
    assert loop.run(DOC, b_params).kept_indices == alone_b.kept_indices  # nothing of it stayed behind

    # the decoding job cancelled from inside the other's scoring window: no token of it after that
    ev = Events()
    stop = threading.Event()

    def cancel_a(done, total):
        if any(e[0] == "B" and e[1] == "score" for e in ev.items) and not stop.is_set():
            stop.set()
            box["A"].cancel()

    box = {}
    ev.hooks[("A", "decode")] = [cancel_a]
    h = _together(loop, {"A": (SHORT, a_params)}, (DOC, b_params), ev, box)
    assert h["B"].result(120).kept_indices == alone_b.kept_indices
    with pytest.raises(RunCancelled):
        h["A"].result(120)
    first_b = next(i for i, e in enumerate(ev.items) if e[0] == "B" and e[1] == "score")
    assert len(_decoding("A", ev.items[first_b:])) == 1  # the token whose callback cancelled it
    assert loop.live() == 0


@pytest.mark.parametrize("n_parallel", [1, 2])
def test_model_drafting_jobs_during_scoring_return_their_text_alone(tiny_models, n_parallel):
    """draft=model with several slots drafts on its slot's own speculator context (Engine.draft_cache,
    issue 44 item 10), not on the one the scorer prefills its windows into, so such a job decodes
    between a window's calls like a job without a speculator drafter, whether the windows are scored
    one at a time (n_parallel 1) or in parallel streams (n_parallel 2). Each job's greedy output is
    what it is alone. (With one slot the drafter shares the scorer's context, and no other job runs.)"""
    from specq.engine.serving.loop import ServingEngine

    eng = loop_engine(tiny_models, slots=3, n_parallel=n_parallel)
    loop = ServingEngine(eng).start()
    try:
        model_p = decoder_params(draft="model", max_tokens=300)
        plain_p = decoder_params(max_tokens=600)
        b_params = scorer_params()
        docs = {"A": SHORT, "C": SHORT.replace("2", "3")}
        alone = {"A": loop.run(docs["A"], model_p), "C": loop.run(docs["C"], plain_p)}
        eng.cache_store.clear()
        alone["B"] = loop.run(DOC, b_params)
        eng.cache_store.clear()

        ev = Events()
        h = _together(loop, {"A": (docs["A"], model_p), "C": (docs["C"], plain_p)}, (DOC, b_params), ev)
        res = {k: h[k].result(180) for k in ("B", "A", "C")}
        for k in "ABC":
            assert res[k].tokens == alone[k].tokens and res[k].text == alone[k].text, k
        assert res["B"].kept_indices == alone["B"].kept_indices
        assert res["A"].draft.drafted > 0 and res["A"].draft.method == "model"

        spans = ev.windows("B")
        assert len(spans) >= 2
        # in slot order: A (slot 0) before C (slot 1) in a batch of both; after C's first token of a
        # window span, only the batches between that window's calls follow
        late_a = [sum(1 for e in span[next((i for i, e in enumerate(span) if e[0] == "C"), len(span)):]
                      if e[0] == "A" and e[1] == "decode") for span in spans]
        c_tokens = [len(_decoding("C", span)) for span in spans]
        assert all(n >= 2 for n in c_tokens), c_tokens  # C decoded between the calls
        if n_parallel == 2:
            assert res["B"].spec.windows > len(spans)  # windows scored in groups (parallel streams)
        assert sum(late_a) > 0, late_a  # A decoded inside windows being prefilled too
    finally:
        loop.close()
        eng.close()


def test_submit_tokenizes_in_the_calling_thread(tiny_models):
    """The loop's thread never tokenizes: `submit` does, in the caller's thread, so a prompt that cannot
    fit fails there — its future is done before any loop runs — and a job's `tokenize` timing is the
    caller's tokenization (plus the loop's mode decision), its `slot_wait` counts from then."""
    from specq.contracts import InputError
    from specq.engine.serving.loop import ServingEngine

    eng = loop_engine(tiny_models, slots=1)
    sv = ServingEngine(eng)  # not started: nothing runs on a loop thread yet
    try:
        too_long = sv.submit(DOC * 40, decoder_params(max_tokens=8))
        assert too_long.done()
        with pytest.raises(InputError, match="exceeds the target's context"):
            too_long.result(0)
        bad = sv.submit(SHORT, decoder_params(max_tokens=-1))
        assert bad.done() and isinstance(bad.future.exception(0), InputError)
        ok = sv.submit(DOC, decoder_params(max_tokens=4))
        tokenized_ms = (ok._job.t_queued - ok._job.t_submit) * 1000.0
        assert not ok.done() and ok._job.prompt is not None and tokenized_ms > 0
        sv.start()
        r = ok.result(120)
        tm = r.timings_ms
        assert tm["tokenize"] >= tokenized_ms and tm["slot_wait"] >= 0
        assert r.usage.prompt_tokens == ok._job.prompt.n
    finally:
        sv.close()
        eng.close()
