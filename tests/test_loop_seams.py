"""Test hooks out of production code paths (issue 44 item 12): the engine loop's fault is an injected
seam (engine/serving/seams.py), not a variable every worker reads; the score math's thread pool and the
loop's score thread carry distinct names, and the pool starts once however many threads ask."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from serving_text import SHORT, decoder_params, loop_engine  # noqa: E402

#: engine tests: counted by .ci/check_suites.py (a run where all of them skipped fails CI)
pytestmark = [pytest.mark.engine]

REPO = Path(__file__).resolve().parents[1]


def test_the_fault_variable_is_not_read_and_the_injected_seam_fails_the_job(tiny_models, monkeypatch):
    from specq.contracts import DecodeError
    from specq.engine.serving.seams import LoopSeams
    from specq.engine.serving.loop import ServingEngine

    monkeypatch.setenv("SPECQ_SERVING_FAULT", "FAIL ME")  # what the tests used to set: read by nobody now
    eng = loop_engine(tiny_models, slots=2)
    try:
        loop = ServingEngine(eng).start()
        try:
            res = loop.run(SHORT, decoder_params(question="FAIL ME", max_tokens=8))
            assert res.usage.completion_tokens == 8
        finally:
            loop.close()
        loop = ServingEngine(eng, seams=LoopSeams(fails=lambda p: p.question == "FAIL ME")).start()
        try:
            with pytest.raises(DecodeError, match="test seam"):
                loop.run(SHORT, decoder_params(question="FAIL ME", max_tokens=8))
            assert loop.run(SHORT, decoder_params(question="fine", max_tokens=8)).usage.completion_tokens == 8
        finally:
            loop.close()
    finally:
        eng.close()


def test_score_pools_have_distinct_names():
    """The loop's score thread is `specq-score_N`, the score math's per-layer threads (which it uses)
    `specq-score-math_N`: a thread dump, or a test that asks which thread scored, tells them apart."""
    from specq.engine.serving.score_thread import ScoreThread
    from specq.engine.scoring.scorer import math_pool

    names: dict[str, str] = {}
    done = threading.Event()

    def work():
        names["score_thread"] = threading.current_thread().name
        names["math"] = math_pool().submit(lambda: threading.current_thread().name).result()

    st = ScoreThread(done.set)
    try:
        st.start("job", work)
        assert done.wait(30)
        st.take()[1].result()
    finally:
        st.close()
    assert names["score_thread"].startswith("specq-score_"), names
    assert names["math"].startswith("specq-score-math_"), names


def test_the_score_math_pool_starts_once_when_threads_race():
    """A fresh interpreter, the pool's constructor slowed down, 8 threads asking at once: one pool."""
    script = r'''
import concurrent.futures as cf, threading, time, sys
made = []
class Slow(cf.ThreadPoolExecutor):
    def __init__(self, *a, **kw):
        made.append(1)
        time.sleep(0.05)
        super().__init__(*a, **kw)
cf.ThreadPoolExecutor = Slow
from specq.engine.scoring import scorer as scoring
got = []
barrier = threading.Barrier(8)
def ask():
    barrier.wait()
    got.append(scoring.math_pool())
ts = [threading.Thread(target=ask) for _ in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print(len(made), len({id(p) for p in got}))
'''
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1"], r.stdout
