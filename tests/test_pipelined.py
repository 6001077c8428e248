"""Per-window selection and the pipelined SpecPrefill (engine/scoring/pipelined.py): the target's prefill of
window i's chunks runs on a second thread while window i+1 is scored. It must keep exactly the set the
serial run keeps with the same per-window rule, at original and strictly increasing positions, and
give the same answer (tiny random-weight models; one real-pair test)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import numpy as np  # noqa: E402

from specq.contracts import InputError  # noqa: E402
from specq.engine.options import CHUNK_RULES, EngineOptions, RunParams  # noqa: E402
from specq.engine.scoring.pipelined import IncrementalPrefill, pipeline_bound  # noqa: E402
from specq.engine.decode.prefill import sparse_prefill  # noqa: E402
from specq.engine.scoring.scorer import plan_windows  # noqa: E402
from specq.engine.scoring.selection import select_kept, select_kept_per_window, select_window, window_cap  # noqa: E402

#: engine tests: counted by .ci/check_suites.py (a run where all of them skipped fails CI)
pytestmark = [pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "python-license.txt").read_text()


# ------------------------------------------------------------------------ the per-window rule


def test_per_window_keeps_the_ratio_in_every_window():
    rng = np.random.default_rng(3)
    n_doc, doc_start = 1000, 7
    scores = rng.random(n_doc).astype(np.float32)
    scores[:300] += 5.0  # globally, the first window would take the whole budget
    windows = plan_windows(n_doc, 250)
    protected = list(range(doc_start)) + [doc_start + n_doc]
    kept = select_kept_per_window(scores, windows, doc_start=doc_start, n_prompt=doc_start + n_doc + 1,
                                  protected=protected, keep=0.25, chunk=32, rule="border")
    assert set(protected) <= set(kept) and kept == sorted(set(kept))
    for a, b in windows:
        inside = [i for i in kept if doc_start + a <= i < doc_start + b]
        n_chunks = -(-(b - a) // 32)
        # whole chunks cut from the window's start, ceil(n_chunks * keep) of them
        starts = {(i - doc_start - a) // 32 for i in inside}
        assert len(starts) == int(np.ceil(n_chunks * 0.25))
    glob = select_kept(scores, doc_start=doc_start, n_prompt=doc_start + n_doc + 1, protected=protected, keep=0.25, rule="border")
    assert all(i < doc_start + 300 or i in protected for i in glob)
    assert kept != glob


@pytest.mark.parametrize("rule", CHUNK_RULES)
def test_one_window_per_window_is_global(rule):
    rng = np.random.default_rng(4)
    scores = rng.random(900).astype(np.float32)
    code = Path(textwrap.__file__).read_bytes()
    pieces = [code[i:i + 4] for i in range(0, 3600, 4)]  # 900 tokens of real code: `scope` has header lines
    kw = dict(doc_start=5, n_prompt=910, protected=list(range(5)) + list(range(905, 910)), keep=0.3, chunk=32, rule=rule,
              pieces=pieces)
    assert select_kept_per_window(scores, [(0, 900)], **kw) == select_kept(scores, **kw)


def test_per_window_cap_shares():
    assert window_cap(0, 100, 1000) == 0
    assert window_cap(300, 250, 1000) == 75
    assert sum(window_cap(1000, b - a, 4000) for a, b in plan_windows(4000, 1300)) <= 1000
    kept = select_window(np.arange(256, dtype=np.float32), start=10, keep=1.0, chunk=32, max_keep=64, rule="border")
    assert kept == list(range(10 + 192, 10 + 256))  # the two best chunks, nothing more


def test_params_choices():
    assert RunParams().selection == "global" and RunParams().pipelined is False
    RunParams.from_dict({"selection": "per-window", "pipelined": True})
    with pytest.raises(InputError, match="pipelined needs selection per-window"):
        RunParams.from_dict({"pipelined": True})
    with pytest.raises(InputError, match="windowed or full"):
        RunParams.from_dict({"selection": "per-window", "scorer": "sliding"})
    with pytest.raises(InputError, match="selection must be"):
        RunParams.from_dict({"selection": "local"})
    with pytest.raises(InputError):
        RunParams.from_dict({"pipelined": "yes"})


def test_api_schema_has_the_params():
    from specq.api.schemas import RunParamsIn

    props = RunParamsIn.model_json_schema()["properties"]
    assert props["pipelined"]["type"] == "boolean" and props["pipelined"]["default"] is False
    assert props["selection"]["default"] == "global"


def test_pipeline_bound():
    # k equal stages: S/k + (k-1)·max(S, P)/k + P/k
    S, P, k = 4.0, 2.0, 4
    assert pipeline_bound([S / k] * k, [P / k] * k) == pytest.approx(S / k + (k - 1) * max(S, P) / k + P / k)
    assert pipeline_bound([1.0], [1.0]) == 2.0


def test_worker_settings_make_both_gpus_visible():
    from specq.settings import ServiceSettings, SettingsError

    s = ServiceSettings.from_env({}, gpu="2", speculator_gpu="3")
    assert s.visible_devices() == "2,3"
    o = s.engine_options()
    assert (o.main_gpu, o.speculator_gpu) == (0, 1)
    same = ServiceSettings.from_env({}, gpu="1", speculator_gpu="1")
    assert same.visible_devices() == "1" and same.engine_options().speculator_gpu == 0
    plain = ServiceSettings.from_env({}, gpu="1")
    assert plain.visible_devices() == "1" and plain.engine_options().speculator_gpu == -1
    assert ServiceSettings.from_env({}).visible_devices() is None
    with pytest.raises(SettingsError):
        ServiceSettings.from_env({}, gpu="0", speculator_gpu="one")


# ------------------------------------------------------------------------ the engine (tiny models)


@pytest.fixture(scope="module")
def engine(tiny_models):
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=8192, n_ubatch=128, speculator_gpu=1,  # speculator_gpu: a no-op on the CPU
                               # pipelined = serial bit for bit needs batch-invariant numerics (then the
                               # engine aligns the pipelined calls to n_ubatch); off is the CPU default
                               batch_invariant="on"))
    yield eng
    eng.close()


def _params(**kw) -> RunParams:
    base = dict(question="Who?", mode="specprefill", selection="per-window", window=512, keep=0.3, min_tokens=0,
                max_tokens=16)
    base.update(kw)
    return RunParams(**base)


def test_incremental_prefill_equals_sparse_prefill(engine):
    tokens = engine.target.tokenize(TEXT[:2500])
    n = len(tokens)
    kept = [i for i in range(n - 1) if (i // 32) % 3 != 1] + [n - 1]
    want = sparse_prefill(engine.ctx, tokens, kept, "original").logits
    pre = IncrementalPrefill(engine.ctx, tokens, "original", align=engine.ctx.n_ubatch)
    cuts = [0, 100, 101, 400, 777, len(kept) - 1, len(kept)]
    for a, b in zip(cuts[:-1], cuts[1:]):
        pre.feed(kept[a:b], final=b == len(kept))
    got = pre.finish()
    assert got.n_kept == len(kept) and got.next_pos == n and engine.ctx.seq_pos_max(0) == n - 1
    np.testing.assert_array_equal(got.logits, want)  # the same micro-batches: bit for bit
    with pytest.raises(ValueError, match="above those fed before"):
        p2 = IncrementalPrefill(engine.ctx, tokens, "original")
        p2.feed([5, 6])
        p2.feed([6, 7])


@pytest.mark.parametrize("positions", ["original", "compressed"])
def test_pipelined_equals_serial_per_window(engine, positions):
    doc = TEXT[:7000]
    serial = engine.run(doc, _params(positions=positions))
    phases: list[str] = []
    piped = engine.run(doc, _params(positions=positions, pipelined=True), progress=lambda p, d, t: phases.append(p))
    trace = engine.last_trace
    assert serial.spec.windows >= 3 and piped.spec.windows == serial.spec.windows
    assert piped.kept_indices == serial.kept_indices
    assert piped.tokens == serial.tokens and piped.text == serial.text and len(piped.tokens) > 0
    assert piped.spec.pipelined and piped.spec.selection == "per-window" and not serial.spec.pipelined
    # the stages: head, one per window in document order, tail; indices strictly increasing across them
    assert trace.threaded and [s.name for s in trace.stages] == ["head"] + ["window"] * serial.spec.windows + ["tail"]
    assert sum(s.n_tokens for s in trace.stages) == len(piped.kept_indices)
    assert sum(s.decoded for s in trace.stages) == len(piped.kept_indices)
    windows = [(s.a, s.b) for s in trace.stages if s.name == "window"]
    assert windows == sorted(windows) and windows[0][0] == 0
    assert all(s.prefill_end_s >= s.prefill_start_s >= s.ready_s - 1e-6 for s in trace.stages)
    assert phases.index("score") < phases.index("sparse_prefill") < phases.index("decode")
    assert piped.timings_ms["sparse_prefill"] > 0 and "prefill_overlapped" in piped.timings_ms
    # per-window differs from global on this document (else the test would prove little)
    glob = engine.run(doc, _params(positions=positions, selection="global"))
    assert glob.kept_indices != serial.kept_indices
    assert piped.to_dict()["spec"]["selection"] == "per-window"


def test_pipelined_scope_rule_reads_each_window_text(engine):
    """The `scope` chunk rule on code (a standard-library module): the pipelined run keeps what the
    serial per-window run keeps (each window's header lines read from its own tokens), and the rule
    changes the kept set against `border` at the same budget."""
    doc = Path(textwrap.__file__).read_text()[:7000]
    serial = engine.run(doc, _params(chunk_rule="scope", max_tokens=2))
    piped = engine.run(doc, _params(chunk_rule="scope", pipelined=True, max_tokens=2))
    assert serial.spec.windows >= 3 and piped.kept_indices == serial.kept_indices and piped.tokens == serial.tokens
    border = engine.run(doc, _params(chunk_rule="border", max_tokens=2))
    assert border.kept_indices != serial.kept_indices and len(border.kept_indices) == len(serial.kept_indices)
    assert piped.to_dict()["spec"]["chunk_rule"] == "scope"


def test_pipelined_in_series_and_positions_increase(engine):
    """threaded=False runs the same stages one after another (the benchmark's uncontended stage
    times); every decode the target gets continues strictly above the one before, at original
    positions, and together they are exactly the kept set."""
    from specq.engine.result import SpecInfo

    doc = TEXT[:5000]
    params = _params(pipelined=True)
    serial = engine.run(doc, _params())
    prompt = engine.tokenize_prompt(doc, params)
    seen: list[int] = []
    real_decode = engine.ctx.decode

    def spy(tokens, positions, **kw):
        seen.extend(int(p) for p in positions)
        return real_decode(tokens, positions, **kw)

    for threaded in (False, True):
        seen.clear()
        engine.ctx.decode = spy
        try:
            kept, _, pre = engine._pipelined(prompt, params, "original", {}, SpecInfo(), lambda *a: None, threaded=threaded)
        finally:
            del engine.ctx.decode
        assert kept == serial.kept_indices
        assert seen == kept and all(b > a for a, b in zip(seen, seen[1:]))
        assert pre.next_pos == prompt.n and engine.last_trace.threaded is threaded


def test_a_cancel_while_scoring_stops_both_threads(engine):
    class Stop(Exception):
        pass

    def progress(phase, done, total):
        if phase == "score" and done == 2:
            raise Stop

    with pytest.raises(Stop):
        engine.run(TEXT[:6000], _params(pipelined=True), progress=progress)
    import threading

    assert not [t for t in threading.enumerate() if t.name == "specq-pipelined-prefill"]
    # the engine runs on afterwards, pipelined or not
    a = engine.run(TEXT[:3000], _params(pipelined=True))
    b = engine.run(TEXT[:3000], _params())
    assert a.tokens == b.tokens


# ------------------------------------------------------------------------ the real pair


@pytest.mark.real_models
@pytest.mark.timeout(2400)  # ~2 runs of a 3.4K-token prompt; minutes on a loaded 2-core CPU
def test_real_pair_pipelined_answers_like_serial(real_engine):
    """One ~3.4K-token prompt in 4 windows on the real Qwen2.5-Coder pair: the same kept set and the
    same greedy answer pipelined and serial (per-window selection both)."""
    q = "Which company did the Python core development team move to in May 2000?"
    p = dict(question=q, mode="specprefill", selection="per-window", window=1024, keep=0.3, min_tokens=0, max_tokens=12)
    serial = real_engine.run(TEXT, RunParams(**p))
    piped = real_engine.run(TEXT, RunParams(pipelined=True, **p))
    print(f"serial {serial.text!r} ttft {serial.timings_ms['ttft']:.0f} ms; pipelined {piped.text!r} "
          f"ttft {piped.timings_ms['ttft']:.0f} ms")
    assert serial.spec.windows >= 3
    assert piped.kept_indices == serial.kept_indices
    assert piped.text == serial.text and piped.tokens == serial.tokens
