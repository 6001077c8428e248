"""`mode auto` (the default): per job, the cheapest path the measurements support, and why.

In order:

0. **no question found** (chat and completion prompts: prompt/chat.py / prompt/question.py found no
   question in the last user message, and `specq.question` named none): baseline — specprefill could
   drop the question, and the quality evidence was measured with it protected.
1. **a prompt-cache hit**: the target's prompt cache (prefix_cache.py) holds at least half of this
   prompt's tokens (another question about the same document, a chat continued): baseline, reusing
   them — cheaper than scoring, and exact.
1a. **a group**: a stored document (the job names a `document_id`) whose questions are served
   together — the worker claimed them as one group (worker/runtime.py, group claims) or they are in
   the serving loop at once, not yet prefilling — or whose earlier questions were (`grouped_before`:
   then its windows are in the speculator cache and its KV is not in the prompt cache, and a full
   prefill for this one would pay for the document a second time; measured: mode auto with the group
   rule but without this ran 67.6 and 70.8 jobs/min against 78.8 and 79.4 without the rule, H200,
   docs/history.md) — where group-sparse prefill is measured to win
   (`group_min_tokens`: the job's length at least EngineOptions.auto_group_min_tokens, else
   GROUP_MIN_TOKENS of the backend; none measured = never) and where the *group's* answers were
   measured to hold (`group_bands`: evidence rows (evidence.py) of arm "group" — a group answer sees the
   other questions' chunks too, so rule 3's rows are not evidence for it; the operator's
   auto_quality_min_tokens, when set, stands for both): specprefill, which the serving loop runs as
   one group-sparse prefill when that is on (SPECQ_GROUP_SPARSE; off, the loop counts no group;
   serving_group.py: each question scored on the speculator's cached
   windows, the target prefilled once on the union of their kept chunks, every member decoding a
   context of ~40% of the document instead of all of it). Where the length or the evidence is
   missing, rule 1b, and its reason says which.
1b. **a stored document** (the job names a `document_id`: more questions about it are expected) with
   the prompt cache on: baseline, so the target's KV of the document is cached for the next questions
   (measured on the CPU real pair: a further question then costs ~5% of the first's TTFT, against
   ~27% for a speculator-cache hit in specprefill, which still prefills the kept tokens;
   docs/history.md).
2. **below the break-even length**: prompts shorter than `min_tokens` (the job's), else
   EngineOptions.auto_min_tokens, else BREAK_EVEN_TOKENS of the backend, run baseline — scoring costs
   more than the sparse prefill saves there.
3. **quality**: specprefill only at prompt lengths where a *passing* evidence row (evidence.py: a
   clustered 90% lower bound of the accuracy ratio >= 0.95 over >= 8 documents and >= 40 out-of-sample
   questions) was measured with exactly the job's resolved settings (evidence_key.EvidenceKey: both
   models by sha256, every scoring and selection setting, positions, prompt shape, backend, task kind; a job's
   keep may be larger than the row's, and a job that sets none is looked up with the keep certified for its
   band, else options.DEFAULT_KEEP: Engine.prepare, evidence.certified_keep; a job that declares no `task` needs every kind's passing row at its
   length, evidence.every_kind); elsewhere baseline, and the reason names the first setting no
   passing row has ("no evidence for max_keep=16 ..."). Where rows of several metrics were measured for
   the key at a length (`specq calibrate`: answer_right, agreement, token_f1, loglik_delta), the length
   passes only when every one of them passes and one is answer_right or agreement (evidence.length_fails;
   the label-free bars are provisional). EngineOptions.auto_quality_min_tokens >= 0
   replaces the evidence with "from this length on" (an operator's own measurement,
   SPECQ_AUTO_QUALITY_MIN_TOKENS; its reasons say "operator override"; -1, the default, uses the evidence).
4. otherwise **specprefill**: a long one-off document.

The result records `spec.mode` and `spec.reason` (one line saying which rule decided).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .evidence import Band

#: arm (specprefill | group) -> (bands, why there are none): a job's evidence, looked up on first need
Evidence = Callable[[str], tuple[Sequence[Band], str]]

#: break-even prompt lengths (tokens) per backend, below which baseline is taken as faster. CPU 2,071:
#: the shortest prompt at which specprefill was measured to win on the real pair in every
#: batch-invariant mode (bench/results/cpu-break-even-2026-12-04.json: 1.20-1.22x the fastest
#: baseline at 2,071 tokens; it lost at 536, 0.91-0.97x, and at 1,051, 0.92x in one mode; nothing
#: measured between 1,051 and 2,071, so the first measured win, not a guess below it;
#: tests/test_doc_cache.py::test_cpu_break_even_is_the_first_measured_win). CUDA 8,192 is not a
#: located break-even: the shortest length measured on the H200, where specprefill already won
#: (1.28x at 8,157 tokens). docs/engine.md ("Break-evens")
BREAK_EVEN_TOKENS = {"cpu": 2071, "cuda": 8192}
#: backends without a measurement use the largest known break-even
DEFAULT_BREAK_EVEN = max(BREAK_EVEN_TOKENS.values())
#: a prompt-cache hit covering at least this fraction of the prompt is taken
CACHE_HIT_FRACTION = 0.5
#: rule 1a: the shortest prompt (tokens) per backend at which a group of questions about a stored
#: document was measured faster as one group-sparse prefill than as a full prefill + prompt cache
#: (rule 1b); a backend without an entry never takes rule 1a by default. CUDA: the shortest prompt of
#: #17's workload (8 documents x 8 questions at 32K, 7B/0.5B shapes) where the group path beat rule 1b
#: on one machine start (H100 and H200, docs/history.md); shorter ones not measured. CPU: none; there the real pair's
#: speculator costs a third of the target, and a group of 4 questions at 3.4K tokens answered after
#: 65-67 s as a group (docs/history.md, "CPU, real pair, group-sparse prefill in the engine loop")
#: against ~39 s for a full prefill whose prompt-cache copies answer the others at once.
GROUP_MIN_TOKENS: dict[str, int] = {"cuda": 29_842}


#: what rule 1a's reason says it chose: the only decision under which a mode-auto job may join a group
GROUP_PATH = "one group-sparse prefill"


def chose_group(reason: str) -> bool:
    """Whether a mode-auto decision's reason is rule 1a's group path (serving_group.groupable: an auto job
    joins a group-sparse prefill only then, never on rule 3's one-off specprefill)."""
    return f": {GROUP_PATH} (" in reason


@dataclass(frozen=True)
class Decision:
    mode: str  # baseline | specprefill
    reason: str


def break_even(backend: str, option: int = 0, job_min_tokens: int = -1) -> int:
    if job_min_tokens >= 0:
        return job_min_tokens
    if option > 0:
        return option
    return BREAK_EVEN_TOKENS.get(backend, DEFAULT_BREAK_EVEN)


def group_min(backend: str, option: int = 0) -> int:
    """Rule 1a's shortest prompt: the operator's option (> 0; -1 = never), else the backend's measured
    one, else -1 (never)."""
    if option != 0:
        return option if option > 0 else -1
    return GROUP_MIN_TOKENS.get(backend, -1)


def quality_holds(n_prompt: int, quality_min_tokens: int = -1, quality_bands: Sequence[Band] = (),
                  what: str = "specprefill", missing: str = "") -> tuple[bool, str]:
    """Rule 3 (and 1a's, with the group bands): (whether `what`'s quality was measured to hold at
    `n_prompt` tokens, why). `missing`: why the job's settings have no bands at all, or
    which measured lengths fail where some bands pass (evidence.lookup): said where no band covers the prompt."""
    if quality_min_tokens < 0:
        band = next((b for b in quality_bands if b.covers(n_prompt)), None)
        if band is not None:
            return True, f"in {band.lo:,}-{band.hi:,} tokens where {band.describe()}"
        if not quality_bands and missing:
            return False, missing
        where = ", ".join(f"{b.lo:,}-{b.hi:,}" for b in quality_bands)
        return False, (f"{what} quality not measured at {n_prompt} tokens for these models and settings "
                       f"(measured to hold: {where or 'nowhere'}; docs/quality.md)" + (f"; {missing}" if missing else ""))
    if n_prompt < quality_min_tokens:
        return False, (f"{n_prompt} tokens < {quality_min_tokens} (operator override: SPECQ_AUTO_QUALITY_MIN_TOKENS, "
                       "in place of the quality evidence)")
    return True, f"operator override: SPECQ_AUTO_QUALITY_MIN_TOKENS={quality_min_tokens} in place of the quality evidence"


def decide(n_prompt: int, *, backend: str, cached_tokens: int = 0, min_tokens: int = -1, auto_min_tokens: int = 0,
           quality_min_tokens: int = -1, quality_bands: Sequence[Band] = (),
           reused_document: bool = False, group: int = 0, grouped_before: bool = False, group_min_tokens: int = 0,
           group_bands: Sequence[Band] = (), evidence: Evidence | None = None, no_question: str = "") -> Decision:
    """Mode auto's choice for a prompt of `n_prompt` tokens of which `cached_tokens` are in the target's
    prompt cache (PrefixCache.lookup); `reused_document`: the job asks about a stored document and the
    prompt cache is on (rule 1b); `group`: how many questions about that document (this one included)
    are served together, where the caller can run them as one group-sparse prefill (rule 1a; 0 or 1:
    none); `grouped_before`: earlier questions about it were served that way (rule 1a too);
    `group_min_tokens`: EngineOptions.auto_group_min_tokens; `quality_bands`: where
    specprefill's quality was measured to hold for the loaded models and the job's keep and scorer
    (rule 3); `group_bands`: the same for a group's answers (rule 1a); `evidence`: where given, both
    are looked up through it instead, only when a rule needs them (evidence.lookup of the job's key);
    `no_question`: why a chat or completion prompt's question is not protected ("no question found in
    the chat message"; rule 0), "" where it is."""
    if no_question:  # rule 0, before everything: nothing else may turn specprefill on
        return Decision("baseline", f"{no_question}: baseline, so scoring cannot drop it (name it with specq.question)")

    def holds(arm: str, given: Sequence[Band], what: str = "specprefill") -> tuple[bool, str]:
        bands, missing = evidence(arm) if evidence is not None and quality_min_tokens < 0 else (given, "")
        return quality_holds(n_prompt, quality_min_tokens, bands, what=what, missing=missing)

    if n_prompt > 0 and cached_tokens >= CACHE_HIT_FRACTION * n_prompt:
        return Decision("baseline", f"prompt cache hit: {cached_tokens} of {n_prompt} prompt tokens cached")
    be = break_even(backend, auto_min_tokens, min_tokens)
    not_group = ""
    if reused_document and (group >= 2 or grouped_before):
        gmin = group_min(backend, group_min_tokens)
        ok, why = holds("group", group_bands, what="group-sparse")
        if gmin < 0:
            not_group = f"group-sparse not measured faster on {backend}"
        elif n_prompt < max(gmin, be):
            not_group = f"group-sparse measured faster from {max(gmin, be)} tokens on {backend}"
        elif not ok:
            not_group = why
        else:
            who = (f"group of {group} questions about a stored document" if group >= 2 else
                   "a stored document whose earlier questions ran as a group (scored, not in the prompt cache)")
            return Decision("specprefill", f"{who}: {GROUP_PATH} ({n_prompt} tokens >= {gmin}, where it "
                                           f"was measured faster than a prompt-cached full prefill on {backend}), {why}")
        not_group = f" ({f'a group of {group}' if group >= 2 else 'grouped before'}, but {not_group})"
    if reused_document:
        return Decision("baseline", "stored document: a full prefill fills the prompt cache for its further "
                                    f"questions{not_group}")
    if n_prompt < be:
        return Decision("baseline", f"{n_prompt} tokens < break-even {be} ({backend}): scoring would cost more "
                                    "than it saves")
    ok, why = holds("specprefill", quality_bands)
    if not ok:
        return Decision("baseline", why)
    return Decision("specprefill", f"one-off long document: {n_prompt} tokens >= break-even {be}, {why}")


__all__ = ["Decision", "decide", "chose_group", "GROUP_PATH", "break_even", "group_min", "quality_holds", "BREAK_EVEN_TOKENS", "CACHE_HIT_FRACTION",
           "GROUP_MIN_TOKENS"]
