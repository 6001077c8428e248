"""Issue 48 item 4: shadow checks. The policy (engine/policy/shadow.py) on its own, the table (migration
0009, storage/shadow.py) on SQLite and PostgreSQL; tests/test_shadow_service.py runs them in a worker."""

from __future__ import annotations

import dataclasses

import pytest

from evidence_helpers import migration_round_trip, url  # noqa: F401 (url: a fixture)
from specq.engine.policy import evidence, shadow
from specq.engine.policy.auto import GROUP_PATH
from specq.storage import db, shadow as store

ROW = evidence.shipped_rows()[0]


def _passing_row(**key_changes) -> evidence.EvidenceRow:
    docs = {f"{i:064x}": {"n": 5, "baseline_right": 4, "arm_right": 4, "both_right": 4} for i in range(8)}
    key = dataclasses.replace(ROW.key, **key_changes)
    row = evidence.with_documents(dataclasses.replace(ROW, key=key, in_sample=False, in_sample_why=""), docs)
    assert row.passes, row.fails_bar()
    return row


def test_only_greedy_auto_one_off_specprefill_jobs_are_eligible():
    assert shadow.eligible("auto", "specprefill", "auto: one-off long document: ...", 0.0)
    assert not shadow.eligible("specprefill", "specprefill", "asked for", 0.0)  # the user chose it: nothing to check
    assert not shadow.eligible("auto", "baseline", "auto: 10 tokens < break-even", 0.0)
    assert not shadow.eligible("auto", "specprefill", "auto: one-off long document", 0.7)  # sampled answers differ by chance
    assert not shadow.eligible("auto", "specprefill", f"auto: group of 3 questions: {GROUP_PATH} (9000 tokens", 0.0)


def test_sampling_takes_about_the_rate_and_the_same_job_every_time():
    ids = [f"job_{i:06d}" for i in range(4000)]
    picked = [i for i in ids if shadow.sampled(i, 0.05)]
    assert 140 <= len(picked) <= 260  # 200 expected; binomial sd ~14
    assert picked == [i for i in ids if shadow.sampled(i, 0.05)]
    assert set(picked) <= {i for i in ids if shadow.sampled(i, 0.2)}  # a higher rate keeps the lower one's picks
    assert not any(shadow.sampled(i, 0.0) for i in ids) and all(shadow.sampled(i, 1.0) for i in ids)


def test_agreement_is_the_same_tokens_or_else_the_same_text_but_for_surrounding_whitespace():
    assert shadow.agrees(" 42\n", "42")
    assert not shadow.agrees("42", "43") and not shadow.agrees("the year 2000", "the year  2000")
    # byte-level garbage decodes to the same replacement characters: the tokens tell the answers apart
    assert not shadow.agrees("\ufffd", "\ufffd", [254, 207], [254, 56]) and shadow.agrees("a", "a", [5], [5])


def test_a_key_is_disabled_only_after_enough_checks_with_a_low_bound():
    a = shadow.Agreement
    assert shadow.disable_reason(a(0, 19)) == ""  # never agreed, but fewer than MIN_CHECKS answered
    assert shadow.disable_reason(a(0, 19, cancelled=50)) == ""  # cancelled checks do not count
    why = shadow.disable_reason(a(0, 20))
    assert why.startswith("shadow checks: 0 of 20 answers agreed with baseline") and "< 0.8" in why
    assert shadow.disable_reason(a(20, 0)) == "" and a(20, 0).bound == pytest.approx(0.891, abs=0.001)
    assert shadow.disable_reason(a(19, 1)) == ""  # one disagreement in 20: bound 0.82
    assert shadow.disable_reason(a(18, 2)) != ""  # two: 0.75
    assert shadow.disable_reason(a(95, 5)) == ""  # 95% agreement over 100 stays on
    assert (a(1, 2, 3) + a(4, 5, 6)) == a(5, 7, 9)
    assert a(3, 1).as_dict() == {"n": 4, "agreed": 3, "disagreed": 1, "cancelled": 0, "agreement": 0.75,
                                 "bound": round(a(3, 1).bound, 4), "disables": False}


