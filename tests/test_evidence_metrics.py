"""Issue 48 item 1: the label-free evidence metrics (engine/policy/evidence_metrics.py) on hand-checkable numbers,
their rows (validated per metric, document-clustered bounds, provisional pass bars) and how mode auto combines
rows of several metrics measured for one key (evidence.length_fails)."""

from __future__ import annotations

import pytest

from specq.engine.policy import evidence, evidence_metrics as em
from specq.engine.policy.evidence import PASS_BARS, lookup, row_from_dict, shipped_rows
from specq.engine.policy.evidence_bound import cp_lower

KEY = shipped_rows()[0].key


def test_normalise_agreement_and_token_f1_by_hand():
    assert em.normalise('  "The Answer is  42."\n') == "the answer is 42"
    assert em.agreement("It is 42.", "it is 42") == 1 and em.agreement("It is 42", "It is 43") == 0
    # arm: "a b c d" vs baseline "a b x": common 2, precision 2/4, recall 2/3 -> F1 = 2*(1/2)(2/3)/(1/2+2/3) = 4/7
    assert em.token_f1("a b c d", "a, b x") == pytest.approx(4 / 7)
    assert em.token_f1("", "") == 1.0 and em.token_f1("x", "") == 0.0 and em.token_f1("Paris.", "paris") == 1.0
    assert em.answer_matches("The code is 1234567, I think", "1234567") and not em.answer_matches("123456", "1234567")
    assert em.answer_matches("raised in `parse_header` here", "parse_header")


def test_question_values_and_per_document_sums():
    units = [("d1", em.question_values({"baseline": {"text": "a b"}, "specprefill": {"text": "a b"},
                                         "loglik_full": -0.5, "loglik_sparse": -0.75, "baseline_right": True, "arm_right": True})),
             ("d1", em.question_values({"baseline": {"text": "a b"}, "specprefill": {"text": "a c"},
                                         "loglik_full": -1.0, "loglik_sparse": -1.0, "baseline_right": True, "arm_right": False})),
             ("d2", em.question_values({"baseline": {"text": "x"}, "specprefill": {"text": "y"},
                                         "loglik_full": -0.25, "loglik_sparse": -2.25}))]
    assert units[0][1]["loglik_delta"] == -0.25 and units[1][1]["token_f1"] == 0.5
    assert em.documents_for("agreement", units) == {"d1": {"n": 2, "sum": 1}, "d2": {"n": 1, "sum": 0}}
    assert em.documents_for("token_f1", units) == {"d1": {"n": 2, "sum": 1.5}, "d2": {"n": 1, "sum": 0.0}}
    assert em.documents_for("loglik_delta", units) == {"d1": {"n": 2, "sum": -0.25}, "d2": {"n": 1, "sum": -2.0}}
    # no reference answer on d2: answer_right counts d1 only
    assert em.documents_for("answer_right", units) == {"d1": {"n": 2, "baseline_right": 2, "arm_right": 1, "both_right": 1}}


def _row(metric: str, docs: dict, length: int = 1000, **kw):
    return row_from_dict({"key": KEY.as_dict(), "metric": metric, "length": length, "doc_tokens": [900, 1100],
                          "documents": docs, **kw})


def test_bounds_are_clustered_and_never_above_the_exact_one():
    # agreement: 8 documents x 5 questions, each document 4 of 5 agree -> mean 0.8; every document the same, so
    # the bootstrap gives 0.8 exactly and the exact binomial bound over 40 questions (32 agree) is lower
    docs = {f"d{i}": {"n": 5, "sum": 4} for i in range(8)}
    row = _row("agreement", docs)
    assert row.value == 0.8 and row.bound == pytest.approx(cp_lower(32, 40)) and row.bound < 0.8
    assert row.bound_method == em.METHODS["agreement"] and row.fails_bar().startswith("lower bound 0.696")
    # all agree: bound = exact binomial of 40/40 at 90% = 0.1 ** (1/40)
    full = _row("agreement", {f"d{i}": {"n": 5, "sum": 5} for i in range(8)})
    assert full.bound == pytest.approx(0.1 ** (1 / 40), abs=1e-6) and full.passes
    # loglik_delta: identical documents -> the bootstrap of the mean is that mean
    same = _row("loglik_delta", {f"d{i}": {"n": 5, "sum": -0.25} for i in range(8)})
    assert same.value == pytest.approx(-0.05) and same.bound == pytest.approx(-0.05) and same.passes
    # one document much worse: the clustered bound falls below the mean
    worse = _row("loglik_delta", {**{f"d{i}": {"n": 5, "sum": -0.25} for i in range(7)}, "d7": {"n": 5, "sum": -10.0}})
    assert worse.bound < worse.value < -0.1 and not worse.passes and "lower bound" in worse.fails_bar()
    # token_f1 at 0.95 everywhere passes; at 0.85 it does not
    assert _row("token_f1", {f"d{i}": {"n": 5, "sum": 4.75} for i in range(8)}).passes
    assert not _row("token_f1", {f"d{i}": {"n": 5, "sum": 4.25} for i in range(8)}).passes
    assert PASS_BARS["loglik_delta"].min_bound == -0.10 and set(evidence.PROVISIONAL_BARS) == set(em.MEAN_METRICS)


