"""Quality evidence as data: where mode auto may run specprefill (auto.py rules 3 and 1a).

A row (`EvidenceRow`) is one measurement: the questions of `documents` answered by baseline and by
an arm (`specprefill`: each question its own kept chunks; `group`: a family through one
group-sparse prefill), all run with one `EvidenceKey` (evidence_key.py), on documents of
`doc_tokens` tokens. Its bound is clustered by document (evidence_bound.py). It **passes** when
the metric's pass bar (`PASS_BARS`, the one place they are set) holds: lower bound >= min_bound,
>= min_documents documents, >= min_questions questions (answer_right: >= min_baseline_right of them
baseline-right, else the row is *inconclusive*), not in-sample (the set a default was chosen
on is recorded and never passes) and not disabled.

Where rows come from: the shipped file `evidence_rows.json` beside this module (package data),
written by `specq evidence build` from the journals in bench/results (specq/bench/evidence_build.py),
and the store's table (`POST /v1/evidence`), which the worker passes in (`merge`): a store row with
the same key, metric, arm, length, in_sample and certified flags (`identity`) supersedes a shipped one only with at
least as many documents.

`lookup(rows, key)`: the prompt-length bands where the job's key has passing rows — each passing
row's documents plus `QUESTION_ALLOWANCE` tokens for template and question, joined across lengths
with no failing row between — and, where there is none, why (the first key field no passing row
has, or that no row passes). Nothing else is extrapolated.

Metrics (evidence_metrics.py): `answer_right` (shipped rows, bench quality) and the label-free
`agreement`, `token_f1`, `loglik_delta` that `specq calibrate` adds, one row per metric. How they
combine: at a length, every metric row measured for the key must pass, and one of them must be
answer_right or agreement (`length_fails`): a failing label-free row vetoes, but token_f1 or
loglik_delta alone never turn specprefill on.

Keep per band (`specq calibrate --keep a,b,…`, issue 48 item 2): a `certified` row measures the keep chosen for
its length on the other half of the documents (those rows are in-sample); `certified_keep` gives a job that sets
no keep the keep of its band's passing certified rows (else the default), and `lookup` then runs as for a job
that set it. At one length and metric an out-of-sample row stands before an in-sample one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import evidence_metrics as em
from .evidence_bound import METHOD
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
    #: answer_right only: fewer baseline-right answers than this make the ratio too noisy to judge (issue 49:
    #: *inconclusive*, shown, never passing), however many questions were asked
    min_baseline_right: int = 0


#: per metric (evidence_metrics.py): what a row must show to pass. answer_right: the lower bound of (arm
#: right / baseline right) >= 0.95, over >= 8 documents and >= 40 questions (issue 47: no standing row has 8
#: documents), of which >= 10 baseline-right (issue 49: fewer is *inconclusive*). The label-free metrics' bars are PROVISIONAL, not yet validated against labels (issue 48
#: item 5 not run): agreement's mean >= 0.90, token_f1's >= 0.90, loglik_delta's (nats per answer token,
#: sparse minus full context) >= -0.10, each as a clustered 90% lower bound.
PASS_BARS: dict[str, PassBar] = {"answer_right": PassBar(0.95, 8, 40, min_baseline_right=10), "agreement": PassBar(0.90, 8, 40),
                                 "token_f1": PassBar(0.90, 8, 40), "loglik_delta": PassBar(-0.10, 8, 40)}
#: the provisional ones (docs/quality.md "Calibrate")
PROVISIONAL_BARS = ("agreement", "token_f1", "loglik_delta")


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
    #: `specq calibrate --keep a,b,…`: this row measures the keep chosen for its length on the other half of the
    #: documents, on documents the choice never saw (its in-sample rows are the choosing half's); a job that sets
    #: no keep runs the keep of its band's certified rows (`certified_keep`)
    certified: bool = False

    @property
    def n(self) -> int:
        return sum(int(d["n"]) for d in self.documents.values())

    @property
    def baseline_right(self) -> int | None:
        """answer_right rows only (None for a label-free metric's)."""
        if self.metric != "answer_right":
            return None
        return sum(int(d["baseline_right"]) for d in self.documents.values())

    @property
    def arm_right(self) -> int | None:
        if self.metric != "answer_right":
            return None
        return sum(int(d["arm_right"]) for d in self.documents.values())

    @property
    def ratio(self) -> float | None:
        return self.arm_right / self.baseline_right if self.baseline_right else None

    @property
    def value(self) -> float | None:
        """The point estimate the bound is of: answer_right's ratio, another metric's mean per question."""
        return self.ratio if self.metric == "answer_right" else em.mean(self.documents)

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
        if self.baseline_right is not None and self.baseline_right < bar.min_baseline_right:
            return f"inconclusive: {self.baseline_right} baseline-right answers < {bar.min_baseline_right}"
        if self.bound < bar.min_bound:
            return f"lower bound {self.bound:.3f} < {bar.min_bound}"
        return ""

    @property
    def passes(self) -> bool:
        return not self.fails_bar()

    def identity(self) -> tuple:
        """What a newer row of as many documents replaces (`merge`): an in-sample row never replaces an
        out-of-sample one, nor a plain row a certified one, or the other way round."""
        return (self.key, self.metric, self.arm, self.length, self.in_sample, self.certified)

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key.as_dict(), "metric": self.metric, "arm": self.arm, "length": self.length,
                "doc_tokens": list(self.doc_tokens), "n": self.n, "documents": self.documents,
                "baseline_right": self.baseline_right, "arm_right": self.arm_right,
                "ratio": None if self.ratio is None else round(self.ratio, 4),
                "value": None if self.value is None else round(self.value, 4),
                "bound_method": self.bound_method, "bound": round(self.bound, 4), "passes": self.passes,
                "fails": self.fails_bar(), "in_sample": self.in_sample, "in_sample_why": self.in_sample_why,
                "source": self.source, "provenance": self.provenance, "created_at": self.created_at,
                "disabled": self.disabled, "certified": self.certified}

    def summary(self) -> str:
        v = "-" if self.value is None else f"{self.value:.2f}"
        what = "ratio" if self.metric == "answer_right" else self.metric
        return (("certified keep: " if self.certified else "") + f"{self.key.task} questions on {self.doc_tokens[0]:,}-{self.doc_tokens[1]:,}-token documents: n {self.n} "
                f"({len(self.documents)} documents), {what} {v}, {self.bound_method} 90% lower {self.bound:.2f}")


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
    clean = em.check_documents(metric, data.get("documents"))
    for name, want in (("n", sum(d["n"] for d in clean.values())),):
        if name in data and data[name] != want:
            raise ValueError(f"n: {data[name]!r} is not the documents' total ({want})")
    computed = em.row_bound(metric, clean)
    method = data.get("bound_method", em.METHODS[metric])
    if method != em.METHODS[metric]:
        raise ValueError(f"bound_method: must be {em.METHODS[metric]}")
    given = data.get("bound")
    if given is not None:
        if not isinstance(given, (int, float)) or isinstance(given, bool) or not math.isfinite(given):
            raise ValueError("bound: must be a number")
        if given > computed + 1e-4:
            raise ValueError(f"bound: {given} is above what the per-document counts give ({computed:.4f})")
    for flag in ("in_sample", "certified"):
        if not isinstance(data.get(flag, False), bool):
            raise ValueError(f"{flag}: must be true or false")
    if data.get("in_sample", False) and data.get("certified", False):
        raise ValueError("certified: a certified row is measured out of sample (in_sample must be false)")
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
                      bound=computed, bound_method=method, in_sample=data.get("in_sample", False),
                      certified=data.get("certified", False), provenance=prov, **texts)
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
        metrics = sorted({r.metric for r in self.rows}, key=em.METRICS.index)
        if metrics == ["answer_right"]:
            held = f"measured >= {PASS_BARS['answer_right'].min_bound:.0%} of baseline"
        else:
            held = "measured " + ", ".join(f"{m} >= {PASS_BARS[m].min_bound:g}" + (" (provisional bar)" if m in PROVISIONAL_BARS else "")
                                           for m in metrics)
        return (f"{what}keep {r0.key.keep:g}, {r0.key.chunk_rule} chunk rule, {held} "
                f"({'; '.join(r.summary() for r in self.rows)}; docs/quality.md)")


