"""The speculator's scoring on a thread of its own (engine/serving/score_thread.py), beside the serving loop's
target batches: what a job returns does not change, one job is scored at a time, cancel and close
land, and a job drafting with the speculator keeps the scoring on the loop's thread.

Tiny random-weight models on the CPU (where `auto` leaves the thread off, so these loops turn it on),
one llama.cpp thread each, batch-invariant target: "the same tokens as alone" is exact. Progress
callbacks now run on two threads: each event records the thread it ran on."""

from __future__ import annotations

import threading
import time

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from specq.contracts import Drained, RunCancelled  # noqa: E402

from serving_text import DOC, DOC2, SHORT, decoder_params, loop_engine, scorer_params  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


class Events:
    """(job, phase, done, total, thread name), in the order they were reported."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, int, int, str]] = []
        self.hooks: dict[tuple[str, str], list] = {}

    def progress(self, name: str):
        def report(phase: str, done: int, total: int) -> None:
            thread = threading.current_thread().name
            self.items.append((name, phase, done, total, "specq-score" if thread.startswith("specq-score") else thread))
            for fn in self.hooks.get((name, phase), []):
                fn(done, total)
        return report

    def of(self, name: str, phase: str) -> list[int]:
        return [i for i, e in enumerate(list(self.items)) if e[0] == name and e[1] == phase]

    def wait(self, name: str, phase: str, timeout: float = 120.0) -> None:
        t_end = time.monotonic() + timeout
        while not self.of(name, phase):
            assert time.monotonic() < t_end, f"{name} never reached {phase}"
            time.sleep(0.005)


@pytest.fixture(scope="module")
def beside(tiny_models):
    from specq.engine.serving.loop import ServingEngine

    eng = loop_engine(tiny_models, slots=3)
    loop = ServingEngine(eng, score_thread="on").start()
    alone = {}
    a, b, c = decoder_params(), scorer_params(), scorer_params("What does the license permit?")
    alone["A"] = loop.run(SHORT, a)
    for name, doc, p in (("B", DOC, b), ("C", DOC2, c)):
        eng.cache_store.clear()
        alone[name] = loop.run(doc, p)
    eng.cache_store.clear()
    yield loop, alone, {"A": (SHORT, a), "B": (DOC, b), "C": (DOC2, c)}
    loop.close()
    eng.close()


def test_the_setting_is_checked_and_auto_leaves_the_thread_off_on_the_cpu(beside):
    from specq.engine.serving.loop import ServingEngine
    from specq.settings import ServiceSettings

    loop, _, _ = beside
    assert loop.scoring is not None
    assert ServingEngine(loop.engine).scoring is None  # auto, CPU target (not started: nothing runs)
    assert ServiceSettings.from_env({"SPECQ_SCORE_THREAD": "on"}).score_thread == "on"
    with pytest.raises(Exception, match="SPECQ_SCORE_THREAD must be auto, on or off"):
        ServiceSettings.from_env({"SPECQ_SCORE_THREAD": "sometimes"}).validate()


def test_jobs_scored_beside_a_decoding_job_return_what_they_return_alone(beside):
    """A decodes while B and C (two documents) are scored on the score thread, one after the other:
    every job's tokens and kept chunks are those of the job alone; the scoring ran on `specq-score`
    while A's tokens came from `specq-engine`, and A decoded while B was being scored."""
    loop, alone, jobs = beside
    before = loop.stats()["scored_beside"]
    ev = Events()
    h = {"A": loop.submit(*jobs["A"], ev.progress("A"))}
    ev.wait("A", "decode")
    for name in "BC":
        h[name] = loop.submit(*jobs[name], ev.progress(name))
    res = {k: h[k].result(180) for k in "BCA"}
    for k in "ABC":
        assert res[k].tokens == alone[k].tokens and res[k].text == alone[k].text, k
    for k in "BC":
        assert res[k].kept_indices == alone[k].kept_indices, k
        scored = [e for e in ev.items if e[0] == k and e[1] in ("score", "select")]
        assert scored and {e[4] for e in scored} == {"specq-score"}, scored
        assert res[k].timings_ms["score_engine"] > 0
    assert {e[4] for e in ev.items if e[0] == "A" and e[1] == "decode"} == {"specq-engine"}
    assert loop.stats()["scored_beside"] == before + 2
    # one job at a time on the speculator: C's scoring began after B's selection (or B's after C's)
    b0, b1 = ev.of("B", "score")[0], ev.of("B", "select")[0]
    c0, c1 = ev.of("C", "score")[0], ev.of("C", "select")[0]
    assert b1 < c0 or c1 < b0
    first, end = min(b0, c0), max(b1, c1)
    assert any(first < i < end for i in ev.of("A", "decode")), "A never decoded while B and C were scored"
    assert loop.live() == 0


