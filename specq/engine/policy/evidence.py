"""Quality evidence as data: where mode auto may run specprefill (auto.py rules 3 and 1a).

A row (`EvidenceRow`) is one measurement: the questions of `documents` answered by baseline and by
an arm (`specprefill`: each question its own kept chunks; `group`: a family through one
group-sparse prefill), all run with one `EvidenceKey` (evidence_key.py), on documents of
`doc_tokens` tokens. Its bound is clustered by document (evidence_bound.py). It **passes** when
the metric's pass bar (`PASS_BARS`, the one place they are set) holds: lower bound >= min_bound,
>= min_documents documents, >= min_questions questions, not in-sample (the set a default was chosen
on is recorded and never passes) and not disabled.

Where rows come from: the shipped file `evidence_rows.json` beside this module (package data),
written by `specq evidence build` from the journals in bench/results (specq/bench/evidence_build.py),
and the store's table (`POST /v1/evidence`), which the worker passes in (`merge`): a store row with
the same key, metric, arm and length supersedes a shipped one only with at least as many documents.

`lookup(rows, key)`: the prompt-length bands where the job's key has passing rows — each passing
row's documents plus `QUESTION_ALLOWANCE` tokens for template and question, joined across lengths
with no failing row between — and, where there is none, why (the first key field no passing row
has, or that no row passes). Nothing else is extrapolated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from .evidence_bound import METHOD, row_lower
from ..options import TASK_KINDS
from .evidence_key import FIELDS, EvidenceKey, first_difference

#: prompt tokens on top of a measured document's: chat template + question
QUESTION_ALLOWANCE = 256
#: the shipped rows (package data)
SHIPPED_PATH = Path(__file__).with_name("evidence_rows.json")
ARMS = ("specprefill", "group")


@dataclass(frozen=True)
class PassBar:
    min_bound: float
    min_documents: int
    min_questions: int


#: per metric: what a row must show to pass. answer_right: the lower bound of (arm right / baseline
#: right) >= 0.95, over >= 8 documents and >= 40 questions (issue 47: no standing row has 8 documents)
PASS_BARS: dict[str, PassBar] = {"answer_right": PassBar(0.95, 8, 40)}


@dataclass(frozen=True)
class EvidenceRow:
    key: EvidenceKey
    metric: str
    arm: str
    length: int  # the run's nominal document length
    doc_tokens: tuple[int, int]  # the measured documents' token counts, min and max
    #: per document (content hash, or `family:<id>` for journals that recorded none): n, baseline_right, arm_right,
    #: both_right (questions both baseline and the arm answered right)
    documents: dict = field(hash=False, compare=False)
    bound: float
    bound_method: str = METHOD
    in_sample: bool = False
    in_sample_why: str = ""
    source: str = ""  # the journal (or calibration id) the row is computed from
    provenance: dict = field(default_factory=dict, hash=False, compare=False)
    created_at: str = ""
    disabled: str = ""  # why the row is switched off ("" = on)

    @property
    def n(self) -> int:
        return sum(int(d["n"]) for d in self.documents.values())

    @property
    def baseline_right(self) -> int:
        return sum(int(d["baseline_right"]) for d in self.documents.values())

    @property
    def arm_right(self) -> int:
        return sum(int(d["arm_right"]) for d in self.documents.values())

    @property
    def ratio(self) -> float | None:
        return self.arm_right / self.baseline_right if self.baseline_right else None

    def fails_bar(self) -> str:
        """Why the row does not pass ("" = it passes)."""
        bar = PASS_BARS[self.metric]
        if self.disabled:
            return f"disabled: {self.disabled}"
        if self.in_sample:
            return "in-sample" + (f" ({self.in_sample_why})" if self.in_sample_why else "")
        if len(self.documents) < bar.min_documents:
            return f"{len(self.documents)} documents < {bar.min_documents}"
        if self.n < bar.min_questions:
            return f"{self.n} questions < {bar.min_questions}"
        if self.bound < bar.min_bound:
            return f"lower bound {self.bound:.3f} < {bar.min_bound}"
        return ""

    @property
    def passes(self) -> bool:
        return not self.fails_bar()

    def identity(self) -> tuple:
        return (self.key, self.metric, self.arm, self.length)

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key.as_dict(), "metric": self.metric, "arm": self.arm, "length": self.length,
                "doc_tokens": list(self.doc_tokens), "n": self.n, "documents": self.documents,
                "baseline_right": self.baseline_right, "arm_right": self.arm_right,
                "ratio": None if self.ratio is None else round(self.ratio, 4),
                "bound_method": self.bound_method, "bound": round(self.bound, 4), "passes": self.passes,
                "fails": self.fails_bar(), "in_sample": self.in_sample, "in_sample_why": self.in_sample_why,
                "source": self.source, "provenance": self.provenance, "created_at": self.created_at,
                "disabled": self.disabled}

    def summary(self) -> str:
        r = "-" if self.ratio is None else f"{self.ratio:.2f}"
        return (f"{self.key.task} questions on {self.doc_tokens[0]:,}-{self.doc_tokens[1]:,}-token documents: n {self.n} ({len(self.documents)} documents), "
                f"ratio {r}, {self.bound_method} 90% lower {self.bound:.2f}")


def row_from_dict(data: Any) -> EvidenceRow:
    """A row from its JSON shape (`as_dict`), validated: ValueError names the first bad field. Derived values
    (n, accuracies, ratio, passes) are recomputed from the per-document counts, and so is the bound: a given
    `bound` above what the counts give is refused (a row can never widen a band beyond its data)."""
    if not isinstance(data, dict):
        raise ValueError("row: must be an object")
    key = EvidenceKey.from_dict(data.get("key"))
    if key.task is None:
        raise ValueError(f"key.task: a row names the kind of its questions ({', '.join(TASK_KINDS)})")
    metric = data.get("metric", "answer_right")
    if metric not in PASS_BARS:
        raise ValueError(f"metric: must be one of {', '.join(PASS_BARS)}")
    arm = data.get("arm", "specprefill")
    if arm not in ARMS:
        raise ValueError(f"arm: must be one of {', '.join(ARMS)}")
    length = data.get("length")
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        raise ValueError("length: must be a positive integer (tokens)")
    dt = data.get("doc_tokens")
    if (not isinstance(dt, (list, tuple)) or len(dt) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in dt)
            or not 0 < dt[0] <= dt[1]):
        raise ValueError("doc_tokens: must be [min, max] positive token counts")
    docs = data.get("documents")
    if not isinstance(docs, dict) or not docs:
        raise ValueError("documents: must be a non-empty object of per-document counts")
    clean: dict[str, dict[str, int]] = {}
    for name, d in docs.items():
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ValueError("documents: each document needs a name (its content hash) of 1-200 characters")
        if not isinstance(d, dict):
            raise ValueError(f"documents.{name}: must be an object of n, baseline_right, arm_right, both_right")
        vals = {}
        for c in ("n", "baseline_right", "arm_right", "both_right"):
            v = d.get(c)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"documents.{name}.{c}: must be an integer >= 0")
            vals[c] = v
        if (vals["n"] < 1 or vals["baseline_right"] > vals["n"] or vals["arm_right"] > vals["n"]
                or vals["both_right"] > min(vals["baseline_right"], vals["arm_right"])
                or vals["baseline_right"] + vals["arm_right"] - vals["both_right"] > vals["n"]):
            raise ValueError(f"documents.{name}: needs n >= 1, baseline_right and arm_right <= n, "
                             "both_right <= each of them, and their union <= n")
        clean[name] = vals
    for name, want in (("n", sum(d["n"] for d in clean.values())),):
        if name in data and data[name] != want:
            raise ValueError(f"n: {data[name]!r} is not the documents' total ({want})")
    computed = row_lower(clean)
    method = data.get("bound_method", METHOD)
    if method != METHOD:
        raise ValueError(f"bound_method: must be {METHOD}")
    given = data.get("bound")
    if given is not None:
        if not isinstance(given, (int, float)) or isinstance(given, bool) or not math.isfinite(given):
            raise ValueError("bound: must be a number")
        if given > computed + 1e-4:
            raise ValueError(f"bound: {given} is above what the per-document counts give ({computed:.4f})")
    for flag in ("in_sample",):
        if not isinstance(data.get(flag, False), bool):
            raise ValueError(f"{flag}: must be true or false")
    texts = {}
    for name in ("in_sample_why", "source", "created_at", "disabled"):
        v = data.get(name, "")
        if not isinstance(v, str) or len(v) > 2000:
            raise ValueError(f"{name}: must be a string of at most 2,000 characters")
        texts[name] = v
    prov = data.get("provenance", {})
    if not isinstance(prov, dict):
        raise ValueError("provenance: must be an object")
    row = EvidenceRow(key=key, metric=metric, arm=arm, length=length, doc_tokens=(dt[0], dt[1]), documents=clean,
                      bound=computed, in_sample=data.get("in_sample", False), provenance=prov, **texts)
    if data.get("passes") is True and not row.passes:
        raise ValueError(f"passes: the row does not pass ({row.fails_bar()})")
    return row


def load_rows(path: Path = SHIPPED_PATH) -> tuple[EvidenceRow, ...]:
    """The rows of a JSON file ({"rows": [...]}), each validated."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return tuple(row_from_dict(r) for r in data["rows"])


