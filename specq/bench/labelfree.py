"""Do the label-free metrics mean anything? Confusion tables against labels (issue 48 item 5).

`specq bench labelfree --journals A.jsonl,B.jsonl --out FILE.json` reads answer journals that carry both
arms' answers *and* their grades against a reference: `specq bench quality` answer journals (`half:
answer`, `baseline` / `specprefill` with `correct`) and `specq calibrate` journals (units with
`baseline_right` / `arm_right`, and the teacher-forced log-likelihoods). Per question it computes the
label-free metrics with evidence_metrics' own functions (`agreement`, `token_f1`; `loglik_delta` where the
record has both log-likelihoods) and labels the question by its grades:

* `harm`: baseline right, specprefill wrong (what a label-free metric should catch);
* `gain`: baseline wrong, specprefill right;
* `both-right`, `both-wrong`.

A metric *alarms* on a question when its value is below a threshold. Per metric and threshold the
confusion table counts caught harms (alarm, harm), missed harms, false alarms (alarm, no harm: split into
both-right and the others, gain or both-wrong, where the answer did change) and quiet questions; and the
same per document (questions share documents, so a document counts once: a harm document is caught when
an alarm fell on one of its harms, a document without harm raises a false alarm when any question of it
alarms).

**Choosing out of sample.** Journals matching `choose_on` (globs) are the *choosing set*: each metric's
question-level threshold is chosen there by RULE (maximum Youden J = catch rate - false-alarm rate, over
the thresholds "below v" for every value v seen in the choosing set; ties to the smaller threshold, i.e.
fewer alarms). The *check set* (journals matching `check_on`, by default every other journal) is
counted at that threshold, **less its questions about documents the choosing set holds** (the same
document under another chunk rule is not out of sample). Rates come with 90% Wilson intervals. The
choosing set's own figures are in-sample.

**What it implies for a row.** A row's value is a mean over its questions, so the expected row mean at
harm rate k is (1 - k) x (mean over non-harm questions) + k x (mean over harm questions): `row_means`
gives both means, the row mean at a few k, and the k where it crosses the provisional bar
(evidence.PASS_BARS). `rows` gives each journal's observed (arm, length) row: its harms and gains beside
each metric's mean.

A question's document is the record's `doc_sha256` (or a calibrate unit's `doc`) where it has one, else its
family (`specq bench quality --family`: one document per family), else its task (one document per task). A
family that other journals' records name together with one `doc_sha256` is that document in every journal
(older journals record only the family: without this, the same document would count as two, and a question
about a choosing-set document could land in the check set).

Closed-book-right questions, records without both arms, and ungraded answers (a summary has no
answer-right) are left out and counted; a question two journals hold with the same settings (same
`settings_key` and task or unit) counts once, from the first journal given.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..engine.policy.evidence import PASS_BARS
from ..engine.policy.evidence_metrics import agreement, token_f1
from .quality_report import read_journal

#: the label-free metrics, in table order
METRICS = ("agreement", "token_f1", "loglik_delta")
LABELS = ("harm", "gain", "both-right", "both-wrong")
RULE = ("maximum Youden J (catch rate - false-alarm rate) over thresholds 'value < v' for every value v seen in the "
        "choosing set; ties to the smaller threshold (fewer alarms)")
#: the default choosing set: the lookup families under the mean and scope rules (the check set: the rest)
CHOOSE_ON = ("*families*", "*scope*")
#: two-sided 90% Wilson intervals (each end a one-sided 95% bound)
Z = 1.6448536269514722
#: harm rates at which the expected row mean is given
HARM_RATES = (0.0, 0.05, 0.10, 0.20)


@dataclass
class Question:
    """One graded question with both arms' answers."""

    journal: str
    key: tuple[str, str, str]  #: (format, settings key, task or unit id): what de-duplicates
    document: str
    kind: str
    length: int
    keep: float
    label: str
    values: dict[str, float] = field(default_factory=dict)

    @property
    def harm(self) -> bool:
        return self.label == "harm"


def label(baseline_right: bool, arm_right: bool) -> str:
    if baseline_right:
        return "both-right" if arm_right else "harm"
    return "gain" if arm_right else "both-wrong"


