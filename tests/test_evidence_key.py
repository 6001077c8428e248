"""Issue 47 item 1: mode auto runs specprefill only where a passing evidence row's EvidenceKey equals the
job's (engine/policy/evidence_key.py); a job differing from that row in one field alone runs baseline and its
reason names that field. Tiny models, a passing row injected for the tiny pair (the shipped rows are
the real pair's, and none passes)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from specq.engine.policy import evidence
from specq.engine.policy.evidence_key import FIELDS, EvidenceKey, first_difference
from specq.engine.options import EngineOptions, RunParams
from specq.engine.pipeline import Engine

DOC = "".join(f"line {i}: the value of item {i} is {i * 7 % 13}.\n" for i in range(40))  # ~1,300 byte tokens
QUESTION = "What is the value of item 7?"


def _engine(target, speculator, **kw) -> Engine:
    return Engine(EngineOptions(target=str(target), speculator=str(speculator), n_gpu_layers=0, n_ctx=4096,
                                n_threads=2, auto_min_tokens=64, **kw))


@pytest.fixture(scope="module")
def eng(tiny_models):
    e = _engine(tiny_models.target, tiny_models.speculator)
    yield e
    e.close()


def _row(key: EvidenceKey, **kw) -> evidence.EvidenceRow:
    """A passing row: 8 documents x 5 questions, all right both ways (bound 1.0), documents of any length."""
    docs = {f"doc{i}": {"n": 5, "baseline_right": 5, "arm_right": 5, "both_right": 5} for i in range(8)}
    data = {"key": key.as_dict(), "metric": "answer_right", "arm": "specprefill", "length": 1000,
            "doc_tokens": [1, 100_000], "documents": docs, "source": "test", **kw}
    row = evidence.row_from_dict(data)
    assert row.passes, row.fails_bar()
    return row


def _decide(e: Engine, params: RunParams, chat: bool = False, **kw):
    messages = [("user", DOC + "\n\n" + QUESTION)] if chat else None
    prompt, mode, positions, _, _, spec = e.prepare(DOC, params, messages=messages, **kw)
    shape = "chat" if chat else "native"
    return mode, spec.reason, e.evidence_key(prompt, params, positions, shape)


BASE = dict(question=QUESTION, window=256, max_tokens=2, task="lookup")  # (a declared task: an undeclared job needs every kind)


def test_the_job_key_resolves_what_runs(eng):
    _, _, key = _decide(eng, RunParams(**BASE))
    assert (key.scorer, key.window, key.backend, key.prompt_shape, key.positions, key.score_math) == (
        "windowed", 256, "cpu", "native", "original", "numpy")
    assert len(key.target_sha256) == 64 and key.target_sha256 != key.speculator_sha256 and key.task == "lookup"
    assert _decide(eng, RunParams(**{**BASE, "task": ""}))[2].task is None  # not declared
    # the window left to the engine: a document that fits one window is one pass, the `full` scorer's
    _, _, auto_window = _decide(eng, RunParams(question=QUESTION, max_tokens=2))
    _, _, full = _decide(eng, RunParams(question=QUESTION, scorer="full", max_tokens=2))
    assert (auto_window.scorer, auto_window.window) == ("full", 0) and auto_window == full


# (params changed from BASE, whether the job is a chat, the field its key then differs in)
JOB_CASES = [
    (dict(keep=0.2), False, "keep"),
    (dict(max_keep=16), False, "max_keep"),
    (dict(chunk=16), False, "chunk"),
    (dict(chunk_rule="mean"), False, "chunk_rule"),
    (dict(window=128), False, "window"),
    (dict(lookahead=4), False, "lookahead"),
    (dict(pool=7), False, "pool"),
    (dict(scorer="sliding"), False, "scorer"),
    (dict(selection="per-window"), False, "selection"),
    (dict(positions="compressed"), False, "positions"),
    (dict(task="review"), False, "task"),
    (dict(), True, "prompt_shape"),
]


@pytest.mark.parametrize("change,chat,field", JOB_CASES, ids=[c[2] for c in JOB_CASES])
def test_a_job_differing_in_one_field_runs_baseline_and_names_it(eng, change, chat, field):
    _, _, base_key = _decide(eng, RunParams(**BASE))
    eng.set_evidence((_row(base_key),))
    try:
        mode, reason, _ = _decide(eng, RunParams(**BASE))
        assert mode == "specprefill" and "one-off long document" in reason and "n 40 (8 documents)" in reason
        mode, reason, key = _decide(eng, RunParams(**{**BASE, **change}), chat=chat)
        assert [f for f in FIELDS if getattr(key, f) != getattr(base_key, f)] == [field]  # that field alone
        assert mode == "baseline", reason
        assert reason.startswith(f"auto: no evidence for {field}="), reason
        assert f"(passing rows have {base_key.describe(field)}" in reason
    finally:
        eng.set_evidence(evidence.shipped_rows())


def test_keep_is_the_one_inequality(eng):
    _, _, base_key = _decide(eng, RunParams(**BASE))
    eng.set_evidence((_row(base_key),))
    try:
        assert _decide(eng, RunParams(**{**BASE, "keep": 0.5}))[0] == "specprefill"  # keeps the measured chunks too
        mode, reason, _ = _decide(eng, RunParams(**{**BASE, "keep": 0.5, "max_keep": 16}))
        assert mode == "baseline" and "no evidence for max_keep=16" in reason  # max_keep is no keep
    finally:
        eng.set_evidence(evidence.shipped_rows())


# fields a job cannot change by its parameters alone: the row differs instead (or the job, for protect_tail
# and pipelined, from a row that already has the other settings they need)
ROW_CASES = [
    ("target_sha256", dict(target_sha256="1" * 64)),
    ("speculator_sha256", dict(speculator_sha256="2" * 64)),
    ("backend", dict(backend="cuda")),
    ("task", dict(task="two-place")),
    ("score_math", dict(score_math="torch")),
]


@pytest.mark.parametrize("field,row_change", ROW_CASES, ids=[c[0] for c in ROW_CASES])
def test_a_row_differing_in_one_field_is_no_evidence(eng, field, row_change):
    _, _, key = _decide(eng, RunParams(**BASE))
    eng.set_evidence((_row(dataclasses.replace(key, **row_change)),))
    try:
        mode, reason, _ = _decide(eng, RunParams(**BASE))
        assert mode == "baseline" and reason.startswith(f"auto: no evidence for {field}="), reason
    finally:
        eng.set_evidence(evidence.shipped_rows())


def test_a_job_that_declares_no_task_needs_every_kind_measured(eng, monkeypatch):
    """Issue 49: a job cannot be assumed to be a lookup. Undeclared, it runs specprefill only where every kind's
    row passes, and the reason names the first kind that does not (here: no two-place row); with every kind's row
    it runs specprefill, citing the rows of every kind. A summary has no pass bar yet (its metric is the label-free
    fidelity): this test lets it be measured by answer-right to reach the passing case."""
    _, _, key = _decide(eng, RunParams(**BASE))
    undeclared = RunParams(**{**BASE, "task": ""})
    eng.set_evidence((_row(key),))
    try:
        mode, reason, _ = _decide(eng, undeclared)
        assert mode == "baseline", reason
        assert reason.startswith("auto: task not declared (params.task), so every kind must pass, and two-place: "
                                 "no evidence for task=two-place"), reason
        every = tuple(_row(dataclasses.replace(key, task=k)) for k in ("lookup", "two-place", "aggregation", "review", "summary"))
        eng.set_evidence(every)
        mode, reason, _ = _decide(eng, undeclared)
        assert mode == "baseline" and "summary questions: unmeasured (fidelity has no pass bar yet" in reason, reason
        monkeypatch.setattr(evidence, "KIND_METRIC", {})
        mode, reason, _ = _decide(eng, undeclared)
        assert mode == "specprefill" and all(f"{k} questions on" in reason for k in ("lookup", "review", "summary")), reason
        assert _decide(eng, RunParams(**{**BASE, "task": "review"}))[0] == "specprefill"  # declared: its own rows
    finally:
        eng.set_evidence(evidence.shipped_rows())


def test_a_bad_task_is_refused_and_a_row_must_name_one(eng):
    from specq.contracts import InputError

    with pytest.raises(InputError, match="task must be lookup, two-place"):
        RunParams(question=QUESTION, task="qa").validate()
    _, _, key = _decide(eng, RunParams(**BASE))
    with pytest.raises(ValueError, match="key.task: a row names the kind"):
        _row(dataclasses.replace(key, task=None))


def test_protect_tail_and_pipelined(eng):
    _, _, chat_key = _decide(eng, RunParams(**BASE), chat=True)
    assert chat_key.protect_tail == -1
    eng.set_evidence((_row(chat_key),))
    try:
        assert _decide(eng, RunParams(**BASE), chat=True)[0] == "specprefill"
        mode, reason, _ = _decide(eng, RunParams(**{**BASE, "protect_tail": 16}), chat=True)
        assert mode == "baseline" and reason.startswith("auto: no evidence for protect_tail=16"), reason
    finally:
        eng.set_evidence(evidence.shipped_rows())
    per_window = RunParams(**{**BASE, "selection": "per-window"})
    _, _, pw_key = _decide(eng, per_window)
    eng.set_evidence((_row(pw_key),))
    try:
        assert _decide(eng, per_window)[0] == "specprefill"
        mode, reason, key = _decide(eng, RunParams(**{**BASE, "selection": "per-window", "pipelined": True}))
        assert first_difference(key, pw_key) == "pipelined"
        assert mode == "baseline" and reason.startswith("auto: no evidence for pipelined=True"), reason
    finally:
        eng.set_evidence(evidence.shipped_rows())


def test_positions_after_the_library_probe(eng):
    """A stock llama-cpp-python refuses position gaps: a job asking `original` runs `compressed`, and its
    key says so, so a row measured with original positions is no evidence for it."""
    _, _, key = _decide(eng, RunParams(**BASE))
    eng.set_evidence((_row(key),))
    saved = eng.gaps_supported
    eng.gaps_supported = False  # what the probe finds on a stock build
    try:
        mode, reason, probed = _decide(eng, RunParams(**BASE))
        assert probed.positions == "compressed" and mode == "baseline"
        assert reason.startswith("auto: no evidence for positions=compressed"), reason
    finally:
        eng.gaps_supported = saved
        eng.set_evidence(evidence.shipped_rows())


def test_models_match_by_file_hash_not_name(tiny_models, tmp_path, eng):
    """A renamed copy of another GGUF does not inherit the rows of the file whose name it took; a copy of
    the same file under another name does."""
    _, _, key = _decide(eng, RunParams(**BASE))
    row = _row(key)
    impostor = tmp_path / tiny_models.target.name  # the speculator's file, named as the target
    shutil.copyfile(tiny_models.speculator, impostor)
    same = tmp_path / "renamed-target.gguf"
    shutil.copyfile(tiny_models.target, same)
    for path, expect in ((impostor, "baseline"), (same, "specprefill")):
        e = _engine(path, tiny_models.speculator)
        try:
            e.set_evidence((row,))
            mode, reason, k = _decide(e, RunParams(**BASE))
            assert mode == expect, reason
            if expect == "baseline":
                assert reason.startswith("auto: no evidence for target_sha256=") and k.target == impostor.name
        finally:
            e.close()


def test_the_operator_override_says_so(tiny_models):
    e = _engine(tiny_models.target, tiny_models.speculator, auto_quality_min_tokens=0)
    try:
        mode, reason, _ = _decide(e, RunParams(**{**BASE, "max_keep": 16}))
        assert mode == "specprefill" and "operator override" in reason
    finally:
        e.close()
    e = _engine(tiny_models.target, tiny_models.speculator, auto_quality_min_tokens=100_000)
    try:
        mode, reason, _ = _decide(e, RunParams(**BASE))
        assert mode == "baseline" and "operator override" in reason
    finally:
        e.close()


def test_no_passing_row_runs_baseline_everywhere(eng):
    """The shipped rows (the real pair's) have none with 8 documents: without an override auto runs baseline."""
    assert eng.evidence_rows == evidence.shipped_rows() and not any(r.passes for r in eng.evidence_rows)
    mode, reason, _ = _decide(eng, RunParams(**BASE))
    assert mode == "baseline" and reason.startswith("auto: no specprefill evidence row passes"), reason


def test_with_no_passing_row_the_speculator_is_not_needed(tiny_models):
    """No row passes: the key is not made, so a baseline decision neither hashes nor resolves (pulls) the
    speculator; here its path does not even exist."""
    e = _engine(tiny_models.target, tiny_models.root / "not-there.gguf")
    try:
        _, mode, _, _, _, spec = e.prepare(DOC, RunParams(**BASE))
        assert mode == "baseline" and spec.reason.startswith("auto: no specprefill evidence row passes"), spec.reason
    finally:
        e.close()
