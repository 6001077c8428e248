"""`specq calibrate`'s run (issue 48 item 1): questions about the user's documents (or the built-in task
families), each answered by the loaded pair in baseline and in specprefill (engine/calibration.run_unit),
journaled, then turned into evidence rows, one per metric (engine/policy/evidence_metrics.py).

Input (`read_questions`): JSONL, one question a line: `{"text" | "path" | "document_id", "question",
"answer"?}`. `path` is read relative to the file; `document_id` is a stored document (the caller
resolves it: `resolve`). A document is named by the sha256 of its text, so lines that repeat a document
count as one document in a row's clustered bound. A malformed line raises `InputLineError` naming the
line, before anything runs. Without a file, `family_questions` makes the built-in families
(bench/quality_tasks.py: 5 questions a document, graded by its grader).

Lengths: a family question's length is the length it was made at; a file's document goes to the
smallest `--lengths` edge at or above its token count (rows are per length, and mode auto's bands are
the rows' measured document lengths). A document longer than every edge is an input error.

Journal (`CalJournal`): one JSON line per finished unit (fsync'd), keyed by the run's settings; a rerun
skips the units it holds, so an interrupted calibration resumes. Lines are checked by engine/calibration_lines.
parse_line, and records and rows made by engine/policy/calibration_rows (`unit_record`, `rows_for`,
`group_id`, `table_rows`), the code calibrations through the service use too (worker/calibration.py).
Rows (`rows_for`) are made only for a
(length, keep, key) group whose every planned unit is in the journal (a row is written once its n completes);
`posted` lines record the rows written, so a rerun does not write them again.

Several keeps (`--keep 0.1,0.2,0.3,0.5`; issue 48 item 2): keep per band, chosen in sample, certified out of
sample. `split_halves` splits each length band's documents by content hash: the band's distinct documents
sorted by their sha256, the 1st, 3rd, 5th, … form the choosing half and the 2nd, 4th, … the certifying half
(deterministic, disjoint, independent of line order; the halves differ by at most one document; a document's
questions all stay in its half). `keep_plan` walks each band's keeps smallest first on the choosing half: the
first keep whose rows pass (the rows built as if out of sample and judged by evidence.length_fails, the rule
mode auto applies: every metric's row passes, one of them decisive) is the band's chosen keep, and larger keeps
are never run there; the chosen keep alone is then run on the certifying half. The choosing half's rows are
written `in_sample` (the keep was tuned on them), the certifying half's `certified` (the rows a job that sets
no keep reads: evidence.certified_keep). A band where no keep passes on the choosing half runs nothing on its
certifying half. The plan is recomputed from the journal each step, so a rerun resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..engine.calibration_lines import LineError, document_sha256, parse_line
from ..engine.policy import calibration_rows as cr, evidence_metrics as em
from ..engine.policy.calibration_rows import DEFAULT_EDGES, ROLES, group_id, rows_for, table_rows

#: the built-in families' default length and questions per length (8 documents x 5: the pass bar's minimum)
FAMILY_LENGTHS = (4000,)
FAMILY_PER = 5
FAMILY_N = 40


class InputLineError(ValueError):
    """A line of the questions file that cannot be used (message names the line)."""


@dataclass
class Question:
    line: int  # 1-based line of the file (0 for a built-in family question)
    document: str  # the text
    question: str
    answer: str | None = None
    task: Any = None  # a built-in family's Task (its grader grades)
    document_id: str = ""  # where the line named one (resolved by the caller)
    length: int = 0  # the length it counts under
    doc_sha256: str = ""
    tokens: int = 0

    def unit_id(self, keep: float) -> str:
        h = hashlib.sha256(json.dumps([self.doc_sha256, self.question, self.answer, keep]).encode()).hexdigest()
        return h[:24]

    def grade(self, text: str) -> bool | None:
        """Right or wrong against the reference, None where there is none."""
        if self.task is not None:
            from . import quality_tasks as qt

            return qt.is_correct(self.task, text)
        if self.answer is not None:
            return em.answer_matches(text, self.answer)
        return None


def read_questions(path: Path) -> list[Question]:
    """The questions of a JSONL file (module doc); InputLineError names the first bad line. `document_id`
    lines come back with an empty `document` for the caller to resolve."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputLineError(f"{path}: {e.strerror or e}") from None
    out: list[Question] = []
    for i, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"{path}: line {i}"
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise InputLineError(f"{where}: not a JSON object ({str(e).splitlines()[0][:120]})") from None
        try:
            line_ = parse_line(obj, where, paths=True)
        except LineError as e:
            raise InputLineError(str(e)) from None
        src = next(k for k in ("text", "path", "document_id") if k in line_)
        q, ans = line_["question"], line_["answer"]
        text, doc_id = "", ""
        if src == "text":
            text = obj["text"]
        elif src == "path":
            p = Path(obj["path"])
            p = p if p.is_absolute() else path.parent / p
            try:
                text = p.read_bytes().decode("utf-8")
            except OSError as e:
                raise InputLineError(f"{where}: path {obj['path']}: {e.strerror or e}") from None
            except UnicodeDecodeError:
                raise InputLineError(f"{where}: path {obj['path']}: not UTF-8 text") from None
        else:
            doc_id = obj["document_id"]
        out.append(Question(line=i, document=text, question=q, answer=ans, document_id=doc_id))
    if not out:
        raise InputLineError(f"{path}: no questions")
    return out