def length_fails(rows: Sequence[EvidenceRow]) -> str:
    """Why the rows measured at one length (one per metric) do not let a key pass there ("" = they do):
    every metric row measured must pass, and at least one of them must be a decisive metric
    (evidence_metrics.DECISIVE: answer_right or agreement; token_f1 and loglik_delta alone never do)."""
    bad = [r for r in rows if not r.passes]
    if bad:
        return "; ".join((f"{r.metric} " if r.metric != "answer_right" else "") + r.fails_bar() for r in bad)
    if not any(r.metric in em.DECISIVE for r in rows):
        return (f"only {', '.join(r.metric for r in rows)} measured (a pass needs an answer_right or agreement row "
                "besides)")
    return ""


#: task kinds whose rows cannot pass yet: a summary has no answer-right (bench/quality_grade.py), and exact
#: agreement is not its measure; its label-free fidelity has no validated pass bar yet (docs/quality.md)
KIND_METRIC = {"summary": "fidelity"}


def added_text(rows: Sequence[EvidenceRow], most: int = 3) -> str:
    """The rows beyond the shipped ones (a `specq calibrate` run's, POST /v1/evidence's), per length and source,
    with why each length fails: where no row passes, no job key is made (module doc), so a reason names these
    rather than leaving an operator's calibration unmentioned; "" where there are none."""
    known = {r.source for r in shipped_rows()}
    added: dict[tuple[int, str], list[EvidenceRow]] = {}
    for r in rows:
        if r.source not in known:
            added.setdefault((r.length, r.source), []).append(r)
    if not added:
        return ""
    named = [f"{length} ({src or 'no source'}): {length_fails(rs)}" for (length, src), rs in sorted(added.items())]
    more = f"; {len(named) - most} more" if len(named) > most else ""
    return (f"; {sum(len(rs) for rs in added.values())} of them added to the shipped rows (any settings): "
            + "; ".join(named[:most]) + more)


