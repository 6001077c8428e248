"""Issue 48 item 2: keep per band, chosen in sample, certified out of sample (bench/calibrate.keep_plan,
engine/policy/evidence.certified_keep, Engine.prepare). The split of a band's documents by content hash is
deterministic and disjoint; the chosen keep is the smallest that passes on the choosing half, and only it runs on
the certifying half; only the certified rows pass; a job that sets no keep runs the certified keep of its band and
says so, one that sets a keep uses rows of that keep (or smaller, as before) only. The last test runs
`specq calibrate --keep 0.5,1.0` on the tiny random-weight pair into a real SQLite store."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess

import pytest

from evidence_helpers import engine_with_stored_rows, url  # noqa: F401 (a fixture: a migrated store on SQLite and PostgreSQL)
from service_helpers import REPO, specq_cmd
from specq.bench import calibrate as cal
from specq.engine.policy import evidence
from specq.engine.policy.evidence_key import EvidenceKey

KEY = dict(target_sha256="a" * 64, speculator_sha256="b" * 64, backend="cpu", prompt_shape="native", task="lookup",
           positions="original", score_math="numpy", scorer="full", window=0, chunk_rule="border", keep=0.3, max_keep=0,
           chunk=32, lookahead=8, pool=13, selection="global", pipelined=False, protect_tail=-1)


def _questions(docs: int, per: int, length: int = 4096, tokens: int = 3000) -> list[cal.Question]:
    out = []
    for d in range(docs):
        text = f"document {length}-{d}"
        for i in range(per):
            out.append(cal.Question(line=len(out) + 1, document=text, question=f"q{i}", length=length,
                                    doc_sha256=cal.document_sha256(text), tokens=tokens))
    return out


def _record(q: cal.Question, keep: float, agree: bool) -> dict:
    """A unit's journal record as unit_record writes it (the metric values only: what rows_for reads)."""
    return {"doc": q.doc_sha256, "length": q.length, "keep": keep, "doc_tokens": q.tokens, "seconds": 0.1,
            "key": {**KEY, "keep": keep}, "prompt_tokens": q.tokens + 20,
            "values": {"agreement": int(agree), "token_f1": 1.0 if agree else 0.2, "loglik_delta": 0.0 if agree else -0.5}}


def test_the_split_is_deterministic_disjoint_and_by_content_hash():
    qs = _questions(17, 3) + _questions(6, 2, length=8192, tokens=6000)
    halves = cal.split_halves(qs)
    shuffled = qs[:]
    random.Random(7).shuffle(shuffled)
    assert cal.split_halves(shuffled) == halves  # line order does not matter
    for length, n_docs in ((4096, 17), (8192, 6)):
        docs = sorted({q.doc_sha256 for q in qs if q.length == length})
        choose = [d for d in docs if halves[d] == "choose"]
        certify = [d for d in docs if halves[d] == "certify"]
        assert not set(choose) & set(certify) and len(choose) + len(certify) == n_docs
        assert choose == docs[0::2] and certify == docs[1::2]  # sorted by sha256, alternately
    # a document's questions all stay in its half
    assert all(len({halves[q.doc_sha256] for q in qs if q.doc_sha256 == d}) == 1 for d in halves)


def test_the_chosen_keep_is_the_smallest_that_passes_on_the_choosing_half():
    """16 documents x 5: keep 0.1 disagrees everywhere, 0.2 and above agree. The plan runs 0.1, then 0.2 on the
    choosing half, chooses 0.2, never runs 0.3 or 0.5, and runs 0.2 alone on the certifying half."""
    qs = _questions(16, 5)
    keeps = [0.5, 0.1, 0.3, 0.2]  # any order given: tried smallest first
    halves = cal.split_halves(qs)
    units: dict[str, dict] = {}
    bands, plan, left = cal.keep_plan(qs, keeps, units)
    assert {(k, role) for _, k, role in plan} == {(0.1, "choose")} and len(plan) == 40
    assert left == 40 * 4 + 40  # at most: every keep on the choosing half, then the certifying half once
    assert bands[0].stage == "choosing" and bands[0].chosen is None
    for q, k, _ in plan:
        units[q.unit_id(k)] = _record(q, k, agree=False)
    bands, plan, _ = cal.keep_plan(qs, keeps, units)
    assert bands[0].tried[0]["keep"] == 0.1 and bands[0].tried[0]["passes"] is False
    assert "agreement lower bound" in bands[0].tried[0]["why"]
    assert {(k, role) for _, k, role in plan} == {(0.1, "choose"), (0.2, "choose")}
    for q, k, _ in plan:
        units.setdefault(q.unit_id(k), _record(q, k, agree=k >= 0.2))
    bands, plan, _ = cal.keep_plan(qs, keeps, units)
    b = bands[0]
    assert b.chosen == 0.2 and b.stage == "certifying" and [t["keep"] for t in b.tried] == [0.1, 0.2]
    certify = [(q, k) for q, k, role in plan if role == "certify"]
    assert len(certify) == 40 and {k for _, k in certify} == {0.2}
    assert all(halves[q.doc_sha256] == "certify" for q, _ in certify)
    assert all(halves[q.doc_sha256] == "choose" for q, _, role in plan if role == "choose")
    assert not any(k in (0.3, 0.5) for _, k, _ in plan)  # larger keeps never run, on either half
    for q, k in certify:
        units[q.unit_id(k)] = _record(q, k, agree=True)
    bands, plan, left = cal.keep_plan(qs, keeps, units)
    assert bands[0].stage == "certified" and left == 0
    assert set(b.choosing).isdisjoint(b.certifying) and len(b.choosing) == len(b.certifying) == 8