def _values(base: str, arm: str, full: Any = None, sparse: Any = None) -> dict[str, float]:
    out: dict[str, float] = {"agreement": agreement(arm, base), "token_f1": token_f1(arm, base)}
    if full is not None and sparse is not None:
        out["loglik_delta"] = float(sparse) - float(full)
    return out


def question_of(r: dict, journal: str, family_docs: dict[str, str] | None = None) -> tuple[Question | None, str]:
    """(the record's question, "") or (None, why it is left out); "" for lines that are not answers.
    family_docs: family -> the doc_sha256 other records give it (module doc)."""
    if "unit" in r and isinstance(r.get("baseline"), dict) and isinstance(r.get("specprefill"), dict):  # specq calibrate
        if r.get("baseline_right") is None or r.get("arm_right") is None:
            return None, "ungraded"
        k = r.get("key") or {}
        return Question(journal, ("calibrate", str(r.get("settings_key", "")), str(r["unit"])), str(r.get("doc") or r["unit"]),
                        str(k.get("task") or "lookup"), int(r.get("length") or 0), float(r.get("keep") or k.get("keep") or 0),
                        label(bool(r["baseline_right"]), bool(r["arm_right"])),
                        _values(r["baseline"].get("text", ""), r["specprefill"].get("text", ""), r.get("loglik_full"),
                                r.get("loglik_sparse"))), ""
    if r.get("half") != "answer":
        return None, ""
    if (r.get("closed_book") or {}).get("correct"):
        return None, "closed-book right"
    b, s = r.get("baseline"), r.get("specprefill")
    if not isinstance(b, dict) or not isinstance(s, dict):
        return None, "without both arms"
    if b.get("correct") is None or s.get("correct") is None:
        return None, "ungraded"
    family = r.get("family")
    doc = r.get("doc_sha256") or (family_docs or {}).get(family) or family or r["task"]
    return Question(journal, ("quality", str(r.get("settings_key", "")), str(r["task"])), str(doc), str(r.get("kind", "")),
                    int(r.get("length") or 0), float((r.get("settings") or {}).get("keep", 0)),
                    label(bool(b["correct"]), bool(s["correct"])),
                    _values(b.get("text", ""), s.get("text", ""), r.get("loglik_full"), r.get("loglik_sparse"))), ""


def families_with_one_document(records: Iterable[Any]) -> dict[str, str]:
    """family -> doc_sha256, for every family the records name with exactly one doc_sha256."""
    seen: dict[str, set[str]] = {}
    for r in records:
        if isinstance(r, dict) and r.get("family") and r.get("doc_sha256"):
            seen.setdefault(str(r["family"]), set()).add(str(r["doc_sha256"]))
    return {f: next(iter(docs)) for f, docs in seen.items() if len(docs) == 1}


def read_questions(paths: Sequence[Path]) -> tuple[list[Question], list[dict]]:
    """Every graded question of the journals (de-duplicated) and, per journal, what was counted and left out."""
    seen: set[tuple] = set()
    questions: list[Question] = []
    journals = []
    read = [(path, path.read_bytes(), list(read_journal(path))) for path in paths]
    family_docs = families_with_one_document(r for _, _, records in read for r in records)
    for path, text, records in read:
        counts = {"questions": 0, "duplicates": 0, "closed-book right": 0, "without both arms": 0, "ungraded": 0}
        for r in records:
            if not isinstance(r, dict):
                continue
            q, why = question_of(r, str(path), family_docs)
            if q is None:
                if why:
                    counts[why] += 1
                continue
            if q.key in seen:
                counts["duplicates"] += 1
                continue
            seen.add(q.key)
            questions.append(q)
            counts["questions"] += 1
        journals.append({"path": str(path), "sha256": hashlib.sha256(text).hexdigest(), **counts})
    return questions, journals


def matches(path: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(path, g) or fnmatch.fnmatch(Path(path).name, g) for g in globs)


# ----------------------------------------------------------------------------------------- counting


def wilson(k: int, n: int, z: float = Z) -> list[float] | None:
    """Two-sided Wilson score interval of k / n (None when n = 0)."""
    if n <= 0:
        return None
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, c - h), 4), round(min(1.0, c + h), 4)]