def lookup(rows: Sequence[EvidenceRow], key: EvidenceKey | None, arm: str = "specprefill") -> tuple[tuple[Band, ...], str]:
    """(bands, why): the prompt-length bands where `key` has passing `arm` rows (module doc); where there
    are none, `why` says so; where there are some, `why` names the measured lengths that fail ("" where none do). `key` None: only whether any row passes (no key made). A key
    whose task is not declared (None) has the bands where every kind of TASK_KINDS has (`every_kind`).

    Several metrics (specq calibrate writes one row per metric): at each measured length the row with the most
    documents, then questions, of each metric stands; a length passes only when every metric's row there passes
    and one of them is answer_right or agreement (`length_fails`)."""
    if key is not None and key.task is None and any(r.passes for r in rows if r.arm == arm):
        return every_kind(rows, key, arm)  # (where no row passes at all, the reason below says just that)
    if key is not None and key.task in KIND_METRIC:
        return (), (f"{key.task} questions: unmeasured ({KIND_METRIC[key.task]} has no pass bar yet; docs/quality.md)")
    live = [r for r in rows if r.arm == arm]
    mine = [r for r in live if key is not None and first_difference(key, r.key) is None]
    best: dict[tuple[int, str], EvidenceRow] = {}
    for r in mine:  # per measured length and metric, an out-of-sample row before an in-sample one (a keep's choosing
        # half beside its certifying half), then the row with the most documents, then questions (the later one on a tie)
        at = (r.length, r.metric)
        rank = lambda x: (not x.in_sample, len(x.documents), x.n)  # noqa: E731
        if at not in best or rank(r) >= rank(best[at]):
            best[at] = r
    lengths: dict[int, list[EvidenceRow]] = {}
    for (length, _), r in sorted(best.items(), key=lambda kv: (kv[0][0], em.METRICS.index(kv[0][1]))):
        lengths.setdefault(length, []).append(r)
    groups = sorted(lengths.values(), key=lambda rs: (min(r.doc_tokens[0] for r in rs), max(r.doc_tokens[1] for r in rs)))
    out: list[Band] = []
    run: list[list[EvidenceRow]] = []
    for g in groups + [None]:
        if g is not None and not length_fails(g):
            run.append(g)
            continue
        if run:
            out.append(Band(min(r.doc_tokens[0] for r in run[0]), max(r.doc_tokens[1] for r in run[-1]) + QUESTION_ALLOWANCE,
                            tuple(r for g_ in run for r in g_)))
            run = []
    what = "group-sparse" if arm == "group" else "specprefill"
    if out:  # the lengths measured for this key that fail are named too: a prompt no band covers says why
        failing = sorted((g for g in groups if length_fails(g)), key=lambda g: g[0].length)
        return tuple(out), ("" if not failing else f"{what} evidence for these settings does not pass at "
                            + "; ".join(f"{g[0].length} ({g[0].source or 'no source'}): {length_fails(g)}" for g in failing)
                            + "; docs/quality.md")
    if groups:
        return (), (f"{what} evidence for these settings does not pass ("
                    + "; ".join(f"{g[0].length}: {length_fails(g)}" for g in sorted(groups, key=lambda g: g[0].length))
                    + "; docs/quality.md)")
    passing = [r for r in live if r.passes]
    if not passing:
        off = [r for r in live if r.disabled]  # e.g. by shadow checks (shadow.py): the reason names it
        return (), (f"no {what} evidence row passes ({len(live)} rows"
                    + (f"; {len(off)} disabled, {off[0].length}: {off[0].disabled}" if off else "")
                    + added_text(live)
                    + f"; a pass needs {_bar_text('answer_right')}; docs/quality.md)")
    # the passing row that matches the job longest: the field where it stops is the one to name
    if key is None:
        return (), f"no evidence for this job's settings ({len(passing)} passing {what} rows; docs/quality.md)"
    diffs = [(FIELDS.index(first_difference(key, r.key)), r) for r in passing]
    at, row = max(diffs, key=lambda x: x[0])
    name = FIELDS[at]
    return (), f"no evidence for {key.describe(name)} (passing rows have {row.key.describe(name)}; docs/quality.md)"


