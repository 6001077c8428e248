"""Cancel and the deadline inside llama.cpp (engine/llama/stop.py, patch 0003), positions per context
(patch 0001) and the capture layout probe, on real llama.cpp.

The tiny-model tests trip the C stop deterministically (directly, or from an eval callback in the
middle of a multi-ubatch call). The real-model tests (the 1.5B target, one 4,096-token llama_decode
call of ~45 s on a 2-core CPU) show that a cancel and a deadline cut such a call within 2 s.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import numpy as np  # noqa: E402

from specq.contracts import DecodeError, JobTimeLimit, RunCancelled  # noqa: E402
from specq.engine.llama import capture, binding as llama  # noqa: E402
from specq.engine.llama.stop import Stop, running  # noqa: E402

#: engine tests: counted by .ci/check_suites.py (a run where all of them skipped fails CI)
pytestmark = [pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "python-license.txt").read_text()


@pytest.fixture(scope="module")
def target(tiny_models):
    m = llama.Model(tiny_models.target, n_gpu_layers=0)
    yield m
    m.close()


def _toks(model, n: int) -> list[int]:
    t = model.tokenize(TEXT)
    return (t * (n // len(t) + 1))[:n]


# -- Stop ---------------------------------------------------------------------------------------------


def test_stop_reasons():
    s = Stop()
    s.check()
    assert s.reason() is None and s.remaining() is None
    s.cancel("cancelled by test")
    with pytest.raises(RunCancelled, match="cancelled by test"):
        s.check()
    late = Stop.after(-1.0, limit_message="too slow")
    with pytest.raises(JobTimeLimit, match="too slow"):
        late.check()
    assert isinstance(late.reason(), RunCancelled)  # the worker's except clauses rely on this
    flag = []
    polled = Stop(cancelled=lambda: bool(flag))
    polled.check()
    flag.append(1)
    with pytest.raises(RunCancelled):
        polled.check()


# -- the C stop ------------------------------------------------------------------------------------------


def test_patched_build_has_the_stop():
    assert llama.can_abort_in_c()


def test_tripped_flag_aborts_and_leaves_the_cache_as_before(target):
    ctx = llama.Context(target, n_ctx=1024, n_batch=256, n_ubatch=32, n_threads=2)
    toks = _toks(target, 300)
    ctx.decode(toks[:50], range(50), logits="none")
    llama._SET_STOP(ctx.ptr, True)  # as Stop.cancel() does from another thread
    with pytest.raises(DecodeError, match=r"returned 2 \(aborted\)"):
        ctx.decode(toks[50:250], range(50, 250), logits="last")
    assert ctx.aborted_calls == 1 and ctx.seq_pos_max(0) == 49
    llama._SET_STOP(ctx.ptr, False)
    ctx.decode(toks[50:250], range(50, 250), logits="last")  # the context works on
    after_abort = ctx.logits_row(-1)
    fresh = llama.Context(target, n_ctx=1024, n_batch=256, n_ubatch=32, n_threads=2)
    fresh.decode(toks[:250], range(250), logits="last")
    np.testing.assert_allclose(after_abort, fresh.logits_row(-1), rtol=0, atol=1e-4)
    ctx.close()
    fresh.close()


def test_deadline_in_c_aborts(target):
    ctx = llama.Context(target, n_ctx=512, n_batch=256, n_ubatch=32, n_threads=2)
    llama._SET_STOP_DEADLINE(ctx.ptr, 0)  # already passed
    with pytest.raises(DecodeError, match="aborted"):
        ctx.decode(_toks(target, 100), range(100), logits="last")
    assert ctx.seq_pos_max(0) == -1
    ctx.close()


def test_abort_in_the_middle_of_a_call_removes_all_its_cells(target):
    """Tripped from the eval callback while the call's third ubatch runs: llama.cpp removes that
    ubatch's cells; the two before it, written by the same call, go too. The error is the Stop's."""
    stop = Stop()
    seen = {"out": 0}

    @llama_cpp.ggml_backend_sched_eval_callback
    def on_node(t, ask, _ud):
        name = capture.GgmlTensor.from_address(t).name
        if ask:
            return name == b"attn_norm-0"
        seen["out"] += 1
        if seen["out"] == 3:
            stop.cancel("cancelled mid-call")
        return True

    ctx = llama.Context(target, n_ctx=1024, n_batch=512, n_ubatch=32, n_threads=2, cb_eval=on_node)
    toks = _toks(target, 300)
    ctx.decode(toks[:40], range(40), logits="none")  # two ubatches before the call under test
    seen["out"] = 0
    ctx.stop = stop
    with pytest.raises(RunCancelled, match="cancelled mid-call"):
        ctx.decode(toks[40:300], range(40, 300), logits="none")  # 9 ubatches of 32 tokens
    assert ctx.aborted_calls == 1
    assert ctx.seq_pos_max(0) == 39, "cells of the aborted call were left in the cache"
    ctx.close()


def test_running_block_reaches_every_context(target):
    ctx = llama.Context(target, n_ctx=256, n_threads=1)
    stop = Stop()
    stop.cancel()
    with running(stop):
        with pytest.raises(RunCancelled):
            ctx.decode([1, 2, 3], [0, 1, 2])
    ctx.decode([1, 2, 3], [0, 1, 2])  # outside the block: no stop
    assert ctx.seq_pos_max(0) == 2
    ctx.close()


# -- positions per context (patch 0001) ----------------------------------------------------------------


def _refused(ctx, toks, pos) -> bool:
    try:
        ctx.decode(toks, pos, logits="none")
    except DecodeError:
        return True
    return False


def test_strict_by_default_relaxed_on_request(target):
    t = _toks(target, 16)
    strict = llama.Context(target, n_ctx=256, n_threads=1)
    assert not strict.position_gaps
    assert _refused(strict, t[:3], [0, 2, 3])  # a gap inside the batch
    strict.decode(t[:3], [0, 1, 2], logits="none")
    assert _refused(strict, t[:1], [5])  # a jump past the cache's last position
    strict.close()

    relaxed = llama.Context(target, n_ctx=256, n_threads=1, position_gaps=True)
    assert relaxed.position_gaps
    relaxed.decode(t[:3], [0, 2, 5], logits="none")  # gaps pass
    relaxed.decode(t[:2], [9, 10], logits="none")  # so does a jump after the cache's last position
    assert relaxed.seq_pos_max(0) == 10
    assert _refused(relaxed, t[:3], [11, 12, 12])  # a repeated position
    assert _refused(relaxed, t[:3], [11, 14, 13])  # decreasing
    assert _refused(relaxed, t[:2], [10, 12])  # not after the cache's last position
    assert _refused(relaxed, t[:2], [3, 20])  # inside what the cache holds
    assert relaxed.seq_pos_max(0) == 10
    relaxed.decode(t[:1], [11], logits="last")  # refusals left the context usable
    relaxed.close()


def test_stock_build_falls_back_to_compressed(tiny_models, monkeypatch):
    """A build without llama_set_position_jumps (a stock wheel) keeps stock checks everywhere: the
    probe sees the refusal and the engine runs compressed positions with a warning."""
    from specq.engine.options import EngineOptions, RunParams
    from specq.engine.pipeline import Engine

    monkeypatch.setattr(llama, "_SET_POSITION_JUMPS", None)
    m = llama.Model(tiny_models.target, n_gpu_layers=0)
    assert llama.supports_position_gaps(m) is False
    m.close()
    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, n_threads=2))
    try:
        assert not eng.ctx.position_gaps and not eng.gaps_supported
        r = eng.run(TEXT[:3000], RunParams(question="Who?", mode="specprefill", min_tokens=0, max_tokens=6))
        assert r.spec.positions == "compressed"
        assert any("refuses position gaps" in w for w in r.warnings)
    finally:
        eng.close()


# -- the capture layout probe -----------------------------------------------------------------------------


def test_layout_probe_passes_on_this_build():
    capture.probe_layout()


def test_layout_probe_fails_loudly_on_a_mismatched_struct():
    # as if ggml had changed GGML_MAX_SRC (10 -> 8): view_src, data and name move by 16 bytes
    fields = [("src", capture.ctypes.c_void_p * 8) if f[0] == "src" else f for f in capture.GgmlTensor._fields_]

    class Shifted(capture.ctypes.Structure):
        _fields_ = fields

    with pytest.raises(capture.CaptureLayoutError, match=r"does not match this libggml.*(name|data|nbytes)"):
        capture.probe_layout(Shifted)


def test_first_callback_error_is_re_raised(target):
    cap = capture.QKCapture()
    ctx = llama.Context(target, n_ctx=256, n_threads=1, cb_eval=cap.callback)
    calls = {"n": 0}

    def broken(t):
        calls["n"] += 1
        raise RuntimeError(f"broken read {calls['n']}")

    cap.arm(q=True)
    orig = capture.read_tensor
    capture.read_tensor = broken
    try:
        ctx.decode(_toks(target, 4), range(4), logits="last")
    finally:
        capture.read_tensor = orig
    assert calls["n"] > 1  # every layer failed; the first error is the one kept
    with pytest.raises(Exception, match="broken read 1$"):
        cap.raise_error()
    cap.raise_error()  # raised once
    ctx.close()


# -- the real pair: one 4,096-token call is cut ----------------------------------------------------------


@pytest.fixture(scope="module")
def real_one_call():
    """The real 1.5B target on the CPU, prefills in one 4,096-token llama_decode call (~45 s on 2 cores)."""
    from specq.engine import models
    from specq.engine.options import EngineOptions

    if models.model_status(models.DEFAULT_TARGET).state not in ("verified", "present (not hashed)"):
        pytest.skip(f"{models.DEFAULT_TARGET} not pulled (run `specq models pull`)")
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(n_gpu_layers=0, n_ctx=8192, n_batch=4096, call_tokens=4096))
    yield eng
    eng.close()


def _long_doc(eng, n: int = 4000) -> str:
    words = TEXT.split()
    doc = " ".join(words)
    while len(eng.target.tokenize(doc)) < n:
        doc += " " + doc
    toks = eng.target.tokenize(doc)[:n]
    return eng.target.detokenize(toks)


@pytest.mark.real_models
def test_cancel_cuts_one_long_call(real_one_call):
    from specq.engine.options import RunParams

    eng = real_one_call
    doc = _long_doc(eng)
    prompt = eng.tokenize_prompt(doc, RunParams(question="What license?", mode="baseline", max_tokens=4))
    assert 4000 <= prompt.n <= eng.ctx.call_tokens == 4096  # the whole prefill is one llama_decode call
    stop = Stop()
    phases = []
    t_cancel = []

    def cancel_soon():
        time.sleep(2.0)
        t_cancel.append(time.monotonic())
        stop.cancel("cancelled by test")

    threading.Thread(target=cancel_soon, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(RunCancelled, match="cancelled by test"):
        eng.run(doc, RunParams(question="What license?", mode="baseline", max_tokens=4), stop=stop,
                progress=lambda ph, d, t: phases.append(ph))
    t_end = time.monotonic()
    assert phases[-1] == "sparse_prefill" and eng.ctx.aborted_calls >= 1
    assert t_end - t_cancel[0] < 2.0, f"the run ended {t_end - t_cancel[0]:.2f} s after the cancel"
    assert eng.ctx.seq_pos_max(0) == -1  # nothing of the aborted call stays
    print(f"cancel → end {t_end - t_cancel[0]:.3f} s (run {t_end - t0:.1f} s)")


@pytest.mark.real_models
def test_deadline_cuts_one_long_call(real_one_call):
    from specq.engine.options import RunParams

    eng = real_one_call
    doc = _long_doc(eng)
    t0 = time.monotonic()
    stop = Stop.after(3.0, limit_message="job exceeded the time limit of 3s (test)")
    with pytest.raises(JobTimeLimit, match="time limit of 3s"):
        eng.run(doc, RunParams(question="What license?", mode="baseline", max_tokens=4), stop=stop)
    late = time.monotonic() - stop.deadline
    assert late < 2.0, f"the run ended {late:.2f} s after its deadline"
    print(f"deadline → end {late:.3f} s (run {time.monotonic() - t0:.1f} s)")
