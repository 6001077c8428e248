"""Issue 48 item 4: the worker's shadow checks (worker/shadow.py) on the engine loop (serving slots), in this
process: a picked job's check runs when the runner is told the process is idle, stores its outcome, and a
claim cancels one in flight through its loop handle at once. (One slot, in a real worker:
tests/test_shadow_service.py.)"""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from specq.engine.options import RunParams
from specq.storage import db, shadow as store

pytestmark = [pytest.mark.engine]

DOC = "".join(f"line {i}: the value of item {i} is {i * 7 % 13}.\n" for i in range(40))


def _wait(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.fixture
def runner(tiny_models, tmp_path, monkeypatch):
    from specq.engine.serving.loop import ServingEngine
    from specq.testing.synthetic import write_qwen2_gguf
    from specq.worker.shadow import ShadowRunner
    from serving_text import loop_engine

    url = f"sqlite:///{tmp_path / 'specq.sqlite'}"
    monkeypatch.setenv("SPECQ_DATABASE_URL", url)
    db.upgrade(url)
    # seed 2: a tiny target whose greedy answers change with the context (test_shadow_service.py)
    models = SimpleNamespace(target=write_qwen2_gguf(tmp_path / "t2.gguf", "tiny", seed=2, n_layer=4),
                             speculator=tiny_models.speculator)
    eng = loop_engine(models, n_ctx=4096, batch_invariant="off")
    loop = ServingEngine(eng).start()
    r = ShadowRunner(1.0)
    r.bind(eng, loop)
    try:
        yield r, loop, url
    finally:
        loop.close()
        eng.close()
        db.dispose_engines()


def _counts(url: str) -> dict:
    with db.session(url) as s:
        return store.totals(s)


def test_a_picked_job_is_checked_when_idle_and_a_claim_cancels_the_next_at_once(runner):
    r, loop, url = runner
    params = RunParams(question="What is the value of item 7?", window=256, max_tokens=4, mode="specprefill")
    res = loop.run(DOC, params)
    assert res.spec.mode == "specprefill"
    auto = replace(params, mode="auto")  # as the job asked: the runner reads the asked mode
    assert not r.offer("job_a", DOC, replace(auto, temperature=0.5), {}, res)  # not greedy: never checked
    assert r.offer("job_a", DOC, auto, {}, res)
    r.idle()
    _wait(lambda: sum(_counts(url).values()) == 1)
    assert _counts(url) == {"agree": 0, "disagree": 1, "cancelled": 0}  # seed 2: the full prefill answers otherwise

    long = replace(auto, max_tokens=1500, ignore_eos=True)
    assert r.offer("job_b", DOC, long, {}, res)
    r.idle()
    _wait(lambda: loop.stats()["slots_busy"] >= 1)  # the baseline check is in the loop
    time.sleep(0.3)
    t0 = time.monotonic()
    assert r.preempt()
    cut = time.monotonic() - t0
    _wait(lambda: _counts(url)["cancelled"] == 1)
    assert cut < 5.0, cut
    assert not r.preempt()  # nothing runs any more
    with db.session(url) as s:
        checks = store.by_key(s)
    assert len(checks) == 1 and checks[0]["disagree"] == 1 and checks[0]["cancelled"] == 1
    print(f"\nshadow check cut {cut * 1000:.0f} ms after the claim (engine loop)")
