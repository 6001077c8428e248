"""Where specprefill's quality was measured, for `mode auto` (auto.py rule 3).

Each row is one answer-right run of `specq bench quality` (docs/quality.md): the same questions
answered by baseline and by specprefill at `keep` with `scorer`, on documents of `doc_tokens`
tokens, with one model pair. A row **passes** when the exact one-sided 90% lower bound of the
accuracy ratio (specprefill / baseline, paired) is at least `MIN_RATIO` — the measurement shows
keep 0.3 at >= 95% of baseline, rather than a point estimate that happens to be above it — and it has
at least `MIN_QUESTIONS` questions: the bound is conditional on the discordant pairs, so a handful of
questions with none of them (5 at 30K so far: both arms right on the same 2) gives a "lower bound"
equal to the ratio, 1.0, that says nothing. Where a
length was measured more than once, the row with the most questions stands (on a tie the later row:
rows are in the order they were measured). A `full` row whose documents the default windowed scorer
reads in one pass (options.ONE_PASS_TOKENS) is evidence for `windowed` too: it is the same pass.

A row's `arm` says whose answers it measured: `specprefill` (one question, its own kept chunks: rule 3)
or `group` (a family of questions answered through one group-sparse prefill of the union of their
kept chunks, `specq bench quality group`, paired with the answer run's baseline answers): rule 1a
runs the group path only inside a `group` band. The two are kept apart because a group answer sees
other questions' chunks too — on the 4K families those were the distractors in every one of the
group's misses (docs/quality.md, "Group-sparse on the same 40 questions").

`bands(target, speculator, keep, scorer, chunk_rule)`: the prompt lengths where auto may run specprefill — each
passing row's documents, plus `QUESTION_ALLOWANCE` tokens for the chat template and the question,
and the lengths between two passing rows with no failing row between them (quality is assumed not to
dip between two lengths that both pass). Nothing else is extrapolated: another model pair, a smaller
keep, another scorer or another chunk rule has no band, and auto runs baseline there.

The rows are copied from the journals in bench/results (tests/test_quality_evidence.py recomputes
them from those files, so a row cannot drift from its data); a new measurement adds a row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePath

from ..options import DEFAULT_CHUNK_RULE, ONE_PASS_TOKENS

#: the lower bound a row's accuracy ratio must reach
MIN_RATIO = 0.95
#: the fewest questions a passing row needs (the smallest standing row, 16K, has 20)
MIN_QUESTIONS = 20
#: prompt tokens on top of a measured document's: chat template + question
QUESTION_ALLOWANCE = 256


@dataclass(frozen=True)
class QualityRow:
    target: str  # model registry name (file stem)
    speculator: str
    keep: float
    scorer: str
    length: int  # the run's nominal document length (`bench quality --lengths`)
    doc_tokens: tuple[int, int]  # the measured documents' token counts, min and max
    n: int  # questions (closed-book-right ones left out)
    documents: int
    baseline_acc: float
    specprefill_acc: float
    ratio: float
    ratio_lower: float  # exact one-sided 90% lower bound (quality_report.paired)
    journal: str  # bench/results/… the row is computed from
    source: str  # where docs/quality.md shows it, and the code it ran
    chunk_rule: str = "mean"  # how the run ranked chunks (RunParams.chunk_rule; "mean" before 2026-12-04)
    #: which answers `specprefill_acc` counts: "specprefill" (each question's own selection) or "group" (the
    #: questions of a family through one group-sparse prefill, `bench quality group`: mode auto's rule 1a)
    arm: str = "specprefill"
    #: a group row: the answer journal its records are paired with (baseline answers), by task id
    paired_with: str = ""

    @property
    def passes(self) -> bool:
        return self.ratio_lower >= MIN_RATIO and self.n >= MIN_QUESTIONS


@dataclass(frozen=True)
class Band:
    lo: int  # prompt tokens, inclusive
    hi: int
    rows: tuple[QualityRow, ...]

    def covers(self, n_prompt: int) -> bool:
        return self.lo <= n_prompt <= self.hi

    def describe(self) -> str:
        parts = "; ".join(f"{r.doc_tokens[0]:,}-{r.doc_tokens[1]:,}-token documents: n {r.n} ({r.documents} documents), "
                          f"ratio {r.ratio:.2f}, 90% lower {r.ratio_lower:.2f}" for r in self.rows)
        what = "group-sparse answers, " if self.rows[0].arm == "group" else ""
        return (f"{what}keep {self.rows[0].keep:g}, {self.rows[0].chunk_rule} chunk rule, measured >= {MIN_RATIO:.0%} of baseline "
                f"({parts}; docs/quality.md)")


QWEN_15B, QWEN_05B = "qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m"

ROWS: tuple[QualityRow, ...] = (
    # docs/quality.md "Families", answer right at 4K: 40 questions of 4 documents, CPU, commit 110167e,
    # scripts/quality_cpu_families.sh (step answer:4000:40). Supersedes the per-task 4K run of
    # 2026-12-01 (n 19, ratio 1.067, 90% lower 0.889: fewer questions).
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "windowed", 4000, (3670, 3980), 40, 4, 0.825, 0.900, 1.091, 0.962,
               "bench/results/quality-cpu-families-answer-4000.jsonl",
               "docs/quality.md, Families: answer right at 4K (commit 110167e)"),
    # docs/quality.md "Families", answer right at 16K: 20 questions of 2 documents, CPU (AMD EPYC, then
    # Intel Xeon after a restart), commits 8936bed..6e48ea9, step answer:16000:20.
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "windowed", 16000, (15919, 15978), 20, 2, 0.4, 0.65, 1.625, 1.133,
               "bench/results/quality-cpu-families-answer-16000.jsonl",
               "docs/quality.md, Families: answer right at 16K (commits 8936bed..6e48ea9)"),
    # docs/quality.md "Chunk borders": the 4K families' 40 questions again under the border rule (the
    # default since 2026-12-04), specprefill run anew, closed-book and baseline answers reused from the
    # mean rule's journal (`--baseline-from`); CPU, code 37aba5c (+ CLI options and docs, no engine change).
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "windowed", 4000, (3670, 3980), 40, 4, 0.825, 0.950, 1.152, 1.005,
               "bench/results/quality-cpu-border-answer-4000.jsonl",
               "docs/quality.md, Chunk borders: answer right at 4K (commit 37aba5c)", chunk_rule="border"),
    # the same at 16K: the 16K families' 20 questions, border rule, baselines reused; code d09312f.
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "windowed", 16000, (15919, 15978), 20, 2, 0.4, 0.55, 1.375, 0.978,
               "bench/results/quality-cpu-border-answer-16000.jsonl",
               "docs/quality.md, Chunk borders: answer right at 16K (commit d09312f)", chunk_rule="border"),
    # docs/quality.md "Answer right at 8K": 40 questions of 4 new 8K documents (two scoring windows), border
    # rule, every arm run (closed-book, baseline, specprefill); CPU, code 669992d. Between the 4K and 16K
    # rows, so the border band over them no longer assumes 8K.
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "windowed", 8000, (7896, 7967), 40, 4, 0.775, 0.875, 1.129, 1.015,
               "bench/results/quality-cpu-border-answer-8000.jsonl",
               "docs/quality.md, Answer right at 8K (commit 669992d)", chunk_rule="border"),
    # docs/quality.md "One pass up to 8,192 tokens": the same 40 8K questions, border rule, specprefill
    # run anew with one speculator pass (`--scorer full`), closed-book and baseline answers reused
    # (`--baseline-from` the row above); CPU, code 852f635. Since bbb3a36 the default windowed scorer
    # reads these documents in one pass (options.ONE_PASS_TOKENS), so this row, not the two-window one
    # above, stands for `windowed` at 8K (`measures`; equal n: the later row).
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "full", 8000, (7896, 7967), 40, 4, 0.775, 0.875, 1.129, 0.996,
               "bench/results/quality-cpu-border-full-answer-8000.jsonl",
               "docs/quality.md, One pass up to 8,192 tokens (commit 852f635)", chunk_rule="border"),
    # docs/quality.md "Answer right at 30K": 40 questions of 4 ~30K documents (eight scoring windows),
    # border rule, every arm run; CPU (AMD EPYC, then Intel Xeon for the last 3), code b381143..b12f298 (no
    # engine change between), the planned 40 (the bound crossed 0.95 on the way: reported, not used).
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "windowed", 30000, (29821, 29940), 40, 4, 0.5, 0.575, 1.15, 0.962,
               "bench/results/quality-cpu-border-answer-30000.jsonl",
               "docs/quality.md, Answer right at 30K (commits b381143..b12f298)", chunk_rule="border"),
    # docs/quality.md "Group-sparse on the same 40 questions": the 4K families' questions through one
    # group-sparse prefill per family (mean rule, paired with the mean rule's answer journal); CPU, commit
    # b61bbb6. It fails (lower bound 0.927 < 0.95): mode auto's rule 1a has no band there.
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "windowed", 4000, (3670, 3980), 40, 4, 0.825, 0.85, 1.03, 0.927,
               "bench/results/quality-cpu-families-group-4000.jsonl",
               "docs/quality.md, Group-sparse on the same 40 questions (commit b61bbb6)", arm="group",
               paired_with="bench/results/quality-cpu-families-answer-4000.jsonl"),
    # docs/quality.md "Group-sparse at 30K": the 30K families' 40 questions through one group-sparse prefill
    # per family (border rule, paired with the 30K answer journal); CPU, code 7e989c7 (no engine change
    # to the group path since). It fails (ratio 0.85, lower 0.771): group answers lose to single specprefill.
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "windowed", 30000, (29821, 29940), 40, 4, 0.5, 0.425, 0.85, 0.771,
               "bench/results/quality-cpu-border-group-30000.jsonl",
               "docs/quality.md, Group-sparse at 30K (commit 7e989c7)", chunk_rule="border", arm="group",
               paired_with="bench/results/quality-cpu-border-answer-30000.jsonl"),
    # docs/quality.md "Header lines": the same 40 questions under the opt-in scope rule, baselines reused;
    # code 62b3411. It fails (lower bound < 0.95): mode auto has no band for `scope`.
    QualityRow(QWEN_15B, QWEN_05B, 0.3, "windowed", 4000, (3670, 3980), 40, 4, 0.825, 0.85, 1.03, 0.887,
               "bench/results/quality-cpu-scope-answer-4000.jsonl",
               "docs/quality.md, Header lines: answer right at 4K (commit 62b3411)", chunk_rule="scope"),
)


def model_key(name: str) -> str:
    """A registry name or a GGUF path, as the rows name models: the file stem, lower case."""
    stem = PurePath(name).name
    return (stem[:-5] if stem.lower().endswith(".gguf") else stem).lower()


def measures(row: QualityRow, scorer: str) -> bool:
    """Whether `row` measured what a job with `scorer` (and the default window) runs: the same scorer,
    or the full scorer on documents that the windowed scorer scores in one pass anyway."""
    return row.scorer == scorer or (scorer == "windowed" and row.scorer == "full" and row.doc_tokens[1] <= ONE_PASS_TOKENS)


@lru_cache(maxsize=256)
def bands(target: str, speculator: str, keep: float, scorer: str, chunk_rule: str = DEFAULT_CHUNK_RULE,
          rows: tuple[QualityRow, ...] = ROWS, arm: str = "specprefill") -> tuple[Band, ...]:
    """The prompt-length bands where `keep` (>= a row's keep) with `scorer` and `chunk_rule` was
    measured to pass for this model pair, for `arm`'s answers (module doc). A row measured with the
    other chunk rule does not count: the rules keep different chunks. Cached: mode auto asks once per
    job with the same few arguments."""
    mine = [r for r in rows if r.target == model_key(target) and r.speculator == model_key(speculator)
            and measures(r, scorer) and r.chunk_rule == chunk_rule and keep >= r.keep and r.arm == arm]
    # per measured length, the row with the most questions (the later one on a tie)
    best: dict[tuple[float, int], QualityRow] = {}
    for r in mine:
        key = (r.keep, r.length)
        if key not in best or r.n >= best[key].n:
            best[key] = r
    out: list[Band] = []
    run: list[QualityRow] = []
    for r in sorted(best.values(), key=lambda r: r.doc_tokens) + [None]:
        if r is not None and r.passes:
            run.append(r)
            continue
        if run:
            out.append(Band(run[0].doc_tokens[0], run[-1].doc_tokens[1] + QUESTION_ALLOWANCE, tuple(run)))
            run = []
    return tuple(out)


__all__ = ["QualityRow", "Band", "ROWS", "MIN_RATIO", "MIN_QUESTIONS", "QUESTION_ALLOWANCE", "bands", "measures", "model_key"]