@lru_cache(maxsize=1)
def shipped_rows() -> tuple[EvidenceRow, ...]:
    return load_rows(SHIPPED_PATH)


def merge(shipped: Iterable[EvidenceRow], stored: Iterable[EvidenceRow]) -> tuple[EvidenceRow, ...]:
    """The rows mode auto reads: `shipped`, each replaced by a stored row of the same key, metric, arm and
    length that has at least as many documents, plus the stored rows with no shipped counterpart."""
    out = {r.identity(): r for r in shipped}
    for r in sorted(stored, key=lambda r: r.created_at):  # a later stored row of as many documents stands
        old = out.get(r.identity())
        if old is None or len(r.documents) >= len(old.documents):
            out[r.identity()] = r
    return tuple(out.values())


@dataclass(frozen=True)
class Band:
    lo: int  # prompt tokens, inclusive
    hi: int
    rows: tuple[EvidenceRow, ...]

    def covers(self, n_prompt: int) -> bool:
        return self.lo <= n_prompt <= self.hi

    def describe(self) -> str:
        r0 = self.rows[0]
        what = "group-sparse answers, " if r0.arm == "group" else ""
        return (f"{what}keep {r0.key.keep:g}, {r0.key.chunk_rule} chunk rule, measured >= "
                f"{PASS_BARS[r0.metric].min_bound:.0%} of baseline ({'; '.join(r.summary() for r in self.rows)}; "
                "docs/quality.md)")


