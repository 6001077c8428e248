"""The task kinds beyond lookups (issue 49): questions derived with `ast` from real code, their references, their
graders, the document catalogue and the kind x length table. No model runs here (the kinds' end-to-end run on
the real pair is recorded in docs/quality.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specq.bench import quality as q
from specq.bench import quality_documents as qd
from specq.bench import quality_grade as qg
from specq.bench import quality_kinds as qk
from specq.bench.quality_report import MIN_BASELINE_RIGHT, kind_rows, table_markdown
from specq.bench.quality_tasks import stdlib_dir
from specq.cli import app

ROOT = Path(__file__).resolve().parents[1]

#: a hand-made module whose answers are known by reading it
SOURCE = '''\
import socket


class Client:
    def connect(self, host, timeout=None):
        sock = self._open(host, timeout)
        if sock is None:
            raise ConnectionError("no route")
        return sock

    def _open(self, host, timeout):
        if timeout is not None and timeout < 0:
            raise ValueError("negative timeout")
        return socket.create_connection((host, 80), timeout)

    def reconnect(self, host):
        self.close()
        return self._open(host, 5)

    def close(self):
        pass


def fetch(url, retries):
    for attempt in range(retries):
        if attempt >= retries:
            break
        if url in CACHE:
            return CACHE[url]
        if not url:
            raise KeyError(url)
    helper(url)
    return None


def helper(url):
    return url.strip()


CACHE = {}
'''

count4 = lambda s: len(s) // 4  # noqa: E731 - a tokenizer stand-in: windows only need a monotone count


def by_kind(tasks, kind, qtype=None):
    return [t for t in tasks if t.kind == kind and (qtype is None or t.meta.get("question_type") == qtype)]


def test_references_of_a_hand_made_module_are_what_reading_it_gives():
    tasks = qk.questions(SOURCE, 400, "hand-made", per_kind=3)
    two = by_kind(tasks, "two-place")
    assert [(t.meta["target"], t.meta["reference"]) for t in two] == [("_open", ["connect", "reconnect"])]
    (count,) = by_kind(tasks, "aggregation", "count")
    assert (count.meta["param"], count.meta["reference"], count.meta["functions"]) == ("timeout", 2, ["connect", "_open"])
    (raises,) = by_kind(tasks, "aggregation", "raises")
    assert raises.meta["reference"] == ["ConnectionError", "KeyError", "ValueError"]
    reviews = by_kind(tasks, "review")
    assert {t.meta["function"] for t in reviews} == {"connect", "_open", "fetch"}
    for t in reviews:  # each flip is one comparison of its function, and flipping it back gives the original line
        assert t.meta["reference"] in t.document and t.meta["original"] in SOURCE and t.meta["original"] not in t.document
    doc_lines = reviews[0].document.splitlines()
    assert len(doc_lines) == len(SOURCE.splitlines())
    assert sum(a != b for a, b in zip(doc_lines, SOURCE.splitlines())) == len(reviews)
    # every question is asked on the one document with the flips (one prefill for all of them)
    assert {t.document for t in tasks} == {reviews[0].document}
    (summ,) = by_kind(tasks, "summary")
    assert (summ.meta["function"], summ.meta["reference"]) == ("fetch", ["url", "retries", "helper"])


def test_evidence_spans_hold_what_the_answer_needs():
    tasks = qk.questions(SOURCE, 400, "hand-made", per_kind=3)
    for t in tasks:
        text = [t.document[a:b] for a, b in t.evidence]
        if t.kind == "two-place":
            assert sorted(x.strip()[:10] for x in text) == ["def _open(", "return sel", "sock = sel"]
            assert all("_open(" in x for x in text)
        elif t.meta.get("question_type") == "count":
            assert all("timeout" in x and "def " in x for x in text)
        elif t.meta.get("question_type") == "raises":
            assert all(x.strip().startswith("raise ") for x in text)
        elif t.kind == "review":
            assert text == [t.document[t.evidence[0][0]: t.evidence[0][1]]] and t.meta["reference"] in text[0]
        else:
            assert text[0].startswith("def fetch(") and text[0].rstrip().endswith("return None")
        assert 0.1 <= t.depth <= 0.9


def test_a_real_stdlib_file_gives_every_kind_deterministically_and_its_references_hold():
    text = (stdlib_dir() / "shutil.py").read_text(encoding="utf-8")
    wins = qk.windows(text, 4000, count4)
    assert wins and all(count4("".join(text.splitlines(keepends=True)[a:b])) <= 4000 for a, b in wins)
    lines = text.splitlines(keepends=True)
    docs = ["".join(lines[a:b]) for a, b in wins]
    first = [qk.questions(d, 4000, f"shutil {i}") for i, d in enumerate(docs)]
    again = [qk.questions(d, 4000, f"shutil {i}") for i, d in enumerate(docs)]
    assert [[t.describe() for t in ts] for ts in first] == [[t.describe() for t in ts] for ts in again]
    tasks = [t for ts in first for t in ts]
    assert {"two-place", "aggregation", "review", "summary"} <= {t.kind for t in tasks}
    for t in tasks:  # each reference checked against the text by other means than the generator's
        if t.kind == "two-place":
            for name in t.meta["reference"]:
                body = body_of(t.document, name)
                assert re.search(rf"\b{t.meta['target']}\(", body), (name, t.meta["target"])
        elif t.meta.get("question_type") == "count":
            sigs = re.findall(r"def \w+\(([^)]*)\)", t.document)
            assert t.meta["reference"] == sum(bool(re.search(rf"\b{t.meta['param']}\b", s)) for s in sigs)
        elif t.meta.get("question_type") == "raises":
            assert all(re.search(rf"raise (\w+\.)?{n}\b", t.document) for n in t.meta["reference"])
        elif t.kind == "review":
            assert t.document.count(t.meta["reference"]) == 1 and t.meta["original"] in text


def body_of(text: str, name: str) -> str:
    """The lines of `def name(` up to the next line indented no deeper than it (by indentation, not by ast)."""
    lines = text.splitlines()
    i = next(i for i, x in enumerate(lines) if x.lstrip().startswith(f"def {name}("))
    indent = len(lines[i]) - len(lines[i].lstrip())
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent or lines[j].lstrip()[:1] in ")"):
        j += 1
    return "\n".join(lines[i:j])


@pytest.mark.parametrize("kind, answer, right", [
    ("two-place", "connect, reconnect", True),
    ("two-place", "The function _open is called by `connect` and by `reconnect`.", True),  # verbose, names the target
    ("two-place", "connect", False),  # partly right
    ("two-place", "connect, reconnect, close", False),  # a wrong extra
    ("count", "2", True), ("count", "There are two such functions.", True), ("count", "3", False), ("count", "none", False),
    ("raises", "ValueError, KeyError, ConnectionError", True),
    ("raises", "It raises ValueError and KeyError.", False),  # partly
    ("raises", "ValueError, KeyError, ConnectionError, TypeError", False),  # a wrong extra
])
def test_set_and_count_graders(kind, answer, right):
    tasks = qk.questions(SOURCE, 400, "hand-made", per_kind=3)
    t = by_kind(tasks, "two-place")[0] if kind == "two-place" else by_kind(tasks, "aggregation", kind)[0]
    assert qg.grade(t, answer).right is right


def test_review_grader_judges_the_line_only():
    t = next(t for t in qk.questions(SOURCE, 400, "hand-made", per_kind=3) if t.kind == "review" and t.meta["function"] == "fetch")
    bug, orig = t.meta["reference"], t.meta["original"]
    assert qg.grade(t, f"The bug is on this line:\n```python\n    {bug}\n```\nIt should be `{orig}`.").right
    assert qg.grade(t, f"`{orig}`").right  # quoting the line as it should be points at the same line
    assert not qg.grade(t, "The loop is wrong: `for attempt in range(retries):`").right  # another line
    whole = "\n".join(t.meta["function_lines"])
    assert not qg.grade(t, f"Here is the function:\n{whole}").right  # quoting everything points at nothing


def test_summary_is_graded_by_the_identifiers_it_names_never_answer_right():
    t = by_kind(qk.questions(SOURCE, 400, "hand-made", per_kind=3), "summary")[0]
    g = qg.grade(t, "fetch tries `retries` times to look the url up in CACHE, then calls helper.")
    assert g.right is None and g.score == 1.0 and g.fidelity is None
    assert qg.grade(t, "It fetches a URL.").score == 0.0  # "URL" is not the parameter `url`
    assert qg.grade(t, "Looks url up; calls helper.").score == pytest.approx(2 / 3)


def test_the_committed_catalogue_keeps_tuning_and_reported_apart_and_refuses_other_files(tmp_path):
    entries = qd.load_catalogue()
    assert {e.split for e in entries} == {"tuning", "reported"}
    assert {e.origin for e in entries if e.split == "reported"} == {"stdlib", "dependency"}
    reported = {e.sha256 for e in entries if e.split == "reported"}
    assert not reported & {e.sha256 for e in entries if e.split == "tuning"}
    import platform

    path = stdlib_dir() / "shlex.py"
    good = qd.SourceFile("stdlib:shlex.py", "stdlib", "shlex.py", platform.python_version(), qd.sha256_of(path), "tuning")
    assert qd.resolve(good) == path.read_text(encoding="utf-8")
    with pytest.raises(qd.DocumentError, match="sha256"):
        qd.resolve(qd.SourceFile(good.id, "stdlib", "shlex.py", good.version, "0" * 64, "tuning"))
    with pytest.raises(qd.DocumentError, match="catalogued from Python 2.7"):
        qd.resolve(qd.SourceFile(good.id, "stdlib", "shlex.py", "2.7", good.sha256, "tuning"))
    both = tmp_path / "cat.json"
    both.write_text(json.dumps({"documents": [good.fingerprint(), {**good.fingerprint(), "id": "x", "split": "reported"}]}))
    with pytest.raises(qd.DocumentError, match="both splits"):
        qd.load_catalogue(both)


def test_family_takes_its_file_from_the_catalogue_and_names_it(tmp_path):
    import platform

    path = stdlib_dir() / "shutil.py"
    entry = qd.SourceFile("stdlib:shutil.py", "stdlib", "shutil.py", platform.python_version(), qd.sha256_of(path), "tuning")
    cat = tmp_path / "cat.json"
    cat.write_text(json.dumps({"documents": [entry.fingerprint()]}))
    tasks = qk.family(0, 4000, count4, split="tuning", catalogue=str(cat))
    assert tasks and len({t.meta["family"] for t in tasks}) == 1 and tasks[0].id.startswith("kinds-tuning-L4000-s0-000-q")
    assert tasks[0].meta["fingerprint"]["sha256"] == entry.sha256
    with pytest.raises(ValueError, match="no reported documents"):
        qk.family(0, 4000, count4, split="reported", catalogue=str(cat))
    assert "shutil.py" in qk.closed_book(tasks[0]) and "code above" not in qk.closed_book(tasks[0])


def test_settings_keep_the_kinds_apart_and_key_the_split():
    s = q.QualitySettings(kinds=["two-place", "review"])
    s.check()
    assert s.key("answer") != q.QualitySettings(kinds=["two-place", "review"], split="tuning").key("answer")
    assert q.QualitySettings().key("answer") == q.QualitySettings(split="tuning").key("answer")  # lookups: no split
    with pytest.raises(ValueError, match="run apart"):
        q.QualitySettings(kinds=["two-place", "needle"]).check()
    res = CliRunner().invoke(app, ["bench", "quality", "answer", "--journal", "/nonexistent/j.jsonl", "--kinds", "review,needle"])
    assert res.exit_code != 0 and "run apart" in res.output
    res = CliRunner().invoke(app, ["bench", "quality", "answer", "--journal", "/nonexistent/j.jsonl", "--kinds", "review",
                                   "--shape", "xml"])
    assert res.exit_code != 0 and "shape must be native or chat" in res.output
    res = CliRunner().invoke(app, ["run", "-", "-q", "Any bugs?", "--task", "qa"], input="x = 1\n")
    assert res.exit_code != 0 and "task must be lookup, two-place, aggregation, review or summary" in res.output


def _rec(kind, doc, base, spec, cb=False, **extra):
    return {"half": "answer", "task": f"{kind}-{doc}-{base}{spec}", "kind": kind, "length": 4000, "doc_sha256": doc,
            "settings": {"keep": 0.3}, "closed_book": {"correct": cb}, "baseline": {"correct": base, **extra},
            "specprefill": {"correct": spec, "evidence_kept": True, **extra}}


def test_the_kind_table_marks_rows_of_few_baseline_right_answers_inconclusive():
    recs = [_rec("review", f"d{i}", True, i % 2 == 0) for i in range(MIN_BASELINE_RIGHT - 1)]
    recs += [_rec("two-place", f"d{i}", True, True) for i in range(12)] + [_rec("two-place", "d0", False, False, cb=True)]
    recs += [_rec("summary", "d0", None, None, ids_named=0.5)]
    rows = {r["kind"]: r for r in kind_rows(recs)}
    assert rows["review"]["inconclusive"] and rows["review"]["n"] == MIN_BASELINE_RIGHT - 1
    assert not rows["two-place"]["inconclusive"] and rows["two-place"]["closed_book_right"] == 1
    assert rows["two-place"]["ratio"] == 1.0 and rows["two-place"]["documents"] == 12
    assert rows["summary"]["metric"] == "ids_named" and rows["summary"]["baseline"] == 0.5 and "inconclusive" not in rows["summary"]
    text = table_markdown({"recall": [], "recall_full_vs_windowed": [], "answer": [], "kinds": kind_rows(recs)})
    assert "| review | 4,000 |" in text and "inconclusive" in text and "ids_named" in text


@pytest.mark.engine
def test_the_kinds_run_end_to_end_on_the_tiny_pair_and_journal_their_key(tiny_models, tmp_path):
    """answer and recall halves over a one-file catalogue (tiny random-weight models: the answers are noise, the
    records are what is checked): every record names its kind, graded by quality_grade (summary: ids_named, no
    answer-right), and holds the full EvidenceKey with that task kind; the report has the kind table."""
    import platform

    from specq.bench.quality_report import read_journal
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine
    from specq.engine.policy.evidence_key import EvidenceKey

    path = stdlib_dir() / "shutil.py"
    entry = qd.SourceFile("stdlib:shutil.py", "stdlib", "shutil.py", platform.python_version(), qd.sha256_of(path), "reported")
    cat = tmp_path / "cat.json"
    cat.write_text(json.dumps({"documents": [entry.fingerprint()]}))
    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=4096, n_threads=2, cache_bytes=256 << 20))
    try:
        s = q.QualitySettings(lengths=[1500], n=4, kinds=list(qk.KINDS), per_kind=1, max_tokens=4, chunk=16, catalogue=str(cat),
                              scorers=["windowed"], keeps=[0.3], answer_floor=False)  # (random weights never stop)
        s.check()
        q.run_answer(eng, s, q.Journal(tmp_path / "a.jsonl", s), say=lambda m: None)
        q.run_recall(eng, s, q.Journal(tmp_path / "r.jsonl", s), say=lambda m: None)
    finally:
        eng.close()
    answers = [r for r in read_journal(tmp_path / "a.jsonl") if r["half"] == "answer"]
    assert len(answers) == 4 and {r["kind"] for r in answers} <= set(qk.KINDS) and len({r["kind"] for r in answers}) >= 2
    for r in answers:
        assert r["family"].startswith("kinds-reported-L1500-s0-")
        if "specprefill" not in r:
            continue
        key = EvidenceKey.from_dict(r["key"])
        assert key.task == r["kind"] and key.prompt_shape == "native"
        for arm in ("baseline", "specprefill"):
            if r["kind"] == "summary":
                assert r[arm]["correct"] is None and 0.0 <= r[arm]["ids_named"] <= 1.0
            else:
                assert isinstance(r[arm]["correct"], bool) and "grade" in r[arm]
        assert "max_tokens" not in r  # (no floor: max_tokens alone)
    assert q.answer_tokens(qk.questions(SOURCE, 400, "x", ["summary"])[0], q.QualitySettings(max_tokens=4)) == 160
    recalls = [r for r in read_journal(tmp_path / "r.jsonl") if r["half"] == "recall"]
    assert len(recalls) == 4 and all(r["evidence_chunks"] and "0.3" in r["kept"]["windowed"] for r in recalls)
    report = q.build_report([tmp_path / "a.jsonl"])
    assert {r["kind"] for r in report["kinds"]} == {r["kind"] for r in answers if "specprefill" in r}
    assert not report["answer"]  # the kinds are not mixed into the lookups' rows