def confusion(questions: Sequence[Question], metric: str, threshold: float) -> dict[str, Any]:
    """Alarm (value < threshold) against harm, per question and per document; questions without a value for
    `metric` are left out."""
    qs = [q for q in questions if metric in q.values]
    alarm = [q.values[metric] < threshold for q in qs]
    caught = sum(a and q.harm for a, q in zip(alarm, qs))
    harms = sum(q.harm for q in qs)
    fa_right = sum(a and q.label == "both-right" for a, q in zip(alarm, qs))
    fa_other = sum(a and q.label in ("gain", "both-wrong") for a, q in zip(alarm, qs))
    non_harm = len(qs) - harms
    docs: dict[str, dict[str, bool]] = {}
    for a, q in zip(alarm, qs):
        d = docs.setdefault(q.document, {"harm": False, "caught": False, "alarm": False})
        d["harm"] |= q.harm
        d["caught"] |= a and q.harm
        d["alarm"] |= a
    harm_docs = [d for d in docs.values() if d["harm"]]
    clean_docs = [d for d in docs.values() if not d["harm"]]
    return {
        "threshold": threshold, "n": len(qs), "harms": harms, "caught": caught, "missed": harms - caught,
        "false_alarms": fa_right + fa_other, "false_alarms_both_right": fa_right, "false_alarms_other": fa_other,
        "quiet": non_harm - fa_right - fa_other, "non_harm": non_harm,
        "catch_rate": round(caught / harms, 4) if harms else None, "catch_interval": wilson(caught, harms),
        "false_alarm_rate": round((fa_right + fa_other) / non_harm, 4) if non_harm else None,
        "false_alarm_interval": wilson(fa_right + fa_other, non_harm),
        "documents": {"n": len(docs), "with_harm": len(harm_docs), "harm_caught": sum(d["caught"] for d in harm_docs),
                      "without_harm": len(clean_docs), "false_alarm": sum(d["alarm"] for d in clean_docs)},
    }


def youden(c: dict[str, Any]) -> float | None:
    if c["catch_rate"] is None or c["false_alarm_rate"] is None:
        return None
    return c["catch_rate"] - c["false_alarm_rate"]


def candidates(questions: Sequence[Question], metric: str) -> list[float]:
    """The thresholds worth trying: every value seen (alarm = value below it), ascending."""
    return sorted({q.values[metric] for q in questions if metric in q.values})


def choose(questions: Sequence[Question], metric: str) -> dict[str, Any] | None:
    """RULE on `questions`: the threshold and its (in-sample) confusion; None without a harm and a non-harm
    question that carry the metric."""
    best = None
    for t in candidates(questions, metric):
        c = confusion(questions, metric, t)
        j = youden(c)
        if j is None:
            return None
        if best is None or j > best[0] + 1e-12:
            best = (j, c)
    return None if best is None else {**best[1], "youden_j": round(best[0], 4)}


def row_means(questions: Sequence[Question], metric: str) -> dict[str, Any] | None:
    """The expected row mean of `metric` at harm rate k, from the questions' non-harm and harm means, and the k
    where it crosses the provisional bar."""
    qs = [q for q in questions if metric in q.values]
    harm = [q.values[metric] for q in qs if q.harm]
    rest = [q.values[metric] for q in qs if not q.harm]
    right = [q.values[metric] for q in qs if q.label == "both-right"]
    if not harm or not rest:
        return None
    m1, m0 = sum(harm) / len(harm), sum(rest) / len(rest)
    bar = PASS_BARS[metric].min_bound
    crossing = None if m0 < bar else (round((m0 - bar) / (m0 - m1), 4) if m0 > m1 else None)
    return {"bar": bar, "non_harm_mean": round(m0, 4), "harm_mean": round(m1, 4), "non_harm_n": len(rest), "harm_n": len(harm),
            "both_right_mean": round(sum(right) / len(right), 4) if right else None,
            "at_harm_rate": {f"{k:g}": round((1 - k) * m0 + k * m1, 4) for k in HARM_RATES},
            "harm_rate_at_bar": crossing, "fails_at_zero_harm": m0 < bar}