def test_a_metric_row_is_validated_for_its_metric():
    ok = {f"d{i}": {"n": 5, "sum": 4} for i in range(8)}
    cases = [({"documents": {"d0": {"n": 5, "sum": 6}}}, "documents.d0:"),  # more agree than asked
             ({"documents": {"d0": {"n": 5, "sum": 2.5}}}, "documents.d0.sum"),  # agreement counts questions
             ({"documents": {"d0": {"n": 5, "baseline_right": 5, "arm_right": 5, "both_right": 5}}}, "documents.d0.sum"),
             ({"bound_method": "min(document-bootstrap, exact-paired)"}, "bound_method"),
             ({"bound": 0.99}, "bound:")]
    for change, needle in cases:
        with pytest.raises(ValueError, match="^" + needle.replace(".", r"\.").replace("(", r"\(")):
            row_from_dict({"key": KEY.as_dict(), "metric": "agreement", "length": 1000, "doc_tokens": [1, 2], "documents": ok,
                           **change})
    with pytest.raises(ValueError, match=r"^documents\.d0\.sum: must be a finite number"):
        _row("loglik_delta", {"d0": {"n": 1, "sum": float("nan")}})
    back = row_from_dict(_row("token_f1", {f"d{i}": {"n": 5, "sum": 4.5} for i in range(8)}).as_dict())
    assert back.metric == "token_f1" and back.value == 0.9 and back.as_dict()["ratio"] is None


def _passing(metric: str, length: int = 1000):
    if metric == "answer_right":
        docs = {f"d{i}": {"n": 5, "baseline_right": 5, "arm_right": 5, "both_right": 5} for i in range(8)}
    elif metric == "loglik_delta":
        docs = {f"d{i}": {"n": 5, "sum": 0.0} for i in range(8)}
    else:
        docs = {f"d{i}": {"n": 5, "sum": 5} for i in range(8)}
    row = _row(metric, docs, length)
    assert row.passes, row.fails_bar()
    return row


def test_several_metrics_combine_every_one_must_pass_and_one_must_be_decisive():
    agree, f1, ll = _passing("agreement"), _passing("token_f1"), _passing("loglik_delta")
    bands, why = lookup((agree, f1, ll), KEY)
    assert why == "" and len(bands) == 1 and {r.metric for r in bands[0].rows} == {"agreement", "token_f1", "loglik_delta"}
    assert "provisional bar" in bands[0].describe()
    # label-free rows without answer_right or agreement: no band, and the reason says why
    none, why = lookup((f1, ll), KEY)
    assert none == () and "only token_f1, loglik_delta measured" in why
    # one failing metric row vetoes the length although the others pass
    bad_ll = _row("loglik_delta", {f"d{i}": {"n": 5, "sum": -5.0} for i in range(8)})
    none, why = lookup((agree, f1, bad_ll), KEY)
    assert none == () and "1000: loglik_delta lower bound" in why
    # answer_right alone still passes as before (the shipped rows' way)
    assert lookup((_passing("answer_right"),), KEY)[0]


def test_a_length_that_fails_is_named_where_no_band_covers_the_prompt():
    """A key with passing rows at some lengths and a `specq calibrate` run's failing rows at another used to get,
    for a prompt at that other length, only "not measured at N tokens (measured to hold: …)": the calibrated
    rows it had looked up went unnamed (the no-row-passes case is tests/test_calibrate.py's, on the tiny pair)."""
    from specq.engine.policy import auto

    agree = _passing("agreement")  # 1,000-token rows that pass: the band 900-1,356
    small = {f"d{i}": {"n": 2, "sum": 2} for i in range(4)}  # 4 documents, 8 questions: below the bar
    failing = [row_from_dict({"key": KEY.as_dict(), "metric": m, "length": 2048, "doc_tokens": [1400, 1850],
                              "documents": small, "source": "calibrate:qs.jsonl"}) for m in ("agreement", "token_f1")]
    bands, why = lookup((agree, *failing), KEY)
    assert [(b.lo, b.hi) for b in bands] == [(900, 1100 + evidence.QUESTION_ALLOWANCE)]
    assert why.startswith("specprefill evidence for these settings does not pass at 2048 (calibrate:qs.jsonl): ")
    assert "4 documents < 8" in why and "token_f1" in why
    # the decision for a 1,900-token prompt names them after the bands that hold
    d = auto.decide(1900, backend="cpu", min_tokens=0, evidence=lambda arm: lookup((agree, *failing), KEY, arm))
    assert d.mode == "baseline" and "not measured at 1900 tokens" in d.reason and "measured to hold: 900-1,356" in d.reason
    assert "does not pass at 2048 (calibrate:qs.jsonl)" in d.reason, d.reason
    # inside the band it runs specprefill, and without failing rows the reason is as before
    assert auto.decide(1000, backend="cpu", min_tokens=0, evidence=lambda arm: lookup((agree, *failing), KEY, arm)).mode == "specprefill"
    assert lookup((agree,), KEY)[1] == ""
