"""The speculator cache's save policy (EngineOptions.spec_cache_save, SPECQ_SPEC_CACHE_SAVE; engine/cache/speculator.py
"Which windows are saved"): `repeat` saves no window of a one-off document (no device-to-host copy), a
stored document's at once and any other's at its second sight; scores, kept tokens and text do not
depend on the policy, through Engine.run and through the serving loop with another job decoding, and a
cancel mid-scoring still lands.

Tiny random-weight models on the CPU, batch-invariant target (each job's logits are the same whoever
shares the loop with it, so "the same text as alone" is exact), as tests/test_serving_interleave.py.
"""

from __future__ import annotations

import time

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from specq.contracts import RunCancelled  # noqa: E402
from specq.engine.options import EngineOptions, RunParams  # noqa: E402
from specq.settings import ServiceSettings, SettingsError  # noqa: E402

from serving_text import CALL, DOC, DOC2, SHORT, WINDOW  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]



def _engine(tiny_models, **kw):
    from specq.engine.pipeline import Engine

    opts = dict(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0, n_ctx=2048,
                n_threads=1, call_tokens=CALL, cache_bytes=1 << 26, batch_invariant="on", spec_cache_save="repeat")
    opts.update(kw)
    return Engine(EngineOptions(**opts))


def _scoring(q: str = "Who holds the copyright?", **kw) -> RunParams:
    base = dict(question=q, mode="specprefill", min_tokens=0, window=WINDOW, keep=0.3, chunk=16, max_tokens=8,
                seed=1, draft="none")
    base.update(kw)
    return RunParams(**base)


def _decoding(**kw) -> RunParams:
    base = dict(question="go on", mode="baseline", draft="none", max_tokens=400, ignore_eos=True, seed=1)
    base.update(kw)
    return RunParams(**base)


def _spec_entries(eng) -> int:
    return sum(1 for _ in eng.cache_store.entries(("speculator",)))


def test_settings_and_options():
    assert EngineOptions().spec_cache_save == "always"
    assert ServiceSettings.from_env({}).engine_options().spec_cache_save == "always"
    s = ServiceSettings.from_env({"SPECQ_SPEC_CACHE_SAVE": "repeat"})
    assert s.engine_options(slots=8).spec_cache_save == "repeat"
    with pytest.raises(SettingsError, match="SPECQ_SPEC_CACHE_SAVE"):
        ServiceSettings.from_env({"SPECQ_SPEC_CACHE_SAVE": "never"})


def test_repeat_saves_a_one_off_document_only_at_its_second_sight(tiny_models):
    """Engine.run (the one-slot path): question 1 about an inline document saves nothing, question 2
    saves its windows, question 3 restores them; a stored document (reused_document) is saved at once.
    Every answer and kept set is the one policy `always` gives."""
    always, repeat = _engine(tiny_models, spec_cache_save="always"), _engine(tiny_models)
    try:
        qs = ["Who holds the copyright?", "What license is this?", "Is there a warranty?"]
        want = [always.run(DOC, _scoring(q), scope="t") for q in qs]
        assert want[0].spec.cache["speculator"]["bytes_saved"] > 0 and want[0].timings_ms["cache_save"] > 0
        got = [repeat.run(DOC, _scoring(q), scope="t") for q in qs]
        windows = got[0].spec.windows
        assert windows >= 3
        c = [r.spec.cache["speculator"] for r in got]
        assert c[0]["misses"] == windows and c[0]["bytes_saved"] == 0 and c[0]["not_saved"] == windows
        assert got[0].timings_ms["cache_save"] == 0
        assert c[1]["misses"] == windows and c[1]["bytes_saved"] > 0 and c[1]["not_saved"] == 0
        assert c[2]["hits"] == windows and c[2]["misses"] == 0
        for w, g in zip(want, got):
            assert g.kept_indices == w.kept_indices and g.text == w.text and g.tokens == w.tokens
        # another tenant asking about the same text: its own first sight
        other = repeat.run(DOC, _scoring(qs[0]), scope="u").spec.cache["speculator"]
        assert other["hits"] == 0 and other["bytes_saved"] == 0
        # a stored document: saved at its first question, hit at the second
        first = repeat.run(DOC2, _scoring(qs[0]), scope="t", reused_document=True).spec.cache["speculator"]
        assert first["bytes_saved"] > 0 and first["not_saved"] == 0
        assert repeat.run(DOC2, _scoring(qs[1]), scope="t").spec.cache["speculator"]["hits"] > 0
    finally:
        always.close()
        repeat.close()


