"""`specq bench structured`: the grader (parse, normalise, compare), the per-arm aggregation, the table
`specq bench report` renders from a result file, the committed references, and a run on the tiny
random-weight GGUFs (resumable journal; the schema arm always parses, drafting keeps greedy tokens)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specq.bench import report, structured as st
from specq.engine import json_schema

REPO = Path(__file__).resolve().parents[1]

DOC = st.Document("fixture", "fixture.txt", (
    st.Field("year", "integer", "a year", 2000),
    st.Field("name", "string", "a name", "Greg Ward"),
    st.Field("ratio", "number", "a ratio", 0.59),
    st.Field("flag", "boolean", "a flag", True),
    st.Field("placeholder", "string", "a placeholder", " [...]"),
))


def test_parse_answer_reads_the_object_out_of_fences_and_prose_and_refuses_the_rest():
    assert st.parse_answer('{"a": 1}') == {"a": 1}
    assert st.parse_answer('Here it is:\n```json\n{"a": {"b": 2}}\n```\nDone.') == {"a": {"b": 2}}
    assert st.parse_answer("[1, 2]") is None  # not an object
    assert st.parse_answer('{"a": 1') is None  # cut short
    assert st.parse_answer("no JSON here") is None


def test_normalisation_is_the_documented_one():
    assert st.same("  Greg   WARD. ", "Greg Ward")
    assert st.same("`[...]`", " [...]")
    assert st.same("2000", 2000) and st.same(2000.0, 2000)
    assert st.same("yes", True) and st.same("False", False)
    assert st.same("Peter A\u030astrand", "Peter Åstrand")  # NFKC: a combining ring is Å
    assert not st.same(1, True)  # a number is not a boolean
    assert not st.same("Greg", "Greg Ward")
    assert not st.same(0.58, 0.59)
    assert st.same("Free Software Foundation, Inc.", "free software foundation, inc")


def test_grade_counts_each_field_and_an_unparseable_answer_as_all_wrong():
    good = json.dumps({"year": "2000", "name": "greg ward", "ratio": 0.59, "flag": "true", "placeholder": "[...]"})
    g = st.grade(DOC, good)
    assert g["parsed"] and all(g["right"].values())
    g = st.grade(DOC, json.dumps({"year": 2001, "name": "Greg Ward"}))  # one wrong, three missing
    assert g["parsed"] and sum(g["right"].values()) == 1 and g["right"]["name"]
    g = st.grade(DOC, "The year is 2000 and the name is Greg Ward.")
    assert not g["parsed"] and not any(g["right"].values())


def _record(arm: str, doc: str, n_right: int, parsed: bool = True, **kw) -> dict:
    rec = {"document": doc, "arm": arm, "settings": {"max_tokens": 160, "mode": "baseline"}, "fields": 5,
           "n_right": n_right, "parsed": parsed, "finish_reason": "stop", "completion_tokens": 40, "ttft_ms": 1000.0,
           "decode_ms": 4000.0, "grammar_ms": None, "accept_rate": None, "prefill_cached": False,
           "loadavg_before": [2.0, 2.0, 2.0], "loadavg_after": [3.0, 2.0, 2.0]}
    rec.update(kw)
    return rec


FIXTURE_RECORDS = [
    _record("schema", "a", 5, grammar_ms=20.0, tokens_sha256="x"), _record("plain", "a", 0, parsed=False, prefill_cached=True),
    _record("schema-draft", "a", 5, grammar_ms=30.0, decode_ms=2000.0, accept_rate=0.5, tokens_sha256="x",
            prefill_cached=True),
    _record("schema", "b", 3, grammar_ms=60.0, ttft_ms=3000.0, tokens_sha256="y", prefill_cached=True),
    _record("plain", "b", 4, finish_reason="length", ttft_ms=5000.0, prefill_cached=True),
    _record("schema-draft", "b", 3, grammar_ms=50.0, decode_ms=2000.0, accept_rate=0.7, tokens_sha256="z", ttft_ms=4000.0),
]


def test_aggregate_gives_accuracy_parse_rate_speed_and_grammar_cost_per_arm():
    rows = {r["arm"]: r for r in st.aggregate(FIXTURE_RECORDS)}
    assert rows["schema"]["field_accuracy"] == 0.8 and rows["schema"]["parse_rate"] == 1.0
    assert rows["plain"]["field_accuracy"] == 0.4 and rows["plain"]["parse_rate"] == 0.5
    assert rows["plain"]["finish_length"] == 1 and rows["plain"]["grammar_ms_per_token"] is None
    # TTFT: only the runs that prefilled (the others restored the document's cached prompt)
    assert rows["schema"]["ttft_ms_median"] == 1000.0 and rows["schema"]["ttft_runs"] == 1
    assert rows["plain"]["ttft_ms_median"] is None and rows["schema-draft"]["ttft_ms_median"] == 4000.0
    assert rows["schema"]["decode_tokens_per_s"] == 10.0 and rows["schema-draft"]["decode_tokens_per_s"] == 20.0
    assert rows["schema"]["grammar_ms_per_token"] == 1.0  # 80 ms over 80 tokens
    assert rows["schema-draft"]["same_tokens_as_undrafted"] == "1/2" and rows["schema-draft"]["accept_rate_mean"] == 0.6


def test_bench_report_renders_the_table_from_a_result_file():
    prov = {"code": {"describe": "abc123def456"}, "host": {"cpu": "Test Xeon", "cores": 2}, "date_utc": "2026-12-06T23:00:00Z"}
    data = st.build_report(FIXTURE_RECORDS, prov, {"arms": ["schema", "plain", "schema-draft"], "max_tokens": 160,
                                                   "mode": "baseline"})
    assert data["loadavg"] == {"start": [2.0, 2.0, 2.0], "end": [3.0, 2.0, 2.0], "max_1min": 3.0}
    results = [report.Result(REPO / "bench" / "results" / "structured-fixture.json", data)]  # (not written)
    doc = "intro\n<!-- report:structured -->\nstale\n<!-- /report:structured -->\nafter\n"
    out = report.render_text(doc, REPO / "docs", results)
    assert "stale" not in out and out.startswith("intro\n") and out.endswith("after\n")
    assert "[structured-fixture.json](../bench/results/structured-fixture.json)" in out
    assert "code `abc123def456`" in out and "Test Xeon, 2 cores" in out and "2.0 → 3.0 (highest after a run 3.0)" in out
    assert re.search(r"\| `schema` \| yes \| none \| 2 \| 8/10 \| \*\*0\.80\*\* \| 1\.00 \| 0 \| 1,000 \(1\) \| 10\.00 \| 1\.00 \|", out)
    assert re.search(r"\| `plain` \| no \| none \| 2 \| 4/10 \| \*\*0\.40\*\* \| 0\.50 \| 1 \|", out)
    assert "| 20.00 | 1.00 | 0.60 | 1/2 |" in out  # schema-draft: decode tok/s, grammar ms/token, acceptance, same tokens
    with pytest.raises(report.ReportError):  # no result: the marker cannot render
        report.render_text(doc, REPO / "docs", [])


def test_the_committed_references_are_well_formed_and_their_strings_are_in_their_documents():
    docs = st.load_documents()
    assert len(docs) >= 10 and all(len(d.fields) == 5 for d in docs)
    names = {d.path for d in docs}
    assert {"examples/python-license.txt", "examples/textwrap.py"} <= names
    for d in docs:
        text = d.text()
        assert 1000 < len(text) < 25000, d.name
        schema = st.schema_for(d)
        json_schema.check(schema)  # the allowlist takes it: the API would too
        for f in d.fields:
            assert f.name in st.question_for(d)
            if f.type == "string":
                assert f.value.strip().casefold() in text.casefold(), (d.name, f.name)


@pytest.mark.engine
def test_a_run_on_tiny_models_journals_each_arm_and_resumes(tiny_models, tmp_path):
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    (tmp_path / "doc.txt").write_text("The year was 2000 and the author was Greg Ward. " * 8)
    doc = st.Document("tiny", "doc.txt", DOC.fields)
    journal = tmp_path / "j.jsonl"
    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=2048, batch_invariant="on"))  # drafted greedy tokens = undrafted ones
    try:
        said: list[str] = []
        records = st.run_structured(eng, [doc], journal, arms=["schema", "plain", "schema-draft"], max_tokens=48,
                                    root=tmp_path, say=said.append)
        assert [r["arm"] for r in records] == ["schema", "plain", "schema-draft"] and len(said) == 3
        assert not any(r["prefill_cached"] for r in records)  # no prompt cache on this engine
        by = {r["arm"]: r for r in records}
        for arm in ("schema", "schema-draft"):  # a random model under the grammar still writes the object
            assert by[arm]["grammar_ms"] is not None and by[arm]["grammar_ms"] >= 0
            if by[arm]["finish_reason"] == "stop":
                assert by[arm]["parsed"]
        assert by["plain"]["grammar_ms"] is None and by["schema"]["mode_ran"] == "baseline"
        # greedy: drafting changes no token
        assert by["schema-draft"]["tokens_sha256"] == by["schema"]["tokens_sha256"]
        assert st.aggregate(records)[2]["same_tokens_as_undrafted"] == "1/1"
        assert by["schema"]["loadavg_before"] is not None
        again = st.run_structured(eng, [doc], journal, arms=["schema", "plain", "schema-draft"], max_tokens=48,
                                  root=tmp_path, say=said.append)
        assert len(again) == 3 and len(said) == 3  # nothing ran twice
    finally:
        eng.close()
    with pytest.raises(ValueError, match="unknown arm"):
        st.run_structured(None, [doc], journal, arms=["nope"])


@pytest.mark.engine
def test_with_the_prompt_cache_only_the_rotating_first_arm_prefills(tiny_models, tmp_path):
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    for name in ("one", "two"):
        (tmp_path / f"{name}.txt").write_text(f"Document {name}: the year was 2000. " * 12)
    docs = [st.Document(n, f"{n}.txt", DOC.fields) for n in ("one", "two")]
    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=2048, cache_bytes=64 << 20))
    try:
        records = st.run_structured(eng, docs, tmp_path / "j.jsonl", arms=["schema", "plain", "schema-draft"],
                                    max_tokens=16, root=tmp_path, say=lambda _: None)
    finally:
        eng.close()
    order = [(r["document"], r["arm"], r["prefill_cached"]) for r in records]
    assert order == [("one", "schema", False), ("one", "plain", True), ("one", "schema-draft", True),
                     ("two", "plain", False), ("two", "schema-draft", True), ("two", "schema", True)]
    rows = {r["arm"]: r for r in st.aggregate(records)}
    assert rows["schema"]["ttft_runs"] == 1 and rows["plain"]["ttft_runs"] == 1 and rows["schema-draft"]["ttft_runs"] == 0
