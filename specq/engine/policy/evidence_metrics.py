"""The metrics an evidence row may measure, per question and per document (`specq calibrate`, issue 48).

`answer_right` needs a reference answer (given, or a built-in family's grader); the other three are
label-free: they compare the specprefill answer with the pair's *own* full-prefill (baseline) answer,
so any pair can be calibrated on any documents.

* `answer_right`: baseline right and specprefill right per question; the row's value is the ratio
  (specprefill right / baseline right), bounded as before (evidence_bound.row_lower).
* `agreement`: 1 when the two greedy answers are equal after `normalise` (case, whitespace, quotes and
  trailing punctuation), else 0. Per document: {"n", "sum"} (sum = questions that agree); bound: the
  smaller of the document bootstrap of the mean and the exact binomial (Clopper-Pearson) bound over
  all questions, as `row_lower` does for answer_right.
* `token_f1`: the SQuAD-style F1 of specprefill's answer's normalised words against baseline's (1.0
  when both are empty). Per document {"n", "sum"}; bound: the document bootstrap of the mean.
* `loglik_delta`: the mean per-token log-likelihood of baseline's greedy answer teacher-forced under
  the sparse context (the specprefill run's kept tokens) minus under the full context (engine/
  calibration.py). 0 = the target finds its own answer as likely with the dropped tokens gone; below
  0 = less likely. Per document {"n", "sum"}; bound: the document bootstrap of the mean.

Their pass bars (evidence.PASS_BARS) for the three label-free metrics are PROVISIONAL: how well they
predict answer_right has not been measured yet (issue 48 item 5; docs/quality.md says so).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from typing import Any, Iterable, Mapping

from .evidence_bound import METHOD as ANSWER_METHOD, bootstrap_ratio_lower, cp_lower, row_lower

#: every metric a row may carry; the first is the labelled one
METRICS = ("answer_right", "agreement", "token_f1", "loglik_delta")
#: metrics whose rows hold per document {"n", "sum"} (the others: answer_right's counts)
MEAN_METRICS = ("agreement", "token_f1", "loglik_delta")
#: the metrics a key needs at least one passing row of (evidence.lookup): they say the *answer* holds;
#: token_f1 and loglik_delta alone never turn specprefill on
DECISIVE = ("answer_right", "agreement")
#: each metric's bound method (a posted row must name its metric's)
METHODS = {"answer_right": ANSWER_METHOD, "agreement": "min(document-bootstrap, exact-binomial)",
           "token_f1": "document-bootstrap of the mean", "loglik_delta": "document-bootstrap of the mean"}

_PUNCT_EDGE = re.compile(r"^[\s\"'`“”‘’(\[]+|[\s\"'`“”‘’)\].,;:!?]+$")


def normalise(text: str) -> str:
    """An answer compared as words: NFKC, lower case, whitespace collapsed, quotes, brackets and
    trailing punctuation stripped from the ends."""
    t = " ".join(unicodedata.normalize("NFKC", text).lower().split())
    return _PUNCT_EDGE.sub("", t)


def words(text: str) -> list[str]:
    """`normalise`d words with punctuation around each word stripped."""
    out = []
    for w in normalise(text).split():
        w = _PUNCT_EDGE.sub("", w)
        if w:
            out.append(w)
    return out


def agreement(arm: str, baseline: str) -> int:
    return int(normalise(arm) == normalise(baseline))


def token_f1(arm: str, baseline: str) -> float:
    """F1 of `arm`'s words against `baseline`'s (bags of words: SQuAD's answer F1)."""
    a, b = words(arm), words(baseline)
    if not a and not b:
        return 1.0
    common = sum((Counter(a) & Counter(b)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(b)
    return 2 * precision * recall / (precision + recall)


def answer_matches(text: str, answer: str) -> bool:
    """A given reference answer is right when its normalised words stand, in order, in the text's."""
    want, got = words(answer), words(text)
    if not want:
        return False
    k = len(want)
    return any(got[i:i + k] == want for i in range(len(got) - k + 1))


def question_values(unit: Mapping[str, Any]) -> dict[str, Any]:
    """One calibration unit's metric values (engine/calibration.py's record: `baseline` and
    `specprefill` texts, `loglik_full` and `loglik_sparse`, and where a reference exists
    `baseline_right` and `arm_right`)."""
    base, arm = unit["baseline"]["text"], unit["specprefill"]["text"]
    out: dict[str, Any] = {"agreement": agreement(arm, base), "token_f1": token_f1(arm, base)}
    full, sparse = unit.get("loglik_full"), unit.get("loglik_sparse")
    if full is not None and sparse is not None:
        out["loglik_delta"] = float(sparse) - float(full)
    if unit.get("baseline_right") is not None:
        out["answer_right"] = (bool(unit["baseline_right"]), bool(unit["arm_right"]))
    return out


def documents_for(metric: str, units: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, dict]:
    """Per document (name -> counts) of `metric` over (document name, question_values) pairs; questions
    without a value for it are left out. answer_right: n, baseline_right, arm_right, both_right;
    the others: n, sum."""
    docs: dict[str, dict] = {}
    for name, values in units:
        if metric not in values:
            continue
        v = values[metric]
        if metric == "answer_right":
            base, arm = v
            d = docs.setdefault(name, {"n": 0, "baseline_right": 0, "arm_right": 0, "both_right": 0})
            d["n"] += 1
            d["baseline_right"] += int(base)
            d["arm_right"] += int(arm)
            d["both_right"] += int(base and arm)
        else:
            d = docs.setdefault(name, {"n": 0, "sum": 0.0 if metric != "agreement" else 0})
            d["n"] += 1
            d["sum"] += v
    for d in docs.values():
        if isinstance(d.get("sum"), float):
            d["sum"] = round(d["sum"], 6)
    return docs


def check_documents(metric: str, documents: Any) -> dict[str, dict]:
    """A row's per-document values validated for its metric (ValueError names the first bad one)."""
    if not isinstance(documents, dict) or not documents:
        raise ValueError("documents: must be a non-empty object of per-document counts")
    clean: dict[str, dict] = {}
    for name, d in documents.items():
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ValueError("documents: each document needs a name (its content hash) of 1-200 characters")
        if metric == "answer_right":
            fields = ("n", "baseline_right", "arm_right", "both_right")
        else:
            fields = ("n", "sum")
        if not isinstance(d, dict):
            raise ValueError(f"documents.{name}: must be an object of {', '.join(fields)}")
        vals: dict[str, Any] = {}
        for c in fields:
            v = d.get(c)
            if c == "sum" and metric != "agreement":
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                v = float(v) if ok else v
            else:
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
            if not ok:
                raise ValueError(f"documents.{name}.{c}: must be " + ("a finite number" if c == "sum" and metric != "agreement"
                                                                       else "an integer >= 0"))
            vals[c] = v
        if metric == "answer_right":
            if (vals["n"] < 1 or vals["baseline_right"] > vals["n"] or vals["arm_right"] > vals["n"]
                    or vals["both_right"] > min(vals["baseline_right"], vals["arm_right"])
                    or vals["baseline_right"] + vals["arm_right"] - vals["both_right"] > vals["n"]):
                raise ValueError(f"documents.{name}: needs n >= 1, baseline_right and arm_right <= n, "
                                 "both_right <= each of them, and their union <= n")
        else:
            lo, hi = {"agreement": (0, 1), "token_f1": (0, 1), "loglik_delta": (-math.inf, math.inf)}[metric]
            if vals["n"] < 1 or not lo * vals["n"] - 1e-9 <= vals["sum"] <= hi * vals["n"] + 1e-9:
                raise ValueError(f"documents.{name}: needs n >= 1 and sum within [{lo}, {hi}] per question")
        clean[name] = vals
    return clean


def mean(documents: Mapping[str, Mapping[str, Any]]) -> float:
    n = sum(int(d["n"]) for d in documents.values())
    return sum(float(d["sum"]) for d in documents.values()) / n if n else 0.0


def row_bound(metric: str, documents: Mapping[str, Mapping[str, Any]], conf: float = 0.9) -> float:
    """A row's one-sided `conf` lower bound (METHODS[metric]), clustered by document."""
    if metric == "answer_right":
        return row_lower(documents, conf)
    sums = [float(d["sum"]) for d in documents.values()]
    ns = [int(d["n"]) for d in documents.values()]
    boot = bootstrap_ratio_lower(sums, ns, conf)
    if metric == "agreement":
        return min(boot, cp_lower(int(sum(sums)), sum(ns), conf))
    return boot


__all__ = ["METRICS", "MEAN_METRICS", "DECISIVE", "METHODS", "normalise", "words", "agreement", "token_f1",
           "answer_matches", "question_values", "documents_for", "check_documents", "mean", "row_bound"]