def assign_lengths(questions: list[Question], count: Callable[[str], int], edges: Iterable[int]) -> None:
    """Each file question's document hashed, counted (tokens) and put under the smallest edge >= its count."""
    edges = sorted(set(int(e) for e in edges))
    seen: dict[str, int] = {}
    for q in questions:
        if not q.document.strip():
            raise InputLineError(f"line {q.line}: the document is empty")
        q.doc_sha256 = document_sha256(q.document)
        if q.doc_sha256 not in seen:
            seen[q.doc_sha256] = count(q.document)
        q.tokens = seen[q.doc_sha256]
        length = cr.length_for(q.tokens, edges)
        if length is None:
            raise InputLineError(f"line {q.line}: the document has {q.tokens:,} tokens, more than the largest "
                                 f"--lengths edge ({edges[-1]:,})")
        q.length = length


def family_questions(lengths: Iterable[int], n: int, count: Callable[[str], int], seed: int = 0) -> list[Question]:
    """`n` questions per length from the built-in families (FAMILY_PER a document), graded by their grader."""
    from . import quality_tasks as qt

    out: list[Question] = []
    for length in lengths:
        done, f = 0, 0
        while done < n:
            for t in qt.make_family(f, length, count, seed=seed, per=FAMILY_PER)[: n - done]:
                out.append(Question(line=0, document=t.document, question=t.question, answer=t.answer, task=t,
                                    length=length, doc_sha256=document_sha256(t.document)))
                done += 1
            f += 1
    return out


