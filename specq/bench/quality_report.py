"""`specq bench quality`: statistics, the aggregated report, its table and its plot.

Statistics (no SciPy needed):

* `cp_lower(k, n, conf)`: exact (Clopper–Pearson) one-sided lower confidence bound of a binomial
  proportion — used for recall.
* `paired(...)`: baseline vs specprefill on the same tasks. Counts a (both right), b (baseline only),
  c (specprefill only), d (both wrong). The accuracy ratio is (a + c) / (a + b). Its lower bound is
  exact conditional on the concordant count a and the number of discordant pairs b + c (as in the
  exact McNemar test): c | b + c ~ Binomial(b + c, θ); the Clopper–Pearson lower bound θ_lo at the
  given confidence gives ratio_lo = (a + θ_lo·m) / (a + m − θ_lo·m) with m = b + c, which is
  increasing in θ. Tasks answered closed-book (without the document) are counted apart and left out.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from ..engine.policy.evidence import PASS_BARS
from ..engine.policy.evidence_bound import cp_lower, row_lower  # (the exact bound lives beside evidence rows' bounds)
from ..engine.policy.evidence_key import TORCH_SPECULATOR_KEY
from ..engine.options import CHUNK_RULES


def paired(pairs: Iterable[tuple[bool, bool]], conf: float = 0.9) -> dict[str, Any]:
    """pairs: (baseline right, specprefill right) per task. Discordant counts, accuracies, the
    accuracy ratio and its exact conditional one-sided lower bound."""
    a = b = c = d = 0
    for base, spec in pairs:
        if base and spec:
            a += 1
        elif base:
            b += 1
        elif spec:
            c += 1
        else:
            d += 1
    n = a + b + c + d
    m = b + c
    out: dict[str, Any] = {"n": n, "both_right": a, "baseline_only": b, "specprefill_only": c, "both_wrong": d}
    out["baseline_acc"] = (a + b) / n if n else None
    out["specprefill_acc"] = (a + c) / n if n else None
    out["ratio"] = (a + c) / (a + b) if a + b else None
    if a + b:
        th = cp_lower(c, m, conf) if m else 0.0
        out["ratio_lower"] = (a + th * m) / (a + m - th * m) if m else 1.0 if a else None
    else:
        out["ratio_lower"] = None
    out["conf"] = conf
    return out


# ----------------------------------------------------------------------------------------- journals


def read_journal(path: Path) -> list[dict]:
    """The records of a JSONL journal; a torn last line (a run killed mid-write) is skipped."""
    out = []
    if not path.exists():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _dedup(records: list[dict]) -> list[dict]:
    seen: dict[tuple, dict] = {}
    for r in records:
        seen[(r.get("half"), r.get("task"), r.get("settings_key"))] = r
    return list(seen.values())


def aggregate(records: list[dict], conf: float = 0.9) -> dict[str, Any]:
    """Cells of the table from journal records (recall and answer halves)."""
    records = _dedup(records)
    recall: dict[tuple, list] = defaultdict(list)
    rand: dict[tuple, list] = defaultdict(list)
    score_ms: dict[tuple, list] = defaultdict(list)
    own_pass: dict[tuple, bool] = defaultdict(bool)  # the scorer ran its own pass on some task
    kinds: dict[tuple, dict] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    # documents behind each arm's tasks and its random control, per (length, scorer): journals joined in
    # one report may cover different tasks (an arm stopped early), so neither is pooled over the length
    families: dict[tuple, set] = defaultdict(set)  # a task alone is its own document
    loads: list[float] = []
    for r in records:
        if r.get("half") != "recall":
            continue
        L = r["length"]
        loads.append(r.get("load1", 0.0))
        for scorer, by_keep in r["kept"].items():
            families[(L, scorer)].add(r.get("family") or r["task"])
            for keep, p in r["random"].items():
                rand[(L, scorer, keep)].append(p)
            for keep, hit in by_keep.items():
                recall[(L, scorer, keep)].append(bool(hit))
                k = kinds[(L, scorer, keep)][r["kind"]]
                k[0] += bool(hit)
                k[1] += 1
            if scorer in r.get("score_ms", {}):
                score_ms[(L, scorer)].append(r["score_ms"][scorer])
            own_pass[(L, scorer)] |= scorer in r.get("score_ms", {}) or "-" in scorer
    recall_rows = []
    for (L, scorer, keep), hits in sorted(recall.items()):
        k, n = sum(hits), len(hits)
        rr = rand.get((L, scorer, keep), [])
        recall_rows.append({
            "length": L, "scorer": scorer, "keep": float(keep), "n": n, "documents": len(families[(L, scorer)]),
            "recall": k / n, "recall_lower": cp_lower(k, n, conf),
            "random_recall": sum(rr) / len(rr) if rr else None,
            "by_kind": {kk: {"kept": v[0], "n": v[1]} for kk, v in sorted(kinds[(L, scorer, keep)].items())},
            "score_ms_median": statistics.median(score_ms[(L, scorer)]) if score_ms.get((L, scorer)) else None,
            # full on one-window documents is the windowed pass itself (not run twice)
            "same_pass_as_windowed": scorer == "full" and not own_pass[(L, scorer)],
        })
    # windowed vs full, paired on the same tasks
    pair_rows, arm_rows = [], []
    by_task: dict[tuple, dict] = defaultdict(dict)
    for r in records:
        if r.get("half") == "recall":
            for scorer, by_keep in r["kept"].items():
                for keep, hit in by_keep.items():
                    by_task[(r["length"], keep)].setdefault(r["task"], {})[scorer] = bool(hit)
    for (L, keep), tasks in sorted(by_task.items()):
        both = [(t["full"], t["windowed"]) for t in tasks.values() if "full" in t and "windowed" in t]
        if both:
            p = paired(both, conf)
            pair_rows.append({"length": L, "keep": float(keep), "n": p["n"], "full_only": p["baseline_only"],
                              "windowed_only": p["specprefill_only"], "both": p["both_right"], "neither": p["both_wrong"]})
        # window-size arms (`windowed@W`, quality.scorer_arm) against the default windowed scorer, and the
        # other chunk rules from the same pass (`<scorer>-<rule>`) against the scorer under the run's rule
        rule_arm = lambda k: next((r for r in CHUNK_RULES if k.endswith(f"-{r}")), None)  # noqa: E731
        for arm in sorted({k for t in tasks.values() for k in t if k.startswith("windowed@") or rule_arm(k)}):
            base = arm[: -len(rule_arm(arm)) - 1] if rule_arm(arm) else "windowed"
            both = [(t[base], t[arm]) for t in tasks.values() if arm in t and base in t]
            if both:
                p = paired(both, conf)
                arm_rows.append({"length": L, "keep": float(keep), "arm": arm, "default": base, "n": p["n"], "default_only": p["baseline_only"],
                                 "arm_only": p["specprefill_only"], "both": p["both_right"], "neither": p["both_wrong"]})
    answer_rows = []
    groups: dict[tuple[int, str, int, str, str], list] = defaultdict(list)  # (length, scorer, window, rule, speculator):
    for r in records:                                                         # other scorers keep their own rows
        if r.get("half") == "answer" and r.get("kind") not in CODE_KINDS:
            st = r.get("settings", {})
            groups[(r["length"], st.get("scorer", "windowed"), st.get("window", 0), answer_rule(r), speculator_of(r))].append(r)
    for (L, _scorer, window, rule, impl), rs in sorted(groups.items()):
        closed = [r for r in rs if r["closed_book"]["correct"]]
        open_ = [r for r in rs if not r["closed_book"]["correct"] and "baseline" in r and "specprefill" in r]
        p = paired([(r["baseline"]["correct"], r["specprefill"]["correct"]) for r in open_], conf)
        ev = [r["specprefill"].get("evidence_kept") for r in open_ if r["specprefill"].get("evidence_kept") is not None]
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        answer_rows.append({
            "length": L, "keep": rs[0]["settings"]["keep"], "scorer": rs[0]["settings"]["scorer"], **({"window": window} if window else {}),
            "chunk_rule": rule, **({"speculator_impl": impl} if impl != "llama" else {}), "tasks": len(rs),
            "closed_book_right": len(closed), "documents": len({r.get("family") or r["task"] for r in open_}), **p,
            "evidence_kept": (sum(ev) / len(ev)) if ev else None,
            "baseline_ttft_ms_median": med([r["baseline"]["ttft_ms"] for r in open_]),
            "specprefill_ttft_ms_median": med([r["specprefill"]["ttft_ms"] for r in open_]),
            "by_kind": _answer_by_kind(open_),
        })
    return {"recall": recall_rows, "recall_full_vs_windowed": pair_rows, "recall_window_arms": arm_rows, "answer": answer_rows,
            "kinds": kind_rows(records), "group": group_rows(records, conf), "load1_median": statistics.median(loads) if loads else None}


#: the non-lookup kinds (bench/quality_kinds.py), reported per kind; summary has no answer-right (its ids_named)
CODE_KINDS = ("two-place", "aggregation", "review", "summary")
#: a kind's row with fewer baseline-right answers is inconclusive: shown, never passing (issue 49; the evidence
#: rows' pass bar, evidence.PASS_BARS, is where the number is set)
MIN_BASELINE_RIGHT = PASS_BARS["answer_right"].min_baseline_right


def kind_rows(records: list[dict]) -> list[dict]:
    """The non-lookup kinds' answer records per (kind, length, shape, keep): answered questions (closed-book-right
    left out), documents, accuracies, the ratio and its document-clustered 90% lower bound (evidence_bound.row_lower,
    the evidence rows' bound), evidence kept, and `inconclusive` (< MIN_BASELINE_RIGHT baseline-right answers); for
    summary the mean share of the reference's identifiers each arm's answer names instead."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in records:
        if r.get("half") == "answer" and r.get("kind") in CODE_KINDS:
            st = r.get("settings", {})
            groups[(r["kind"], r["length"], st.get("shape", "native"), st.get("keep"))].append(r)
    out = []
    for (kind, L, shape, keep), rs in sorted(groups.items(), key=lambda kv: (CODE_KINDS.index(kv[0][0]), kv[0][1:])):
        open_ = [r for r in rs if not r["closed_book"].get("correct") and "baseline" in r and "specprefill" in r]
        row: dict[str, Any] = {"kind": kind, "length": L, "shape": shape, "keep": keep, "tasks": len(rs),
                               "closed_book_right": sum(bool(r["closed_book"].get("correct")) for r in rs), "n": len(open_),
                               "documents": len({r.get("doc_sha256") or r.get("family") for r in open_})}
        ev = [r["specprefill"]["evidence_kept"] for r in open_ if r["specprefill"].get("evidence_kept") is not None]
        row["evidence_kept"] = sum(ev) / len(ev) if ev else None
        if kind == "summary":
            b = [r["baseline"].get("ids_named", 0.0) for r in open_]
            sp = [r["specprefill"].get("ids_named", 0.0) for r in open_]
            row.update(metric="ids_named", baseline=statistics.mean(b) if b else None, specprefill=statistics.mean(sp) if sp else None)
            row["ratio"] = row["specprefill"] / row["baseline"] if row["baseline"] else None
            out.append(row)
            continue
        docs: dict[str, dict[str, int]] = {}
        for r in open_:
            d = docs.setdefault(r.get("doc_sha256") or r.get("family") or r["task"], {"n": 0, "baseline_right": 0, "arm_right": 0, "both_right": 0})
            base, spec = bool(r["baseline"]["correct"]), bool(r["specprefill"]["correct"])
            d["n"] += 1
            d["baseline_right"] += base
            d["arm_right"] += spec
            d["both_right"] += base and spec
        b = sum(d["baseline_right"] for d in docs.values())
        a = sum(d["arm_right"] for d in docs.values())
        row.update(metric="answer_right", baseline_right=b, specprefill_right=a,
                   baseline=b / len(open_) if open_ else None, specprefill=a / len(open_) if open_ else None,
                   ratio=a / b if b else None, lower=row_lower(docs) if docs else None, inconclusive=b < MIN_BASELINE_RIGHT)
        out.append(row)
    return out


#: how tables name a run whose speculator was the PyTorch forward (EngineOptions.speculator_impl torch)
TORCH_LABEL = " (torch speculator)"


def speculator_of(record: dict) -> str:
    """Who ran an answer record's speculator: torch where its key's score math is the PyTorch forward's, else llama."""
    return "torch" if record.get("key", {}).get("score_math") == TORCH_SPECULATOR_KEY else "llama"


def answer_rule(record: dict) -> str:
    """The chunk rule an answer record's specprefill ran with ("mean": records from before the rule existed)."""
    return record.get("settings", {}).get("chunk_rule", "mean")


def group_rows(records: list[dict], conf: float = 0.9) -> list[dict]:
    """Group-sparse answers (half "group") against the answer half's baseline and specprefill answers
    of the same tasks (joined by task id; same settings): accuracy, the paired ratio vs baseline, and
    how often the group answer is the single specprefill run's answer."""
    answers = {r["task"]: r for r in records if r.get("half") == "answer" and "baseline" in r}
    groups: dict[int, list] = defaultdict(list)
    for r in records:
        if r.get("half") == "group" and "group" in r and r["task"] in answers:
            groups[r["length"]].append((r, answers[r["task"]]))
    out = []
    for L, pairs in sorted(groups.items()):
        vs_base = paired([(a["baseline"]["correct"], g["group"]["correct"]) for g, a in pairs], conf)
        vs_spec = paired([(a["specprefill"]["correct"], g["group"]["correct"]) for g, a in pairs], conf)
        same = sum(g["group"]["text"].strip() == a["specprefill"]["text"].strip() for g, a in pairs)
        unions = [g["group"]["union_kept_fraction"] for g, _ in pairs if g["group"].get("union_kept_fraction") is not None]
        out.append({
            "length": L, "n": len(pairs), "documents": len({g.get("family") for g, _ in pairs}),
            "fallbacks": sum(bool(g["group"].get("fallback")) for g, _ in pairs),
            "baseline_acc": vs_base["baseline_acc"], "specprefill_acc": vs_spec["baseline_acc"],
            "group_acc": vs_base["specprefill_acc"], "ratio_vs_baseline": vs_base["ratio"],
            "ratio_vs_baseline_lower": vs_base["ratio_lower"], "group_only_vs_specprefill": vs_spec["specprefill_only"],
            "specprefill_only_vs_group": vs_spec["baseline_only"], "same_text_as_specprefill": same,
            "union_kept_fraction_median": statistics.median(unions) if unions else None,
        })
    return out


def _answer_by_kind(rs: list[dict]) -> dict:
    out: dict[str, dict] = {}
    for r in rs:
        k = out.setdefault(r["kind"], {"n": 0, "baseline": 0, "specprefill": 0})
        k["n"] += 1
        k["baseline"] += bool(r["baseline"]["correct"])
        k["specprefill"] += bool(r["specprefill"]["correct"])
    return out


# ----------------------------------------------------------------------------------------- table, plot


def _f(x, fmt="{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def table_markdown(agg: dict[str, Any]) -> str:
    lines = []
    if agg["recall"]:
        lines += ["Answer-chunk recall (speculator only; all evidence chunks kept), random control at the same budget:", "",
                  "| doc tokens | scorer | keep | n (documents) | recall | 90% lower | random | needle | multikey | raises | const | score s (median) |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in agg["recall"]:
            bk = r["by_kind"]
            kinds = [f"{bk[k]['kept']}/{bk[k]['n']}" if k in bk else "–" for k in ("needle", "multikey", "raises", "const")]
            sm = r["score_ms_median"]
            name = r["scorer"] + (" (= windowed: one window)" if r.get("same_pass_as_windowed") else "")
            lines.append(f"| {r['length']:,} | {name} | {r['keep']:.1f} | {r['n']} ({r.get('documents', r['n'])}) | {r['recall']:.3f} | {r['recall_lower']:.3f} | "
                         f"{_f(r['random_recall'])} | " + " | ".join(kinds) + f" | {_f(None if sm is None else sm / 1000, '{:.1f}')} |")
        lines.append("")
    if agg["recall_full_vs_windowed"]:
        lines += ["Windowed vs full scorer on the same tasks (recall discordant pairs):", "",
                  "| doc tokens | keep | n | both kept | full only | windowed only | neither |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for r in agg["recall_full_vs_windowed"]:
            lines.append(f"| {r['length']:,} | {r['keep']:.1f} | {r['n']} | {r['both']} | {r['full_only']} | {r['windowed_only']} | {r['neither']} |")
        lines.append("")
    if agg.get("recall_window_arms"):
        lines += ["Arms vs the default on the same tasks (`windowed@W`: another window size; `<scorer>-<rule>`: the same pass "
                  "ranked by another chunk rule), recall discordant pairs:", "",
                  "| doc tokens | keep | default | arm | n | both kept | default only | arm only | neither |",
                  "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
        for r in agg["recall_window_arms"]:
            lines.append(f"| {r['length']:,} | {r['keep']:.1f} | {r.get('default', 'windowed')} | {r['arm']} | {r['n']} | {r['both']} | "
                         f"{r['default_only']} | {r['arm_only']} | {r['neither']} |")
        lines.append("")
    if agg["answer"]:
        lines += ["Answer right (target), baseline vs specprefill, paired; closed-book-right tasks left out:", "",
                  "| doc tokens | scorer, keep, chunk rule | tasks | closed-book right | n (documents) | baseline acc | specprefill acc | ratio | 90% lower | "
                  "baseline only | specprefill only | evidence kept | TTFT s base / spec |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in agg["answer"]:
            tt = (f"{r['baseline_ttft_ms_median'] / 1000:.1f} / {r['specprefill_ttft_ms_median'] / 1000:.1f}"
                  if r["baseline_ttft_ms_median"] else "–")
            lines.append(f"| {r['length']:,} | {r['scorer']}{'@' + str(r['window']) if r.get('window') else ''} {r['keep']} {r.get('chunk_rule', 'mean')}{TORCH_LABEL if r.get('speculator_impl') else ''} | {r['tasks']} | {r['closed_book_right']} | {r['n']} ({r.get('documents', r['n'])}) | "
                         f"{_f(r['baseline_acc'])} | {_f(r['specprefill_acc'])} | {_f(r['ratio'])} | {_f(r['ratio_lower'])} | "
                         f"{r['baseline_only']} | {r['specprefill_only']} | {_f(r['evidence_kept'])} | {tt} |")
        lines.append("")
    if agg.get("kinds"):
        lines += ["Task kinds beyond lookups (summary: share of the reference's identifiers named, not answer right); "
                  f"fewer than {MIN_BASELINE_RIGHT} baseline-right answers: inconclusive:", "",
                  "| kind | doc tokens | shape | keep | n (documents) | closed-book right | baseline | specprefill | ratio | "
                  "90% lower (clustered) | evidence kept | |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in agg["kinds"]:
            lines.append(f"| {r['kind']} | {r['length']:,} | {r['shape']} | {r['keep']} | {r['n']} ({r['documents']}) | {r['closed_book_right']} | "
                         f"{_f(r['baseline'])} | {_f(r['specprefill'])} | {_f(r['ratio'])} | {_f(r.get('lower'))} | {_f(r['evidence_kept'])} | "
                         f"{'inconclusive' if r.get('inconclusive') else r['metric'] if r['metric'] != 'answer_right' else ''} |")
        lines.append("")
    if agg.get("group"):
        lines += ["Group-sparse (one target prefill on the union of a family's kept chunks) vs the same questions' "
                  "baseline and single specprefill answers:", "",
                  "| doc tokens | n (documents) | baseline acc | specprefill acc | group acc | group / baseline | 90% lower | "
                  "group only / specprefill only (vs specprefill) | same text as specprefill | union kept (median) | fallbacks |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in agg["group"]:
            lines.append(f"| {r['length']:,} | {r['n']} ({r['documents']}) | {_f(r['baseline_acc'])} | {_f(r['specprefill_acc'])} | "
                         f"{_f(r['group_acc'])} | {_f(r['ratio_vs_baseline'])} | {_f(r['ratio_vs_baseline_lower'])} | "
                         f"{r['group_only_vs_specprefill']} / {r['specprefill_only_vs_group']} | {r['same_text_as_specprefill']}/{r['n']} | "
                         f"{_f(r['union_kept_fraction_median'])} | {r['fallbacks']} |")
        lines.append("")
    return "\n".join(lines)


def plot(agg: dict[str, Any], path: Path, title: str = "") -> None:
    """Recall vs keep per length and scorer (with the random control), and accuracy per length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r["length"] for r in agg["recall"]})
    fig, axes = plt.subplots(1, max(1, len(lengths)) + 1, figsize=(4.2 * (len(lengths) + 1), 4), squeeze=False)
    for ax, L in zip(axes[0], lengths):
        rows = [r for r in agg["recall"] if r["length"] == L]
        for scorer in sorted({r["scorer"] for r in rows}):
            rs = sorted((r for r in rows if r["scorer"] == scorer), key=lambda r: r["keep"])
            ax.plot([r["keep"] for r in rs], [r["recall"] for r in rs], "o-", label=f"{scorer} (n={rs[0]['n']})")
        rs = sorted({r["keep"]: r for r in rows}.values(), key=lambda r: r["keep"])
        ax.plot([r["keep"] for r in rs], [r["random_recall"] for r in rs], "k--", label="random")
        ax.set_title(f"{L:,} doc tokens: answer-chunk recall")
        ax.set_xlabel("keep")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    ans = agg["answer"]
    if ans:
        xs = range(len(ans))
        ax.bar([x - 0.2 for x in xs], [r["baseline_acc"] or 0 for r in ans], 0.4, label="baseline")
        ax.bar([x + 0.2 for x in xs], [r["specprefill_acc"] or 0 for r in ans], 0.4, label="specprefill")
        ax.set_xticks(list(xs), [f"{r['length']:,}\n{r['scorer']} {r['keep']} {r.get('chunk_rule', 'mean')}\nn={r['n']}" for r in ans], fontsize=7)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
    ax.set_title("answer right (closed-book-right left out)")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