@pytest.fixture(scope="module")
def loop(tiny_models):
    from specq.engine.serving.loop import ServingEngine

    eng = _engine(tiny_models, slots=2)
    sv = ServingEngine(eng).start()
    yield sv
    sv.close()
    eng.close()


def _wait_decoding(seen: list, timeout: float = 120.0) -> None:
    t_end = time.monotonic() + timeout
    while not seen:
        assert time.monotonic() < t_end, "the decoding job never decoded"
        time.sleep(0.005)


def test_serving_loop_one_off_documents_save_nothing_and_return_their_text_alone(loop):
    """Two slots: a job decoding while a one-off document is scored. Under `repeat` the scoring job
    saves no window (nothing enters the store), still gets the kept tokens and text it gets alone,
    and the decoding job returns its text alone; the same document again (same tenant) saves, and a
    third time hits."""
    eng = loop.engine
    eng.cache_store.clear()
    alone_a = loop.run(SHORT, _decoding())
    alone_b = loop.submit(DOC, _scoring(), scope="alone").result(120)
    assert alone_b.spec.cache["speculator"]["bytes_saved"] == 0 and _spec_entries(eng) == 0

    seen: list = []
    ha = loop.submit(SHORT, _decoding(), lambda phase, d, t: seen.append(d) if phase == "decode" else None)
    _wait_decoding(seen)
    hb = loop.submit(DOC, _scoring(), scope="t")
    rb, ra = hb.result(120), ha.result(120)
    assert ra.text == alone_a.text and ra.tokens == alone_a.tokens
    assert rb.text == alone_b.text and rb.kept_indices == alone_b.kept_indices
    c = rb.spec.cache["speculator"]
    assert c["bytes_saved"] == 0 and c["not_saved"] == rb.spec.windows and _spec_entries(eng) == 0
    assert rb.timings_ms["interleave_wait"] > 0  # it did share the loop with the decoding job

    second = loop.submit(DOC, _scoring("What license is this?"), scope="t").result(120).spec.cache["speculator"]
    assert second["bytes_saved"] > 0 and _spec_entries(eng) == rb.spec.windows
    third = loop.submit(DOC, _scoring(), scope="t").result(120)
    assert third.spec.cache["speculator"]["hits"] == rb.spec.windows
    assert third.kept_indices == alone_b.kept_indices and third.text == alone_b.text
    # a stored document's windows are saved at its first question, in the loop too
    stored = loop.submit(DOC2, _scoring(), scope="t", reused_document=True).result(120).spec.cache["speculator"]
    assert stored["bytes_saved"] > 0 and stored["not_saved"] == 0
    assert loop.live() == 0


def test_serving_loop_cancel_mid_scoring_under_repeat(loop):
    """A cancel of a scoring job (one-off document, nothing to save) lands inside its scoring; the
    decoding job beside it returns its text alone, and the same document scores as before afterwards."""
    eng = loop.engine
    eng.cache_store.clear()
    alone_a = loop.run(SHORT, _decoding())
    alone_b = loop.submit(DOC, _scoring(), scope="alone-2").result(120)

    box: dict = {}
    events: list = []

    def b_progress(phase, done, total):
        events.append((phase, done, total))

    def a_progress(phase, done, total):
        if phase == "decode" and "B" in box and any(e[0] == "score" for e in events) and not box.get("cut"):
            box["cut"] = True
            box["B"].cancel()
        if phase == "decode":
            box.setdefault("a_started", True)

    ha = loop.submit(SHORT, _decoding(), a_progress)
    t_end = time.monotonic() + 120
    while not box.get("a_started"):
        assert time.monotonic() < t_end
        time.sleep(0.005)
    box["B"] = loop.submit(DOC, _scoring(), b_progress, scope="t2")
    with pytest.raises(RunCancelled):
        box["B"].result(120)
    assert ha.result(120).text == alone_a.text
    assert not any(e[0] in ("select", "sparse_prefill", "decode") for e in events)
    assert _spec_entries(eng) == 0
    again = loop.submit(DOC, _scoring(), scope="t3").result(120)
    assert again.kept_indices == alone_b.kept_indices and again.text == alone_b.text
    assert loop.live() == 0