def test_a_cancel_lands_on_the_score_thread_and_the_next_job_is_scored(beside):
    """B cancelled from its own first window report (on the score thread) ends with RunCancelled before
    its selection; C, waiting for the thread, is then scored as alone; A is unharmed."""
    loop, alone, jobs = beside
    ev = Events()
    h: dict = {}

    def cancel_b(done, total):
        if done == 1:
            h["B"].cancel()

    ev.hooks[("B", "score")] = [cancel_b]
    h["A"] = loop.submit(*jobs["A"], ev.progress("A"))
    ev.wait("A", "decode")
    h["B"] = loop.submit(*jobs["B"], ev.progress("B"))
    h["C"] = loop.submit(*jobs["C"], ev.progress("C"))
    with pytest.raises(RunCancelled):
        h["B"].result(180)
    assert h["C"].result(180).kept_indices == alone["C"].kept_indices
    assert h["A"].result(180).tokens == alone["A"].tokens
    assert not ev.of("B", "select") and not ev.of("B", "decode")
    assert [e[2] for e in ev.items if e[0] == "B" and e[1] == "score"][-1] <= 1
    loop.engine.cache_store.clear()
    assert loop.run(*jobs["B"]).kept_indices == alone["B"].kept_indices  # nothing of it stayed behind
    assert loop.live() == 0


def test_a_job_drafting_with_the_speculator_keeps_the_scoring_on_the_loop_thread(tiny_models):
    """draft=model decodes on the scorer's context: while such a job is live, B is scored on the
    engine thread (between batches, as without the thread); both return what they return alone."""
    from specq.engine.serving.loop import ServingEngine

    eng = loop_engine(tiny_models, slots=2)
    loop = ServingEngine(eng, score_thread="on").start()
    try:
        model_p, b_params = decoder_params(draft="model", max_tokens=300), scorer_params()
        alone_a = loop.run(SHORT, model_p)
        eng.cache_store.clear()
        alone_b = loop.run(DOC, b_params)
        eng.cache_store.clear()
        scored_before = loop.stats()["scored_beside"]
        ev = Events()
        ha = loop.submit(SHORT, model_p, ev.progress("A"))
        ev.wait("A", "decode")
        hb = loop.submit(DOC, b_params, ev.progress("B"))
        rb, ra = hb.result(180), ha.result(180)
        assert ra.tokens == alone_a.tokens and ra.draft.method == "model" and ra.draft.drafted > 0
        assert rb.tokens == alone_b.tokens and rb.kept_indices == alone_b.kept_indices
        assert {e[4] for e in ev.items if e[0] == "B" and e[1] == "score"} == {"specq-engine"}
        assert loop.stats()["scored_beside"] == scored_before
    finally:
        loop.close()
        eng.close()


def test_close_during_scoring_drops_the_job_and_waits_for_the_thread(tiny_models):
    """The drain's end (drop_running, close) while a job is on the score thread: the job fails with
    Drained, close returns only after the thread let go of the speculator, and the engine scores
    the same document afterwards as before."""
    from specq.engine.serving.loop import ServingEngine

    eng = loop_engine(tiny_models, slots=2, cache_bytes=0)
    loop = ServingEngine(eng, score_thread="on").start()
    b_params = scorer_params()
    try:
        alone_b = loop.run(DOC, b_params)
        ev = Events()
        hb = loop.submit(DOC, b_params, ev.progress("B"))
        ev.wait("B", "score")
        loop.stop_admitting()
        loop.drop_running(Drained("grace period over"))
        loop.close(timeout=120)
        with pytest.raises(Drained):
            hb.result(10)
        assert not loop._thread.is_alive()
        assert loop.scoring.thread is not None and not loop.scoring.thread.is_alive()
        again = eng.run(DOC, b_params)
        assert again.kept_indices == alone_b.kept_indices and again.tokens == alone_b.tokens
    finally:
        loop.close()
        eng.close()