@dataclass
class CalJournal:
    """Append-only JSONL of finished units and posted rows (module doc)."""

    path: Path
    settings_key: str
    units: dict[str, dict] = field(default_factory=dict)
    posted: dict[str, list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            data = self.path.read_bytes()
            if data and not data.endswith(b"\n"):  # a run killed mid-line: end the torn line
                with self.path.open("ab") as f:
                    f.write(b"\n")
            for line in data.split(b"\n"):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # the torn line
                if not isinstance(rec, dict) or rec.get("settings_key") != self.settings_key:
                    continue
                if "unit" in rec:
                    self.units[rec["unit"]] = rec
                elif "posted" in rec:
                    self.posted[rec["posted"]] = rec.get("ids", [])

    def _append(self, rec: dict) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def add_unit(self, unit: str, rec: dict) -> None:
        rec = {"settings_key": self.settings_key, "unit": unit, **rec}
        self._append(rec)
        self.units[unit] = rec

    def add_posted(self, group: str, ids: list) -> None:
        self._append({"settings_key": self.settings_key, "posted": group, "ids": ids,
                      "t": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        self.posted[group] = ids


def settings_key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def unit_record(q: Question, keep: float, result: dict[str, Any]) -> dict[str, Any]:
    """The journal line of one finished unit: the engine's record, graded where a reference exists
    (engine/policy/calibration_rows.unit_record, which calibrations through the service write too)."""
    right_b, right_a = q.grade(result["baseline"]["text"]), q.grade(result["specprefill"]["text"])
    return cr.unit_record(line=q.line, doc=q.doc_sha256, length=q.length, keep=keep, question=q.question, result=result,
                          right=None if right_b is None else (right_b, right_a))


def plot(records: list[dict], path: Path) -> str:
    """Fidelity (agreement per question, token F1) against prompt length, one series per keep; "" when
    written, else why not (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no PNG (pip install matplotlib)"
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for keep in sorted({r["keep"] for r in records}):
        mine = sorted((r for r in records if r["keep"] == keep), key=lambda r: r["prompt_tokens"])
        x = [r["prompt_tokens"] for r in mine]
        axes[0].plot(x, [r["values"]["token_f1"] for r in mine], "o", alpha=0.6, label=f"keep {keep:g}")
        ll = [(r["prompt_tokens"], r["values"]["loglik_delta"]) for r in mine if "loglik_delta" in r["values"]]
        axes[1].plot([a for a, _ in ll], [b for _, b in ll], "o", alpha=0.6, label=f"keep {keep:g}")
    axes[0].set(xlabel="prompt tokens", ylabel="token F1 vs baseline's answer", ylim=(-0.05, 1.05),
                title="answer fidelity")
    axes[1].set(xlabel="prompt tokens", ylabel="log-lik. sparse - full (nats/token)", title="teacher-forced")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return ""


def split_halves(questions: Iterable[Question]) -> dict[str, str]:
    """Each document (content hash) -> "choose" or "certify" (module doc: per length band, the distinct documents
    sorted by sha256, alternately)."""
    bands: dict[int, set[str]] = {}
    for q in questions:
        bands.setdefault(q.length, set()).add(q.doc_sha256)
    out: dict[str, str] = {}
    for docs in bands.values():
        for i, d in enumerate(sorted(docs)):
            out.setdefault(d, "choose" if i % 2 == 0 else "certify")
    return out


def half_fails(records: list[dict]) -> str:
    """Why a band's choosing-half records at one keep do not pass ("" = they do): per resolved key, the rows
    `rows_for` makes, judged out of sample by mode auto's rule (evidence.length_fails); every key must pass."""
    from ..engine.policy.evidence import length_fails, row_from_dict

    by_key: dict[str, list[dict]] = {}
    for r in records:
        by_key.setdefault(json.dumps(r["key"], sort_keys=True), []).append(r)
    whys = []
    for recs in by_key.values():
        rows = [row_from_dict(d) for d in rows_for(recs, source="", provenance={})]
        why = length_fails(rows) if rows else "no metric measured"
        if why:
            whys.append(why)
    return "; ".join(whys)


@dataclass
class BandPlan:
    """One length band of a several-keep calibration (keep_plan)."""

    length: int
    choosing: list[str]  # documents (content hashes)
    certifying: list[str]
    choosing_n: int  # questions
    certifying_n: int
    tried: list[dict] = field(default_factory=list)  # {"keep", "passes", "why"} per keep run on the choosing half
    chosen: float | None = None
    stage: str = "choosing"  # choosing | certifying | certified | none passed | nothing to certify

    def as_dict(self) -> dict[str, Any]:
        return {"length": self.length, "stage": self.stage, "chosen": self.chosen, "tried": self.tried,
                "choosing_documents": self.choosing, "certifying_documents": self.certifying,
                "choosing_questions": self.choosing_n, "certifying_questions": self.certifying_n}


def keep_plan(questions: list[Question], keeps: Iterable[float], units: dict[str, dict]
              ) -> tuple[list[BandPlan], list[tuple[Question, float, str]], int]:
    """(bands, plan, most units left): where each band stands given the journal's `units` (module doc), the
    (question, keep, role) units the calibration holds so far — run or to run next — and an upper bound on the
    units still to run (every untried keep on the choosing half, and the certifying half once)."""
    keeps = sorted(set(keeps))
    halves = split_halves(questions)
    plan: list[tuple[Question, float, str]] = []
    bands: list[BandPlan] = []
    left = 0
    for length in sorted({q.length for q in questions}):
        qs = [q for q in questions if q.length == length]
        choose = [q for q in qs if halves[q.doc_sha256] == "choose"]
        certify = [q for q in qs if halves[q.doc_sha256] == "certify"]
        band = BandPlan(length, sorted({q.doc_sha256 for q in choose}), sorted({q.doc_sha256 for q in certify}),
                        len(choose), len(certify))
        bands.append(band)
        for i, k in enumerate(keeps):
            plan += [(q, k, "choose") for q in choose]
            missing = sum(q.unit_id(k) not in units for q in choose)
            if missing:  # this keep is the band's next step
                band.tried.append({"keep": k, "passes": None, "why": f"{len(choose) - missing} of {len(choose)} run"})
                left += missing + len(choose) * (len(keeps) - i - 1) + len(certify)
                break
            why = half_fails([units[q.unit_id(k)] for q in choose])
            band.tried.append({"keep": k, "passes": not why, "why": why})
            if not why:
                band.chosen = k
                break
        if band.chosen is None:
            if band.tried and band.tried[-1]["passes"] is False:
                band.stage = "none passed"
            continue
        if not certify:
            band.stage = "nothing to certify"
            continue
        plan += [(q, band.chosen, "certify") for q in certify]
        missing = sum(q.unit_id(band.chosen) not in units for q in certify)
        band.stage = "certifying" if missing else "certified"
        left += missing
    return bands, plan, left


def role_group(gid: str, role: str) -> str:
    """A (length, keep, key) group's id in one role (`posted` lines; the one-keep run's ids stay as they were)."""
    return gid if role == "all" else f"{gid}:{role}"


def _cell(x, fmt: str) -> str:
    return "–" if x is None else fmt.format(x)


def table_markdown(report: dict) -> str:
    """The per-length table of one `specq calibrate --json` report: each metric's value, and each row's
    90% lower bound and whether it passes (why not, where it fails); docs/quality.md renders it through
    `specq bench report` (the `calibrate-real` table)."""
    head = ["length", "keep", "documents", "questions", "document tokens", "s/question", "answer right",
            "agreement", "token F1", "loglik Δ (nats)", "rows: lower bound, pass?"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * 6 + "---:|" * 4 + "---|"]
    for t in report.get("table", []):
        rows = "; ".join(f"{m} {_cell(v['bound'], '{:.3f}')} " + ("passes" if v["passes"] else f"no ({v['fails']})")
                         for m, v in t.get("rows", {}).items()) or "not written (n incomplete)"
        lines.append("| " + " | ".join([
            f"{t['length']:,}", f"{t['keep']:g}", str(t["documents"]), str(t["n"]),
            f"{t['doc_tokens'][0]:,}–{t['doc_tokens'][1]:,}", _cell(t["seconds_per_question"], "{:,.0f}"),
            _cell(t["answer_right"], "{:.3f}"), _cell(t["agreement"], "{:.3f}"), _cell(t["token_f1"], "{:.3f}"),
            _cell(t["loglik_delta"], "{:+.3f}"), rows]) + " |")
    return "\n".join(lines)


__all__ = ["Question", "ROLES", "split_halves", "half_fails", "BandPlan", "keep_plan", "role_group", "InputLineError", "read_questions", "assign_lengths", "family_questions", "CalJournal",
           "settings_key", "unit_record", "group_id", "rows_for", "table_rows", "plot", "table_markdown", "DEFAULT_EDGES", "FAMILY_LENGTHS",
           "FAMILY_N"]