def rows(questions: Sequence[Question]) -> list[dict[str, Any]]:
    """Each journal's (length, keep) group as a row would hold it: labels beside each metric's mean."""
    groups: dict[tuple, list[Question]] = {}
    for q in questions:
        groups.setdefault((q.journal, q.length, q.keep), []).append(q)
    out = []
    for (journal, length, keep), qs in groups.items():
        counts = {lab: sum(q.label == lab for q in qs) for lab in LABELS}
        base = counts["harm"] + counts["both-right"]
        means = {}
        for m in METRICS:
            v = [q.values[m] for q in qs if m in q.values]
            means[m] = round(sum(v) / len(v), 4) if v else None
        out.append({"journal": journal, "length": length, "keep": keep, "n": len(qs), "documents": len({q.document for q in qs}),
                    **counts, "answer_ratio": round((counts["both-right"] + counts["gain"]) / base, 4) if base else None,
                    "means": means, "passes_bar": {m: (None if means[m] is None else means[m] >= PASS_BARS[m].min_bound)
                                                   for m in METRICS}})
    return out


# ----------------------------------------------------------------------------------------- the report


def build(paths: Sequence[Path], choose_on: Sequence[str] = CHOOSE_ON, check_on: Sequence[str] = ()) -> dict[str, Any]:
    """The report (module doc); without provenance (the command adds it)."""
    questions, journals = read_questions(paths)
    choosing = [q for q in questions if matches(q.journal, choose_on)]
    seen_docs = {q.document for q in choosing}
    chosen_keys = {q.key for q in choosing}
    check_all = [q for q in questions if q.key not in chosen_keys and (matches(q.journal, check_on) if check_on else True)]
    checking = [q for q in check_all if q.document not in seen_docs]
    for j in journals:
        j["role"] = ("choose" if matches(j["path"], choose_on) else
                     "check" if (matches(j["path"], check_on) if check_on else True) else "unused")
    metrics: dict[str, Any] = {}
    for m in METRICS:
        have = [q for q in questions if m in q.values]
        entry: dict[str, Any] = {"questions": len(have), "journals": sorted({q.journal for q in have}),
                                 "documents": len({q.document for q in have}),
                                 "at_bar": confusion(questions, m, PASS_BARS[m].min_bound) if have else None,
                                 "sweep": [confusion(questions, m, t) for t in candidates(questions, m)],
                                 "row_means": row_means(questions, m)}
        chosen = choose(choosing, m)
        entry["chosen"] = None if chosen is None else {
            "threshold": chosen["threshold"], "youden_j": chosen["youden_j"], "choose": chosen,
            "check": confusion(checking, m, chosen["threshold"]) if any(m in q.values for q in checking) else None}
        metrics[m] = entry
    return {
        "benchmark": "labelfree",
        "rule": RULE, "interval": "two-sided 90% Wilson", "choose_on": list(choose_on), "check_on": list(check_on),
        "journals": journals,
        "questions": len(questions), "documents": len({q.document for q in questions}),
        "labels": {lab: sum(q.label == lab for q in questions) for lab in LABELS},
        "harms_by_keep": {f"{k:g}": sum(q.harm for q in questions if q.keep == k) for k in sorted({q.keep for q in questions})},
        "choosing": {"questions": len(choosing), "documents": len(seen_docs), "harms": sum(q.harm for q in choosing)},
        "checking": {"questions": len(checking), "documents": len({q.document for q in checking}),
                     "harms": sum(q.harm for q in checking),
                     "left_out_shared_documents": len(check_all) - len(checking)},
        "metrics": metrics,
        "rows": rows(questions),
        "per_question": [{"journal": q.journal, "id": q.key[2], "document": q.document, "kind": q.kind, "length": q.length,
                          "keep": q.keep, "label": q.label, **{m: round(v, 6) for m, v in q.values.items()}} for q in questions],
    }


def _rate(k: int, n: int, iv: list[float] | None) -> str:
    if not n:
        return "– / 0"
    return f"{k} / {n} ({iv[0]:.2f}–{iv[1]:.2f})" if iv else f"{k} / {n}"


def _thr(metric: str, t: float) -> str:
    return f"< {t:+.3f}" if metric == "loglik_delta" else f"< {t:.2f}"


