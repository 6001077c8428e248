"""`specq bench labelfree` (issue 48 item 5): the label-free metrics against answer-right labels, counted on small
hand-made journals written to real files, and the docs table it renders."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specq.bench import labelfree as lf
from specq.bench import report
from specq.bench.quality_report import read_journal
from specq.cli import app

REPO = Path(__file__).resolve().parents[1]


def answer(task: str, family: str, base: tuple[str, bool], arm: tuple[str, bool], key: str = "k1", closed: bool = False, **extra):
    """A `specq bench quality` answer record (half: answer) as run_answer writes it."""
    return {"half": "answer", "settings_key": key, "task": task, "kind": "multikey", "length": 4000, "family": family,
            "settings": {"keep": 0.3, "scorer": "windowed", "chunk_rule": "border"}, "closed_book": {"text": "?", "correct": closed},
            "baseline": {"text": base[0], "correct": base[1]}, "specprefill": {"text": arm[0], "correct": arm[1]}, **extra}


def unit(uid: str, doc: str, base: str, arm: str, base_right, arm_right, full: float, sparse: float):
    """A `specq calibrate` unit line (engine/calibration.py's record)."""
    return {"settings_key": "cal", "unit": uid, "doc": doc, "length": 2048, "keep": 0.3, "question": "q?",
            "baseline": {"text": base}, "specprefill": {"text": arm}, "loglik_full": full, "loglik_sparse": sparse,
            "key": {"task": "lookup", "keep": 0.3}, "baseline_right": base_right, "arm_right": arm_right}


def write(path: Path, records: list[dict], torn: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn, encoding="utf-8")
    return path


@pytest.fixture
def journals(tmp_path):
    fam = write(tmp_path / "q-families-answer-4000.jsonl", [
        answer("A-q0", "famA", ("42", True), ("42.", True)),                    # both right, agree (normalised)
        answer("A-q1", "famA", ("7", True), ("9", False)),                      # harm
        answer("A-q2", "famA", ("1", False), ("5", True)),                      # gain
        answer("B-q0", "famB", ("the red fox", True), ("the red dog", False)),  # harm, token F1 2/3
        answer("B-q1", "famB", ("a b c", True), ("a b c d", True)),             # both right, disagree, F1 6/7
        answer("B-q2", "famB", ("x", True), ("y", False), closed=True),         # closed-book right: left out
        {**answer("B-q3", "famB", ("x", True), ("y", False)), "specprefill": None},  # one arm: left out
    ], torn='{"half": "answer", "task": "B-q4", "bas')
    border = write(tmp_path / "q-border-answer-4000.jsonl", [
        answer("A-q0", "famA", ("42", True), ("42", True)),                     # same settings and task: a duplicate
        answer("A-q3", "famA", ("3", True), ("4", False), key="k2"),            # another arm, but a document chosen on
        answer("C-q0", "famC", ("11", True), ("12", False), key="k2"),          # harm
        answer("C-q1", "famC", ("13", True), ("13", True), key="k2"),           # both right
        answer("C-q2", "famC", ("x", False), ("y", False), key="k2"),           # both wrong, changed
        {**answer("C-q3", "famC", ("s", True), ("t", True), key="k2"), "kind": "summary",
         "baseline": {"text": "s", "correct": None}, "specprefill": {"text": "t", "correct": None}},  # ungraded
    ])
    cal = write(tmp_path / "cal.jsonl", [
        unit("u1", "d1", "It is `GetoptError`.", "It is `GetoptError`.", True, True, -0.10, -0.11),   # delta -0.01
        unit("u2", "d1", "It is `-u`.", "It is `--reflink`.", True, False, -0.10, -0.60),              # harm, -0.5
        unit("u3", "d2", "It is `glob`.", "It is `glob`.", True, True, -0.30, -0.50),                   # both right, -0.2
        unit("u4", "d2", "x", "y", None, None, -0.1, -0.1),                                             # no reference
        {"settings_key": "cal", "posted": "2048:0.3:x", "ids": ["ev_1"]},
    ])
    return fam, border, cal


def test_reading_labels_each_graded_question_once_and_counts_what_it_leaves_out(journals):
    fam, border, cal = journals
    questions, meta = lf.read_questions([fam, border, cal])
    by = {q.key[2]: q for q in questions}
    assert sorted(by) == ["A-q0", "A-q1", "A-q2", "A-q3", "B-q0", "B-q1", "C-q0", "C-q1", "C-q2", "u1", "u2", "u3"]
    assert [by[k].label for k in ("A-q0", "A-q1", "A-q2", "C-q2", "u2")] == ["both-right", "harm", "gain", "both-wrong", "harm"]
    assert by["A-q0"].journal == str(fam)  # the first journal given keeps a duplicate
    assert by["A-q0"].values == {"agreement": 1, "token_f1": 1.0}
    assert by["B-q0"].values["token_f1"] == pytest.approx(2 / 3)
    assert by["u2"].values["loglik_delta"] == pytest.approx(-0.5) and by["u1"].document == "d1"
    assert "loglik_delta" not in by["C-q0"].values
    m = {Path(j["path"]).name: j for j in meta}
    assert (m[fam.name]["questions"], m[fam.name]["closed-book right"], m[fam.name]["without both arms"]) == (5, 1, 1)
    assert (m[border.name]["questions"], m[border.name]["duplicates"], m[border.name]["ungraded"]) == (4, 1, 1)
    assert (m[cal.name]["questions"], m[cal.name]["ungraded"]) == (3, 1)


def test_confusion_counts_caught_missed_false_alarms_and_documents(journals):
    questions, _ = lf.read_questions(journals[:1])
    c = lf.confusion(questions, "token_f1", 0.7)  # alarms: A-q1 (0), A-q2 (0), B-q0 (2/3)
    assert (c["n"], c["harms"], c["caught"], c["missed"]) == (5, 2, 2, 0)
    assert (c["false_alarms"], c["false_alarms_both_right"], c["false_alarms_other"], c["quiet"]) == (1, 0, 1, 2)
    assert c["catch_rate"] == 1.0 and c["false_alarm_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert c["documents"] == {"n": 2, "with_harm": 2, "harm_caught": 2, "without_harm": 0, "false_alarm": 0}
    a = lf.confusion(questions, "agreement", 0.9)  # B-q1 (both right, answers differ) is a false alarm of agreement
    assert (a["caught"], a["false_alarms_both_right"], a["false_alarms_other"], a["quiet"]) == (2, 1, 1, 1)
    # loglik_delta: only the calibrate units carry it; documents are the units' content hashes
    qs, _ = lf.read_questions(journals)
    ll = lf.confusion(qs, "loglik_delta", -0.1)
    assert (ll["n"], ll["caught"], ll["false_alarms_both_right"], ll["quiet"]) == (3, 1, 1, 1)
    assert ll["documents"] == {"n": 2, "with_harm": 1, "harm_caught": 1, "without_harm": 1, "false_alarm": 1}


def test_threshold_choice_maximises_youden_j_and_breaks_ties_toward_fewer_alarms():
    def q(i: int, lab: str, v: float) -> lf.Question:
        return lf.Question("j", ("quality", "k", str(i)), f"d{i}", "multikey", 4000, 0.3, lab, {"token_f1": v})

    qs = [q(0, "harm", 0.2), q(1, "both-right", 0.5), q(2, "harm", 0.8), q(3, "both-right", 0.9)]
    # < 0.5: catch 1/2, FA 0 (J 0.5); < 0.8: 1/2, 1/2 (J 0); < 0.9: 2/2, 1/2 (J 0.5): the tie goes to 0.5
    got = lf.choose(qs, "token_f1")
    assert got["threshold"] == 0.5 and got["youden_j"] == 0.5 and got["caught"] == 1
    assert lf.choose([x for x in qs if x.label != "harm"], "token_f1") is None  # nothing to catch: no choice
    r = lf.row_means([q(0, "both-right", 1.0), q(1, "both-right", 1.0), q(2, "gain", 1.0), q(3, "both-wrong", 0.9),
                      q(4, "harm", 0.0)], "token_f1")
    assert r["non_harm_mean"] == 0.975 and r["harm_mean"] == 0.0 and r["at_harm_rate"]["0.1"] == pytest.approx(0.8775)
    assert r["harm_rate_at_bar"] == pytest.approx(0.075 / 0.975, abs=1e-4) and not r["fails_at_zero_harm"]


def test_chosen_on_one_set_checked_on_another_without_its_documents(journals):
    fam, border, cal = journals
    rep = lf.build([fam, border, cal], choose_on=["*families*"], check_on=["*border*"])
    assert rep["choosing"] == {"questions": 5, "documents": 2, "harms": 2}
    assert rep["checking"] == {"questions": 3, "documents": 1, "harms": 1, "left_out_shared_documents": 1}
    assert [j["role"] for j in rep["journals"]] == ["choose", "check", "unused"]
    ag = rep["metrics"]["agreement"]["chosen"]
    assert ag["threshold"] == 1 and ag["youden_j"] == pytest.approx(1 - 2 / 3, abs=1e-4)  # < 1: 2/2 caught, 2/3 false alarms
    assert (ag["check"]["caught"], ag["check"]["harms"], ag["check"]["false_alarms"], ag["check"]["non_harm"]) == (1, 1, 1, 2)
    f1 = rep["metrics"]["token_f1"]["chosen"]
    assert f1["threshold"] == pytest.approx(6 / 7, abs=1e-6) and f1["choose"]["false_alarms"] == 1  # only the gain
    assert rep["metrics"]["loglik_delta"]["chosen"] is None and rep["metrics"]["loglik_delta"]["questions"] == 3
    assert rep["labels"] == {"harm": 5, "gain": 1, "both-right": 5, "both-wrong": 1}
    row = next(r for r in rep["rows"] if r["journal"] == str(fam))
    assert (row["n"], row["harm"], row["gain"], row["answer_ratio"]) == (5, 2, 1, 0.75)
    # the default check set is every other journal: the calibrate units come in, and loglik_delta can be chosen on them
    rep = lf.build([fam, border, cal], choose_on=["cal.jsonl"])
    assert rep["metrics"]["loglik_delta"]["chosen"]["threshold"] == pytest.approx(-0.2)
    assert rep["checking"]["questions"] == 9


def test_a_family_named_with_its_hash_elsewhere_is_one_document_in_every_journal(journals, tmp_path):
    """A newer journal records each question's doc_sha256 beside its family, the older ones only the family: the
    same document is one document, so a newer question about a choosing-set document stays out of the check set."""
    fam, border, _ = journals
    newer = write(tmp_path / "q-border-k0.1-answer-4000.jsonl", [
        answer("A-q1", "famA", ("7", True), ("8", False), key="k3", doc_sha256="a" * 64),   # famA: chosen on
        answer("D-q0", "famD", ("5", True), ("6", False), key="k3", doc_sha256="d" * 64),   # a new document
    ])
    rep = lf.build([fam, border, newer], choose_on=["*families*"])
    assert rep["checking"]["left_out_shared_documents"] == 2  # border's A-q3 and the newer A-q1
    assert rep["checking"]["questions"] == 4 and rep["checking"]["documents"] == 2  # famC's three, famD's one
    assert rep["documents"] == 4  # famA, famB, famC, famD: famA counted once, not once by name and once by hash
    # a family given two different hashes is not merged: its records keep their own hashes
    other = write(tmp_path / "q-other-answer-4000.jsonl", [
        answer("A-q9", "famA", ("1", True), ("1", True), key="k4", doc_sha256="b" * 64)])
    records = [r for path in (fam, border, newer, other) for r in read_journal(path)]
    assert "famA" not in lf.families_with_one_document(records)


def test_wilson_interval():
    assert lf.wilson(0, 0) is None
    lo, hi = lf.wilson(5, 10, z=1.959964)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert lf.wilson(0, 10)[0] == 0.0 and lf.wilson(10, 10)[1] == 1.0


def test_the_command_writes_a_report_with_provenance_that_the_docs_table_renders(journals, tmp_path):
    fam, border, cal = journals
    out = tmp_path / "labelfree-vs-labels-2026-12-07.json"
    got = CliRunner().invoke(app, ["bench", "labelfree", "--journals", f"{fam},{border},{cal}", "--choose-on", "*families*",
                                   "--out", str(out)])
    assert got.exit_code == 0, got.output
    assert "5 harm, 1 gain, 5 both right, 1 both wrong" in got.output
    data = json.loads(out.read_text())
    assert data["benchmark"] == "labelfree" and data["provenance"]["code"]["describe"]
    r = report.Result(REPO / "bench" / "results" / out.name, data)  # (as if written there: its link is relative to the docs)
    assert r.kind == "labelfree"
    text = report.labelfree_table([r], REPO / "docs")
    assert "**5 harm**" in text and "| `agreement` | < 1.00 | check (chosen on the other set) | 6 (3) | 2 / 2" in text
    missing = CliRunner().invoke(app, ["bench", "labelfree", "--journals", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code != 0 and "no such file" in missing.output


def test_docs_quality_holds_the_rendered_labelfree_table_and_a_changed_result_changes_it():
    results = report.load_results()
    doc = (REPO / "docs" / "quality.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- report:labelfree -->\n(.*?)<!-- /report:labelfree -->", doc, re.S)
    assert m, "docs/quality.md has no labelfree table"
    rendered = report.labelfree_table(results, REPO / "docs")
    assert m.group(1).rstrip("\n") == rendered
    r = max((r for r in results if r.kind == "labelfree"), key=lambda r: (r.date, r.rel))
    data = copy.deepcopy(r.data)
    data["labels"]["harm"] = 999
    changed = [report.Result(x.path, data) if x is r else x for x in results]
    assert "**999 harm**" in report.labelfree_table(changed, REPO / "docs") and "**999 harm**" not in rendered