#: the metric each task kind's rows are measured by: a summary has no answer-right (bench/quality_grade.py); its
#: label-free fidelity (the calibrate issue's) has no pass bar yet, so no summary row can pass
KIND_METRIC = {"summary": "fidelity"}


def lookup(rows: Sequence[EvidenceRow], key: EvidenceKey | None, arm: str = "specprefill",
           metric: str = "answer_right") -> tuple[tuple[Band, ...], str]:
    """(bands, why): the prompt-length bands where `key` has passing `arm` rows (module doc); where there
    are none, `why` says so ("" otherwise). `key` None: only whether any row passes (no key made). A key
    whose task is not declared (None) has the bands where every kind of TASK_KINDS has (`every_kind`)."""
    if key is not None and key.task is None:
        return every_kind(rows, key, arm)
    if key is not None:
        metric = KIND_METRIC.get(key.task or "", metric)
    if metric not in PASS_BARS:
        return (), f"{key.task if key else ''} questions: unmeasured ({metric} has no pass bar yet; docs/quality.md)"
    live = [r for r in rows if r.arm == arm and r.metric == metric]
    mine = [r for r in live if key is not None and first_difference(key, r.key) is None]
    best: dict[int, EvidenceRow] = {}
    for r in mine:  # per measured length, the row with the most documents, then questions (the later one on a tie)
        if r.length not in best or (len(r.documents), r.n) >= (len(best[r.length].documents), best[r.length].n):
            best[r.length] = r
    out: list[Band] = []
    run: list[EvidenceRow] = []
    for r in sorted(best.values(), key=lambda r: r.doc_tokens) + [None]:
        if r is not None and r.passes:
            run.append(r)
            continue
        if run:
            out.append(Band(run[0].doc_tokens[0], run[-1].doc_tokens[1] + QUESTION_ALLOWANCE, tuple(run)))
            run = []
    if out:
        return tuple(out), ""
    what = "group-sparse" if arm == "group" else "specprefill"
    if best:
        return (), (f"{what} evidence for these settings does not pass ("
                    + "; ".join(f"{r.length}: {r.fails_bar()}" for r in sorted(best.values(), key=lambda r: r.length))
                    + "; docs/quality.md)")
    passing = [r for r in live if r.passes]
    if not passing:
        return (), (f"no {what} evidence row passes ({len(live)} rows; a pass needs "
                    f"{_bar_text(metric)}; docs/quality.md)")
    # the passing row that matches the job longest: the field where it stops is the one to name
    if key is None:
        return (), f"no evidence for this job's settings ({len(passing)} passing {what} rows; docs/quality.md)"
    diffs = [(FIELDS.index(first_difference(key, r.key)), r) for r in passing]
    at, row = max(diffs, key=lambda x: x[0])
    name = FIELDS[at]
    return (), f"no evidence for {key.describe(name)} (passing rows have {row.key.describe(name)}; docs/quality.md)"