def table_markdown(report: dict) -> str:
    """The confusion table per metric (chosen threshold: check set, then the in-sample choosing set; and the
    provisional bar on every question), and the row means it implies."""
    head = ["metric", "alarm when", "set", "questions (documents)", "harms caught", "false alarms / non-harm",
            "of them both right", "documents with harm: caught / all; without: alarmed / all"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---:|---:|---:|---:|---:|"]

    def line(m: str, t: float, which: str, c: dict) -> None:
        d = c["documents"]
        lines.append("| " + " | ".join([
            f"`{m}`", _thr(m, t), which, f"{c['n']} ({d['n']})", _rate(c["caught"], c["harms"], c["catch_interval"]),
            _rate(c["false_alarms"], c["non_harm"], c["false_alarm_interval"]), str(c["false_alarms_both_right"]),
            f"{d['harm_caught']} / {d['with_harm']}; {d['false_alarm']} / {d['without_harm']}"]) + " |")

    for m in METRICS:
        e = report["metrics"][m]
        ch = e["chosen"]
        if ch is not None:
            if ch["check"] is not None:
                line(m, ch["threshold"], "check (chosen on the other set)", ch["check"])
            else:
                lines.append(f"| `{m}` | {_thr(m, ch['threshold'])} | check | 0 | – | – | – | – |")
            line(m, ch["threshold"], f"choosing (in-sample; J {ch['youden_j']:.2f})", ch["choose"])
        elif e["questions"]:
            lines.append(f"| `{m}` | – | choosing | – | no harm and non-harm question carries it | – | – | – |")
        if e["at_bar"] is not None:
            line(m, PASS_BARS[m].min_bound, "all questions, at the row bar", e["at_bar"])
        else:
            lines.append(f"| `{m}` | – | – | 0 | no journal given carries it | – | – | – |")
    out = ["\n".join(lines), ""]
    rhead = ["metric", "row bar", "mean: non-harm (n)", "mean: harm (n)", "mean: both right",
             *[f"row at {float(k):.0%} harm" for k in map(str, HARM_RATES)], "harm rate where a row meets the bar"]
    rl = ["| " + " | ".join(rhead) + " |", "|---|" + "---:|" * (len(rhead) - 1)]
    for m in METRICS:
        r = report["metrics"][m]["row_means"]
        if r is None:
            rl.append(f"| `{m}` | {PASS_BARS[m].min_bound:g} | " + " | ".join(["–"] * (len(rhead) - 2)) + " |")
            continue
        cross = ("fails at 0% harm" if r["fails_at_zero_harm"] else
                 "–" if r["harm_rate_at_bar"] is None else f"{r['harm_rate_at_bar']:.0%}")
        rl.append("| " + " | ".join([f"`{m}`", f"{r['bar']:g}", f"{r['non_harm_mean']:.3f} ({r['non_harm_n']})",
                                     f"{r['harm_mean']:.3f} ({r['harm_n']})",
                                     "–" if r["both_right_mean"] is None else f"{r['both_right_mean']:.3f}",
                                     *[f"{r['at_harm_rate'][f'{k:g}']:.3f}" for k in HARM_RATES], cross]) + " |")
    out += ["\n".join(rl), ""]
    whead = ["journal", "length", "keep", "questions (documents)", "harm / gain", "answer ratio", "agreement", "token F1",
             "loglik Δ", "row bars met (mean)"]
    wl = ["| " + " | ".join(whead) + " |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in sorted(report["rows"], key=lambda r: (r["keep"], r["length"], r["journal"])):
        mm = r["means"]
        met = ", ".join(m for m in METRICS if r["passes_bar"][m]) or "none"
        wl.append("| " + " | ".join([Path(r["journal"]).name, f"{r['length']:,}", f"{r['keep']:g}", f"{r['n']} ({r['documents']})",
                                     f"{r['harm']} / {r['gain']}", "–" if r["answer_ratio"] is None else f"{r['answer_ratio']:.3f}",
                                     *["–" if mm[m] is None else (f"{mm[m]:+.3f}" if m == "loglik_delta" else f"{mm[m]:.3f}")
                                       for m in METRICS], met]) + " |")
    out.append("\n".join(wl))
    return "\n".join(out)


__all__ = ["METRICS", "LABELS", "RULE", "CHOOSE_ON", "HARM_RATES", "Question", "label", "question_of",
           "read_questions", "families_with_one_document", "matches", "wilson", "confusion", "youden", "candidates", "choose", "row_means", "rows", "build",
           "table_markdown"]