def _rows(certified_keep: float = 0.2, in_sample_keeps=(0.1, 0.2)) -> list[evidence.EvidenceRow]:
    """A band's rows as a several-keep calibration writes them: the choosing half's (in-sample) and the certifying
    half's (certified), both 8 documents x 5 questions that agree."""
    qs = _questions(16, 5)
    halves = cal.split_halves(qs)
    out = []
    for k in in_sample_keeps:
        recs = [_record(q, k, agree=True) for q in qs if halves[q.doc_sha256] == "choose"]
        out += [evidence.row_from_dict(r) for r in cal.rows_for(recs, source="j", provenance={}, in_sample_why="choosing half")]
    recs = [_record(q, certified_keep, agree=True) for q in qs if halves[q.doc_sha256] == "certify"]
    out += [evidence.row_from_dict(r) for r in cal.rows_for(recs, source="j", provenance={}, certified=True)]
    return out


def test_only_the_certified_rows_pass_and_a_job_without_keep_gets_their_keep():
    rows = _rows()
    assert all(r.passes for r in rows if r.certified) and not any(r.passes for r in rows if not r.certified)
    assert all(r.fails_bar().startswith("in-sample (choosing half") for r in rows if r.in_sample)
    job = EvidenceKey(**{**KEY, "keep": 0.3})  # the job's keep is ignored: it set none
    choice = evidence.certified_keep(rows, job, 3100, default=0.3)
    assert choice.keep == 0.2 and choice.rows and all(r.certified for r in choice.rows)
    assert choice.why.startswith("keep 0.2 (certified for 4,096-token documents on 8 documents")
    # outside the band's documents (+ the question allowance): the default, and why
    far = evidence.certified_keep(rows, job, 3000 + evidence.QUESTION_ALLOWANCE + 1, default=0.3)
    assert far.keep == 0.3 and not far.rows and "no certified keep at 3,257 tokens" in far.why
    # another setting (chunk): no certified keep for it
    assert not evidence.certified_keep(rows, dataclasses.replace(job, chunk=16), 3100, default=0.3).rows
    # a job that declares no task needs every kind's certified keep
    undeclared = evidence.certified_keep(rows, dataclasses.replace(job, task=None), 3100, default=0.3)
    assert undeclared.keep == 0.3 and "for two-place questions" in undeclared.why
    # the lookup at the certified keep: the certified rows stand at their length (not the in-sample ones beside them)
    bands, why = evidence.lookup(rows, dataclasses.replace(job, keep=0.2))
    assert not why and len(bands) == 1 and all(r.certified for r in bands[0].rows)
    assert bands[0].covers(3100)


def test_a_job_with_an_explicit_keep_uses_rows_of_that_keep_or_smaller_only():
    rows = _rows(certified_keep=0.3, in_sample_keeps=(0.1, 0.2, 0.3))
    job = EvidenceKey(**KEY)
    for keep in (0.1, 0.2):  # below the certified keep: only in-sample rows of its keep or smaller, which never pass
        bands, why = evidence.lookup(rows, dataclasses.replace(job, keep=keep))
        assert bands == () and "in-sample (choosing half)" in why, why
    bands, why = evidence.lookup(rows, dataclasses.replace(job, keep=0.05))  # below every row's: the reason names keep
    assert bands == () and "no evidence for keep=0.05 (passing rows have keep=0.3" in why, why
    bands, why = evidence.lookup(rows, dataclasses.replace(job, keep=0.5))  # keep >= the row's, as before
    assert bands and all(r.certified and r.key.keep == 0.3 for r in bands[0].rows)