def every_kind(rows: Sequence[EvidenceRow], key: EvidenceKey, arm: str = "specprefill") -> tuple[tuple[Band, ...], str]:
    """A job that declares no task (issue 49: it cannot be assumed to be a lookup): the lengths where every kind
    of TASK_KINDS is measured and passes with the job's other settings — each kind's bands (`lookup`)
    intersected; an unmeasured or failing kind blocks, and `why` names the first such kind and its reason."""
    out: list[Band] | None = None
    for kind in TASK_KINDS:
        bands, why = lookup(rows, replace(key, task=kind), arm)
        if not bands:
            return (), f"task not declared (params.task), so every kind must pass, and {kind}: {why}"
        if out is None:
            out = list(bands)
            continue
        out = [Band(max(a.lo, b.lo), min(a.hi, b.hi), a.rows + b.rows) for a in out for b in bands
               if max(a.lo, b.lo) <= min(a.hi, b.hi)]
        if not out:
            return (), (f"task not declared (params.task), so every kind must pass, and no length has every kind "
                        f"passing (the first without overlap: {kind}; docs/quality.md)")
    return tuple(out or ()), ""


def _bar_text(metric: str) -> str:
    bar = PASS_BARS[metric]
    return (f">= {bar.min_documents} documents, >= {bar.min_questions} questions, a clustered lower bound >= "
            f"{bar.min_bound} and out-of-sample questions")


def listing(shipped: Sequence[EvidenceRow], stored: Sequence[dict]) -> tuple[tuple[EvidenceRow, ...], list[dict]]:
    """(the rows mode auto reads, every row as a dict): `stored` are the table's rows (storage.evidence
    to_row), validated again here; each listed row says its `origin` (shipped | store, with the store's
    `id`) and whether `merge` keeps it (`in_use`: false for a shipped row a stored one supersedes, or a
    stored row with fewer documents than the shipped one)."""
    parsed = [(row_from_dict(d), d) for d in stored]
    used = merge(shipped, [r for r, _ in parsed])
    ids = {id(r) for r in used}
    out = [{**r.as_dict(), "origin": "shipped", "in_use": id(r) in ids} for r in shipped]
    out += [{**r.as_dict(), "origin": "store", "id": d.get("id"), "in_use": id(r) in ids} for r, d in parsed]
    return used, out


def with_documents(row: EvidenceRow, documents: dict) -> EvidenceRow:
    """`row` with other per-document counts, its bound recomputed (tests, the generator)."""
    return replace(row, documents=documents, bound=row_lower(documents))


__all__ = ["EvidenceRow", "Band", "KIND_METRIC", "every_kind", "PassBar", "PASS_BARS", "QUESTION_ALLOWANCE", "SHIPPED_PATH", "row_from_dict", "load_rows",
           "shipped_rows", "merge", "listing", "lookup", "with_documents"]