def test_checks_disable_the_rows_that_are_evidence_for_their_key_and_auto_says_so():
    row = _passing_row()
    other = _passing_row(chunk=row.key.chunk * 2)  # another setting: not evidence for the checked jobs
    job_key = dataclasses.replace(row.key, keep=min(1.0, row.key.keep + 0.2))  # a larger keep: the row covers it
    bad = [shadow.KeyChecks(job_key, shadow.Agreement(agreed=2, disagreed=20))]
    out = shadow.apply([row, other], bad)
    assert out[0].disabled.startswith("shadow checks: 2 of 22") and not out[0].passes
    assert out[1] is other and other.passes
    assert shadow.apply([row], [shadow.KeyChecks(job_key, shadow.Agreement(agreed=22))])[0].passes
    already = dataclasses.replace(row, disabled="by hand")
    assert shadow.apply([already], bad)[0].disabled == "by hand"
    bands, why = evidence.lookup(out, job_key)
    assert bands == () and f"does not pass ({row.length}: disabled: shadow checks: 2 of 22 answers agreed with baseline" in why
    bands, why = evidence.lookup(out[:1], None)  # no row passes at all (the job's key is not made): it is named
    assert bands == () and f"1 disabled, {row.length}: shadow checks: 2 of 22" in why
    listed = shadow.annotate([{**row.as_dict(), "origin": "store"}, {**other.as_dict(), "origin": "store"}], bad)
    assert listed[0]["shadow"]["n"] == 22 and listed[0]["shadow"]["disables"] and not listed[0]["passes"]
    assert listed[0]["fails"].startswith("disabled: shadow checks") and listed[1]["shadow"]["n"] == 0
    assert listed[1]["passes"]


def test_key_id_names_the_compared_fields_only():
    k = ROW.key
    assert shadow.key_id(k) == shadow.key_id(dataclasses.replace(k, target="renamed.gguf"))
    assert shadow.key_id(k) != shadow.key_id(dataclasses.replace(k, keep=0.5))
    assert len(shadow.key_id(k)) == 64


def test_checks_are_stored_and_counted_per_key(url):
    k1, k2 = ROW.key, dataclasses.replace(ROW.key, keep=0.5)
    with db.session(url) as s:
        assert store.version(s) == 0 and store.by_key(s) == [] and store.totals(s) == {"agree": 0, "disagree": 0,
                                                                                        "cancelled": 0}
        for key, outcome in [(k1, "agree"), (k1, "disagree"), (k2, "cancelled"), (k1, "agree")]:
            store.record(s, job_id="job_x", key_id=shadow.key_id(key), key=key.as_dict(), outcome=outcome, shadow_ms=1.5)
        with pytest.raises(ValueError, match="outcome"):
            store.record(s, job_id="job_x", key_id="k", key={}, outcome="maybe", shadow_ms=0)
        assert store.version(s) >= 4
        counted = store.by_key(s)
        assert store.totals(s) == {"agree": 2, "disagree": 1, "cancelled": 1}
    assert [(c["key_id"], c["agree"], c["disagree"], c["cancelled"]) for c in counted] == [
        (shadow.key_id(k1), 2, 1, 0), (shadow.key_id(k2), 0, 0, 1)]
    parsed = shadow.parse_keys(counted + [{"key_id": "x", "key": {"keep": 2}, "agree": 1}])  # a bad key is left out
    assert [p.key for p in parsed] == [k1, k2] and parsed[0].checks == shadow.Agreement(2, 1, 0)


def test_migration_0009_goes_down_and_up(url):
    migration_round_trip(url, "0009", "shadow_checks")


def test_bench_serve_poisson_arrivals_are_random_gaps_at_the_rate_and_repeatable():
    """`specq bench serve --arrival poisson:R` (the shadow rate's cost is measured under it): exponential gaps
    of mean 1/R from the workload's seed; the same seed, the same offsets; bad values named."""
    from specq.bench.serve import arrival_offsets, check_arrival

    at = arrival_offsets("poisson:2", 2000, seed=5)
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert at[0] == 0.0 and all(g >= 0 for g in gaps)
    assert 0.45 <= sum(gaps) / len(gaps) <= 0.55  # mean 0.5 s; sd of the mean ~0.011
    assert sum(g < 0.5 * 0.6931 for g in gaps) / len(gaps) == pytest.approx(0.5, abs=0.05)  # the median of Exp(2)
    assert at == arrival_offsets("poisson:2", 2000, seed=5) and at != arrival_offsets("poisson:2", 2000, seed=6)
    assert arrival_offsets("4", 3) == [0.0, 0.25, 0.5] and arrival_offsets("t0", 2) == [0.0, 0.0]
    assert check_arrival("poisson:0.5") == check_arrival("per-doc") == check_arrival("2") == ""
    for bad in ("poisson:", "poisson:0", "poisson:-1", "poisson:x", "fast", "0", "inf"):
        assert "poisson:RATE" in check_arrival(bad), bad