def test_a_row_cannot_be_both_certified_and_in_sample():
    row = _rows()[-1].as_dict()
    with pytest.raises(ValueError, match="certified: a certified row is measured out of sample"):
        evidence.row_from_dict({**row, "in_sample": True})
    with pytest.raises(ValueError, match="certified: must be true or false"):
        evidence.row_from_dict({**row, "certified": "yes"})
    # an in-sample row and a certified one of the same key and length are both kept by merge
    rows = _rows(in_sample_keeps=(0.2,))
    assert len(evidence.merge((), rows)) == len(rows)


def test_run_params_keep_is_optional_and_still_bounded():
    from specq.api.schemas import RunParamsIn
    from specq.contracts import InputError
    from specq.engine.options import RunParams

    assert RunParams().keep is None and RunParams.from_dict({"keep": None}).keep is None
    assert RunParams.from_dict({"keep": 0.2}).keep == 0.2
    for bad in (0, 1.5, -0.1, float("nan")):
        with pytest.raises(InputError, match="keep must be"):
            RunParams.from_dict({"keep": bad})
    assert RunParamsIn.model_validate({"keep": None}).keep is None
    assert RunParamsIn.model_validate({}).model_dump(exclude_unset=True) == {}
    for bad in (0, 2.0):
        with pytest.raises(Exception, match="keep"):
            RunParamsIn.model_validate({"keep": bad})


def _docs(path, docs: int, per: int) -> None:
    with path.open("w") as f:
        for d in range(docs):
            text = "".join(f"doc {d} line {i}: the value of item {i} is {(i * 7 + d) % 13}.\n" for i in range(3))
            for q in range(per):
                f.write(json.dumps({"text": text, "question": f"What is the value of item {q + 1}?"}) + "\n")


