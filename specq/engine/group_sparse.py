"""Group-sparse prefill (#17 item 4): k questions about one document, one sparse prefill of the target.

What it does. Every question's prompt is [template head][document][question_j + template tail]
(prompt.py), so the head and the document tokens are the same for every question. Each question is
scored by the speculator as a plain specprefill run would be (with the speculator's window cache,
questions 2..k restore the document's windows and prefill only their own tail and lookahead:
spec_cache.py) and keeps its own chunks. The target then prefills ONCE the head plus the UNION of
the kept document chunks, at their original positions, and each question in turn prefills only its
own question + template tail on top of that KV (at its original positions) and decodes.

Layouts of the per-question part (`layout`):

* `rollback` (the default): the union is prefilled into sequence 0; after question j has decoded,
  its cells (tail and answer: every position >= the tail's first) are removed (`seq_rm`) and the
  next question's tail goes on the same union KV. No copy at all; the questions run one after the
  other. The union's cells are never touched, and the freed cells after them are reused in order,
  so question j's KV is laid out as a single run's would be.
* `restore`: the union's KV is saved to host memory once (`llama_state_seq_get_data`) and restored
  into the cleared context before each question (spec_cache.restore_seq). Costs one save and k
  restores; measured as the copy-based alternative for a one-sequence context. A `seq_cp` into
  parallel sequences (all answers decoded in one batch) needs a context of >= k sequences and is not
  built here.

Equivalence. With the target's numerics batch-invariant, question j's answer is token for token the
answer of a single specprefill run whose kept set is forced to head + union + question j's tail
(Engine.run(..., _kept=...)); tests/test_group_sparse.py checks it. A group of one is a plain
specprefill run.

What is shared and what each question still pays. Shared (once per group, recorded as such in
`RunResult.group["shared_ms"]` and in each result's `timings_ms.group_prefill`, never added into a
question's own phases): the target's prefill of head + union. Each question still pays: tokenizing,
its own scoring (the speculator's tail + lookahead per window when the window cache hits, the whole
document for the first question or with the cache off), its selection, the target's prefill of its
own tail (`timings_ms.sparse_prefill` = `tail_prefill`), and its decode.

Timings. The questions run one after the other after all were scored, so `timings_ms.ttft` and
`total` of question j are measured from the group's start (what a client that submitted the group
at once sees: they include the scoring of every question, the shared prefill and questions < j);
summing `total` over a group's results counts the shared work k times: the group's own wall time is
`RunResult.group["wall_ms"]`.

When it should win. Against k separate specprefill runs it saves (k - 1) target prefills of the
kept chunks but prefills the union, which is larger than one question's kept set: with a kept
fraction f per question and a union fraction u (f <= u <= 1), the target prefills about
u*N + k*tail instead of k*(f*N + tail); it wins while u < k*f, i.e. while the questions' chunks
overlap. Against a full prefill + prompt cache (one full prefill, then each question prefills only
its tail on the cached KV) it wins while the union prefill is cheaper than the full prefill plus the
k - 1 cache restores, i.e. roughly while u < 1 - (restore cost / full prefill cost) and the
speculator's scoring of the k questions is paid back; the group-sparse answers are also only as
good as the union's coverage (a union covers at least each question's own chunks, so each answer
sees at least what its own specprefill run saw).

In the worker: the engine loop forms such groups itself from the jobs in its slots
(serving_group.py: the union copied between slots on the device instead of rolled back in one
sequence); this module serves one caller's k questions at once (benchmarks, `specq bench quality group`).

Fallbacks. The group runs as separate `Engine.run` calls (every result's `group["fallback"]` says
why, and a warning repeats it) when: the mode is not specprefill or a prompt ran baseline
(min_tokens), the questions' head + document tokens differ, the run is pipelined, or the drafter
reads the target's prefill (`model`, `mtp`, `eagle3`, `auto`: only `none` and `ngram` are served).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from .decode.loop import generate
from .decode.grammar import guide_for
from .options import RunParams
from .decode.prefill import prefill_plan
from .decode.sampling import Sampler
from .cache.speculator import restore_seq, save_seq
from .llama.stop import Stop, checked_progress, running

if TYPE_CHECKING:
    from .pipeline import Engine, Progress
    from .result import RunResult

LAYOUTS = ("rollback", "restore")
#: drafters a group run can use (they read no target hidden states and no scorer state)
GROUP_DRAFTERS = ("none", "ngram")


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def union_kept(prompts, kept_sets) -> list[int]:
    """The sorted union of the kept DOCUMENT indices of every question (all prompts share
    doc_start/doc_end; each question's protected head/tail are not part of it)."""
    doc_start, doc_end = prompts[0].doc_start, prompts[0].doc_end
    union: set[int] = set()
    for kept in kept_sets:
        union.update(i for i in kept if doc_start <= i < doc_end)
    return sorted(union)


def forced_kept(prompt, union_doc: list[int]) -> list[int]:
    """The kept indices of one question in a group: its head, the union's document chunks, its own
    protected tail (and pinned indices, for completeness)."""
    return sorted(set(range(prompt.doc_start)) | set(prompt.pinned) | set(union_doc) | set(range(prompt.doc_end, prompt.n)))


def _why_not(prompts, modes, params: RunParams) -> str:
    """Why this group cannot run group-sparse ("" = it can)."""
    if params.mode != "specprefill":
        return f"mode {params.mode}: group-sparse prefill is for mode specprefill"
    if params.pipelined:
        return "pipelined runs prefill per window as they are scored: group-sparse needs every question scored first"
    if params.draft not in GROUP_DRAFTERS:
        return f"draft {params.draft}: group-sparse serves drafters {', '.join(GROUP_DRAFTERS)} only"
    if any(m != "specprefill" for m in modes):
        return "a question's prompt ran baseline (shorter than min_tokens)"
    first = prompts[0]
    for p in prompts[1:]:
        if p.doc_start != first.doc_start or p.doc_end != first.doc_end or p.tokens[: p.doc_end] != first.tokens[: first.doc_end]:
            return "the questions' template head + document tokens differ"
        if p.pinned != first.pinned:
            return "the questions' pinned indices differ"
    return ""


def run_group(engine: "Engine", document: str, questions: list[str], params: RunParams | None = None, *,
              scope: str = "", progress: "Progress | None" = None, stop: Stop | None = None,
              layout: str = "rollback", reused_document: bool = True) -> list["RunResult"]:
    """One RunResult per question (module doc). `params` is every question's (its `question` is
    replaced); `scope` keys the caches as in Engine.run; `progress(phase, done, total)` and `stop`
    as in Engine.run, for the whole group; `reused_document` (default True: a group asks several
    questions) lets the speculator cache save the document's windows at once under the `repeat`
    policy."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown group layout {layout!r} (known: {', '.join(LAYOUTS)})")
    params = params or RunParams()
    if not questions:
        return []
    with running(stop):
        return _run_group(engine, document, list(questions), params, scope=scope, progress=progress, stop=stop,
                          layout=layout, reused_document=reused_document)


def _fallback(engine, document, questions, params, why, *, scope, progress, stop, reused_document, t_start):
    results = []
    for j, q in enumerate(questions):
        r = engine.run(document, dataclasses.replace(params, question=q), progress, scope=scope,
                       reused_document=reused_document, stop=stop)
        r.warnings.append(f"group of {len(questions)} ran as separate runs: {why}")
        r.group = {"size": len(questions), "index": j, "fallback": why}
        results.append(r)
    wall = _ms(t_start)
    for r in results:
        r.group["wall_ms"] = round(wall, 3)
    return results


def _run_group(engine: "Engine", document: str, questions: list[str], params: RunParams, *, scope: str,
               progress, stop: Stop | None, layout: str, reused_document: bool) -> list["RunResult"]:
    report = checked_progress(progress, stop)
    t_start = time.perf_counter()
    k = len(questions)
    qparams = [dataclasses.replace(params, question=q) for q in questions]
    report("tokenize", 0, 1)
    prepared = [engine.prepare(document, p, scope=scope, reused_document=reused_document, prompt_cache=False)
                for p in qparams]
    prompts = [x[0] for x in prepared]
    why = _why_not(prompts, [x[1] for x in prepared], params)
    if why:
        return _fallback(engine, document, questions, params, why, scope=scope, progress=progress, stop=stop,
                         reused_document=reused_document, t_start=t_start)

    # 1. each question scored and selected on its own (the speculator's window cache shares the document)
    engine.last_trace = None
    kept_own, doc_scores = [], []
    for p, (prompt, _mode, _positions, _warnings, timings, spec) in zip(qparams, prepared):
        kept, scores = engine.select(prompt, p, timings, spec, report, scope=scope, reused_document=reused_document)
        kept_own.append(kept)
        doc_scores.append(scores)

    # 2. the target prefills head + union once (sequence 0)
    union_doc = union_kept(prompts, kept_own)
    kept_all = [forced_kept(prompt, union_doc) for prompt in prompts]
    positions = prepared[0][2]
    first = prompts[0]
    n_shared = first.doc_start + len(union_doc)  # head + union: the first n_shared entries of every plan
    plans = [prefill_plan(prompt.tokens, kept, positions) for prompt, kept in zip(prompts, kept_all)]
    ctx = engine.ctx
    report("group_prefill", 0, 1)
    t0 = time.perf_counter()
    ctx.clear()
    toks0, pos0, _ = plans[0]
    ctx.decode(toks0[:n_shared], pos0[:n_shared], logits="none")
    group_prefill_ms = _ms(t0)
    save_ms, state = 0.0, None
    if layout == "restore":
        t0 = time.perf_counter()
        state = save_seq(ctx, 0)
        save_ms = _ms(t0)
    report("group_prefill", 1, 1)
    tail_from = int(pos0[n_shared]) if n_shared < len(pos0) else int(plans[0][2])

    # 3. each question: its tail on the union's KV, then its decode
    n_doc = max(1, first.doc_end - first.doc_start)
    union_frac = len(union_doc) / n_doc
    results = []
    for j, (p, (prompt, _mode, _positions, warnings, timings, spec)) in enumerate(zip(qparams, prepared)):
        toks, pos, next_pos = plans[j]
        report("sparse_prefill", 0, 1)
        t0 = time.perf_counter()
        restore_ms = 0.0
        if j > 0:
            if layout == "rollback":
                ctx.seq_rm(0, tail_from, -1)
            else:
                ctx.clear()
                restore_seq(ctx, state, 0)
                restore_ms = _ms(t0)
        ctx.decode(toks[n_shared:], pos[n_shared:], logits="last")
        logits = ctx.logits_row(-1)
        tail_ms = _ms(t0) - restore_ms
        drafter = engine.drafter_for(p, prompt, scored=False)
        sampler = Sampler(p.temperature, p.top_k, p.top_p, p.seed)
        n_draft = engine.draft_budget(p, drafter, warnings)
        firsts: list[float] = []
        text, on_token, accept = engine.text_callbacks(p, report, None, firsts)
        t_decode = time.perf_counter()
        gen = generate(ctx, prompt.tokens, logits, next_pos, max_tokens=p.max_tokens, sampler=sampler,
                       drafter=drafter, n_draft=n_draft, draft_min=p.draft_min, progress=on_token, accept=accept,
                       ignore_eos=p.ignore_eos, guide=guide_for(engine.target, p.json_schema))
        t_end = time.perf_counter()
        own_doc = sum(1 for i in kept_own[j] if prompt.doc_start <= i < prompt.doc_end)
        timings["group_prefill"] = group_prefill_ms
        timings["tail_prefill"] = tail_ms
        timings["sparse_prefill"] = tail_ms
        timings["cache_restore"] += restore_ms
        if j == 0 and save_ms:
            timings["group_save"] = save_ms
        timings["decode"] = (t_end - t_decode) * 1000.0
        timings["ttft"] = ((firsts[0] if firsts else t_end) - t_start) * 1000.0
        timings["total"] = (t_end - t_start) * 1000.0
        r = engine.finish_result(document, prompt, p, gen, text, None, timings, spec, warnings, kept_all[j], doc_scores[j])
        r.group = {
            "size": k, "index": j, "layout": layout,
            "document_tokens": first.doc_end - first.doc_start,
            "union_kept_tokens": len(union_doc), "union_kept_fraction": round(union_frac, 6),
            "own_kept_tokens": own_doc, "own_kept_fraction": round(own_doc / n_doc, 6),
            "shared_ms": {"group_prefill": round(group_prefill_ms, 3), **({"group_save": round(save_ms, 3)} if save_ms else {})},
        }
        results.append(r)
    if layout == "rollback":
        ctx.seq_rm(0, tail_from, -1)  # leave the union's KV only (the next run clears anyway)
    wall = _ms(t_start)
    for r in results:
        r.group["wall_ms"] = round(wall, 3)
    return results


__all__ = ["run_group", "union_kept", "forced_kept", "LAYOUTS", "GROUP_DRAFTERS"]