@dataclass(frozen=True)
class KeepChoice:
    """The keep a job that sets none runs (`certified_keep`): `keep`, and the certified rows that chose it (none:
    the default), and `why`, which the job's reason quotes."""

    keep: float
    rows: tuple[EvidenceRow, ...]
    why: str


def certified_keep(rows: Sequence[EvidenceRow], key: EvidenceKey | None, n_prompt: int, default: float,
                   arm: str = "specprefill") -> KeepChoice:
    """The keep for a job of `key` (its keep ignored: the job set none) and `n_prompt` tokens: the keep of the
    certified `arm` rows measured with the job's other settings at a length whose documents cover the prompt
    (doc_tokens + QUESTION_ALLOWANCE, as a band) and whose rows pass together (`length_fails`), else `default`.
    Where several certified keeps qualify (overlapping lengths, or calibrations of different days), the largest.
    A job that declares no task needs a certified keep for every kind there (the largest of them); a kind
    without one gives the default."""
    if key is None:
        return KeepChoice(default, (), f"keep {default:g} (default: no certified keep; no row passes)")
    kinds = TASK_KINDS if key.task is None else (key.task,)
    chosen: list[tuple[EvidenceRow, ...]] = []
    for kind in kinds:
        job = replace(key, task=kind)
        groups: dict[tuple[int, float], list[EvidenceRow]] = {}
        for r in rows:
            if (r.arm == arm and r.certified and first_difference(replace(job, keep=r.key.keep), r.key) is None):
                groups.setdefault((r.length, r.key.keep), []).append(r)
        ok = [tuple(g) for g in groups.values()
              if min(r.doc_tokens[0] for r in g) <= n_prompt <= max(r.doc_tokens[1] for r in g) + QUESTION_ALLOWANCE
              and not length_fails(g)]
        if not ok:
            what = f" for {kind} questions" if key.task is None else ""
            return KeepChoice(default, (), f"keep {default:g} (default: no certified keep{what} at {n_prompt:,} tokens "
                                           "for these settings; docs/quality.md)")
        chosen.append(max(ok, key=lambda g: g[0].key.keep))
    best = max(chosen, key=lambda g: g[0].key.keep)
    lead = next((r for r in best if r.metric in em.DECISIVE), best[0])
    return KeepChoice(best[0].key.keep, best,
                      f"keep {best[0].key.keep:g} (certified for {lead.length:,}-token documents on {len(lead.documents)} "
                      f"documents the choice did not see: {lead.metric} {lead.value:.2f}, 90% lower {lead.bound:.2f}; "
                      f"{lead.source or 'no source'}; docs/quality.md)")


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
    right = f" ({bar.min_baseline_right} of them baseline-right)" if bar.min_baseline_right else ""
    return (f">= {bar.min_documents} documents, >= {bar.min_questions} questions{right}, a clustered lower bound >= "
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
    return replace(row, documents=documents, bound=em.row_bound(row.metric, documents))


__all__ = ["EvidenceRow", "Band", "KeepChoice", "certified_keep", "KIND_METRIC", "every_kind", "PassBar", "PASS_BARS", "PROVISIONAL_BARS", "length_fails",
           "QUESTION_ALLOWANCE", "SHIPPED_PATH", "row_from_dict", "load_rows",
           "shipped_rows", "merge", "listing", "lookup", "added_text", "with_documents"]