@pytest.mark.engine
def test_calibrate_several_keeps_chooses_certifies_and_auto_runs_the_certified_keep(tmp_path, tiny_models):
    """`specq calibrate --keep 0.5,1.0` on 16 documents x 5 questions (tiny pair, --local): the halves are 8 and 8
    documents, disjoint; the chosen keep is the smallest that passed on the choosing half (keep 1.0 keeps every
    token, so the arms agree and it passes by construction; 0.5 may or may not); the certifying half ran at the
    chosen keep only; only certified rows pass. Then an engine with the store's rows: a job that sets no keep runs
    the certified keep and its result says so; a job whose keep is below every row's runs baseline naming keep; an
    explicit mode specprefill without keep runs 0.3 (spec.keep_source "default")."""
    from service_helpers import base_env

    env = base_env(tmp_path / "home", tiny_models, SPECQ_CACHE_BYTES="0", SPECQ_THREADS="1")
    f, journal = tmp_path / "qs.jsonl", tmp_path / "j.jsonl"
    _docs(f, 16, 5)
    r = subprocess.run(specq_cmd("calibrate", "--documents", str(f), "--keep", "1.0,0.5", "--max-tokens", "4",
                                 "--lengths", "1024", "--journal", str(journal), "--local", "--json"),
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    (band,) = report["keep_per_band"]
    assert len(band["choosing_documents"]) == len(band["certifying_documents"]) == 8
    assert set(band["choosing_documents"]).isdisjoint(band["certifying_documents"])
    tried = band["tried"]
    assert [t["keep"] for t in tried] == sorted(t["keep"] for t in tried) and tried[0]["keep"] == 0.5
    chosen = next(t["keep"] for t in tried if t["passes"])
    assert band["chosen"] == chosen and all(t["passes"] is False for t in tried if t["keep"] < chosen)
    assert band["stage"] == "certified" and band["certified"]["keep"] == chosen and band["certified"]["passes"]
    # the journal: the certifying half ran at the chosen keep only, the choosing half at no keep above it
    units = [json.loads(line) for line in journal.read_text().splitlines() if '"unit"' in line]
    cert = set(band["certifying_documents"])
    assert {u["keep"] for u in units if u["doc"] in cert} == {chosen}
    assert {u["keep"] for u in units if u["doc"] not in cert} == {t["keep"] for t in tried}
    assert report["ran"] == len(units) == 40 * len(tried) + 40
    # rows: the choosing half's are in-sample and never pass; the certifying half's are certified and pass
    by_role = {role: [w for w in report["rows"] if w["role"] == role] for role in ("choose", "certify")}
    assert by_role["choose"] and all(w["in_sample"] and not w["passes"] and not w["certified"] for w in by_role["choose"])
    assert by_role["certify"] and all(w["certified"] and w["passes"] and w["key"]["keep"] == chosen for w in by_role["certify"])
    assert all(set(w["documents"]) <= cert for w in by_role["certify"])
    assert {line["role"] for line in report["table"]} == {"choose", "certify"}
    # the text table says the same
    text = subprocess.run(specq_cmd("calibrate", "--documents", str(f), "--keep", "1.0,0.5", "--max-tokens", "4",
                                    "--lengths", "1024", "--journal", str(journal), "--local"),
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0 and "\tchoosing (in-sample)\t" in text.stdout and "\tcertifying\t" in text.stdout
    tried_text = ", ".join(f"{t['keep']:g} {'pass' if t['passes'] else 'no'}" for t in tried)
    assert f"1024\t{tried_text}\t{chosen:g}\t8 docs, 40 q\t8 docs, 40 q\tpasses\n" in text.stdout, text.stdout
    assert "0 questions run now" in text.stderr  # resumed from the journal: nothing ran again

    from specq.engine.options import RunParams

    e = engine_with_stored_rows(env, f"sqlite:///{tmp_path / 'home' / 'specq.sqlite'}")
    try:
        doc = "".join(f"doc 5 line {i}: the value of item {i} is {(i * 7 + 5) % 13}.\n" for i in range(3))
        q = "What is the value of item 6?"
        res = e.run(doc, RunParams(question=q, max_tokens=4, task="lookup"))
        assert res.spec.mode == "specprefill", res.spec.reason
        assert res.spec.keep == chosen and res.spec.keep_source == "certified"
        assert f"keep unset: keep {chosen:g} (certified for 1,024-token documents on 8 documents" in res.spec.reason
        assert res.to_dict()["spec"]["keep_source"] == "certified"
        # the keep really ran: the same kept tokens as a job that sets it, and through the serving loop too
        same = e.run(doc, RunParams(question=q, keep=chosen, max_tokens=4, task="lookup"))
        assert same.spec.keep_source == "job" and same.usage.kept_tokens == res.usage.kept_tokens
        assert same.kept_indices == res.kept_indices and same.tokens == res.tokens
        from specq.engine.serving.loop import ServingEngine

        loop = ServingEngine(e).start()
        try:
            served = loop.run(doc, RunParams(question=q, max_tokens=4, task="lookup"))
        finally:
            loop.close()
        assert (served.spec.mode, served.spec.keep, served.spec.keep_source) == ("specprefill", chosen, "certified")
        assert served.usage.kept_tokens == res.usage.kept_tokens and "keep unset: keep" in served.spec.reason
        # an explicit keep below every row's: baseline, naming keep
        _, mode, _, _, _, spec = e.prepare(doc, RunParams(question=q, keep=0.4, max_tokens=4, task="lookup"))
        assert mode == "baseline" and "keep=0.4" in spec.reason, spec.reason
        # an explicit keep: the job's, and no keep note
        _, mode, _, _, _, spec = e.prepare(doc, RunParams(question=q, keep=1.0, max_tokens=4, task="lookup"))
        assert mode == "specprefill" and spec.keep_source == "job" and "keep unset" not in spec.reason
        # explicit mode specprefill without keep: the default 0.3, and the reason says so
        res = e.run(doc, RunParams(question=q, mode="specprefill", min_tokens=0, max_tokens=4))
        assert res.spec.keep == 0.3 and res.spec.keep_source == "default" and res.spec.reason == "asked for"
    finally:
        e.close()


def test_certified_rows_round_trip_through_the_store_and_migration_0010_goes_down_and_up(url):
    from alembic import command
    from sqlalchemy import inspect

    from specq.storage import db, evidence as store

    rows = _rows(in_sample_keeps=(0.2,))
    with db.session(url) as s:
        store.add_rows(s, [r.as_dict() for r in rows])
        back = [evidence.row_from_dict(d) for d in store.list_rows(s)]
    assert sorted((r.metric, r.in_sample, r.certified) for r in back) == sorted((r.metric, r.in_sample, r.certified) for r in rows)
    assert evidence.certified_keep(back, EvidenceKey(**KEY), 3100, default=0.3).keep == 0.2
    cfg = db.alembic_config(url)
    with db.get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0009")
    assert "certified" not in {c["name"] for c in inspect(db.get_engine(url)).get_columns("quality_evidence")}
    assert db.upgrade(url) == db.head_revision()
    with db.session(url) as s:  # the rows stay, none certified any more (the column's default)
        again = store.list_rows(s)
    assert len(again) == len(rows) and not any(d["certified"] for d in again)
