"""Group-sparse prefill in the serving loop (#17 item 4): questions about one document that are in
the loop at the same time share ONE sparse prefill of the target.

engine/group_sparse.py does this for one caller that hands over k questions at once. In the loop the
questions arrive as separate jobs (a worker's group claim, an API client sending them together), each
in a slot of its own, so the loop forms the group itself (serving.py, set-up step):

1. When a `specprefill` job has been scored and would set up its prefill, the loop looks for its
   *mates*: other admitted jobs of the same tenant whose prompts hold the same template head and
   document tokens (same document, same pinned indices, same position mode), that are not prefilling
   or decoding yet and can be grouped (mode specprefill or not decided yet, drafter `none` / `ngram`).
   While a mate is still being tokenized or scored, the job waits (`SlotGroup` not formed yet; the
   loop does other jobs' work meanwhile); with the speculator's window cache a mate's scoring is only
   its question tail + lookahead per window.
2. Then the group forms: the union of every member's kept document chunks (group_sparse.union_kept),
   and every member's kept set becomes head + union + its own tail (group_sparse.forced_kept). Its
   first member (the one setting up) prefills that whole plan in its own slot, in the loop's usual
   chunks beside the other jobs' decode rows.
3. Each other member, once a member's sequence holds head + union (its prefill has passed them, or it
   is decoding), copies that slot's KV stream on the device (`seq_cp`, as the loop's prompt-cache
   slot copies do), removes the cells from its own tail's first position on (the other member's tail
   and answer) and prefills only its own question + template tail.

If the member prefilling the union is dropped (cancel, time limit, error) before any member holds
the union, the next member to set up prefills the whole plan itself: nothing waits on a job that is
gone.

What a member's answer is: the answer of a single specprefill run whose kept set is forced to head +
union + its own tail (Engine.run(..., _kept=...)), as for group_sparse.run_group; with batch-invariant
numerics token for token (tests/test_serving_group.py). Each answer sees at least the chunks its own
selection kept.

`RunResult.group` of a member: size, index (formation order), layout `slots`, the union's and its own
kept tokens and fractions, `prefilled_tokens` (the target tokens this job prefilled itself: the
whole plan for the member that computed the union, its tail for the others) and `union_from` (`own
prefill`, or the slot it was copied from); `timings_ms.group_wait` is the time a member waited for
its mates' scoring and for the union.

On only with SPECQ_GROUP_SPARSE=on (ServingEngine(group_sparse=True)); off, the default since
2026-12-05, each question prefills its own kept chunks. Why off: a member's answer sees the other
members' chunks too, and on the real pair at 30K group answers were right less often than the same
questions' single specprefill answers and than baseline (docs/history.md, "Group-sparse at 30K").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..group_sparse import GROUP_DRAFTERS, forced_kept, union_kept
from ..decode.prefill import prefill_plan
from ..cache.speculator import tokens_sha256

#: stages of a job before it prefills (serving.py): a mate in one of them may still join a group
_BEFORE_SCORED = ("tokenize", "score", "scoring")


@dataclass
class SlotGroup:
    """One group of jobs sharing the target's prefill of head + union (module doc)."""

    members: list[Any]  # serving._Job, in formation order (the first one prefills the union)
    union_tokens: int
    document_tokens: int
    #: entries of every member's prefill plan before its own tail: head + union (+ pinned document indices)
    n_shared: int
    #: the position of every member's first own-tail token: cells from here on are a member's own
    tail_from: int
    own_tokens: list[int]  # each member's own kept document tokens, in formation order

    def holder(self, job) -> Any:
        """A member other than `job` whose slot holds head + union now, to copy from: one that decodes
        (it prefilled after its own copy, so that copy is done), or the one that prefilled the union
        itself and has passed it; None while there is none."""
        for m in self.members:
            if m is job or m.slot < 0:
                continue
            if m.stage == "decode" or (m.stage == "prefill" and m.group_copied_from < 0 and m.offset >= self.n_shared):
                return m
        return None

    def computing(self, job) -> Any:
        """A member other than `job` that prefills head + union in its own slot, or is about to (the
        first member, still setting up), or None."""
        for m in self.members:
            if m is not job and m.slot >= 0 and m.stage in ("setup", "prefill") and m.group_copied_from < 0:
                return m
        return None

    def record(self, job) -> dict[str, Any]:
        n_doc = max(1, self.document_tokens)
        index = self.members.index(job)
        own = self.own_tokens[index]
        return {
            "size": len(self.members),
            "index": index, "layout": "slots",
            "document_tokens": self.document_tokens,
            "union_kept_tokens": self.union_tokens, "union_kept_fraction": round(self.union_tokens / n_doc, 6),
            "own_kept_tokens": own, "own_kept_fraction": round(own / n_doc, 6),
            "prefilled_tokens": int(len(job.pre_toks) - (self.n_shared if job.group_copied_from >= 0 else 0)),
            "union_from": f"slot {job.group_copied_from}" if job.group_copied_from >= 0 else "own prefill",
        }


def groupable(job) -> bool:
    """Whether `job` may be a member of a group, as far as its own parameters go. A mode-auto job only while
    undecided or where auto chose rule 1a's group path for it (`auto_group`): one that rule 3 sent to
    specprefill as a one-off runs its own kept chunks (issue 47: group rows fail, so a group answer is
    not what its evidence measured)."""
    p = job.params
    if p.mode == "auto" and job.mode == "specprefill" and not getattr(job, "auto_group", False):
        return False
    return (job.mode in ("", "specprefill") and p.mode in ("specprefill", "auto") and p.draft in GROUP_DRAFTERS
            and not p.pipelined and job.prompt is not None)


def same_document(a, b) -> bool:
    """Same tenant, and prompts with the same template head + document tokens, pinned indices and
    position mode: a sparse prefill of one's head + document chunks is the other's too."""
    pa, pb = a.prompt, b.prompt
    if a.scope != b.scope or pa.doc_start != pb.doc_start or pa.doc_end != pb.doc_end or pa.pinned != pb.pinned:
        return False
    if a.positions and b.positions and a.positions != b.positions:
        return False
    return bool(np.array_equal(a.token_array()[: pa.doc_end], b.token_array()[: pb.doc_end]))


def mates(job, active) -> tuple[list, list]:
    """(pending, ready): `job`'s possible group mates among the admitted jobs; pending = not scored
    yet, ready = scored and setting up (not yet in a group, not waiting on one)."""
    pending, ready = [], []
    for m in active:
        if m is job or m.group is not None or not groupable(m) or not same_document(job, m):
            continue
        if m.stage in _BEFORE_SCORED:
            pending.append(m)
        elif m.stage == "setup" and m.kept is not None and m.mode == "specprefill":
            ready.append(m)
    return pending, ready


class GroupedDocuments:
    """The documents (per tenant) whose questions this loop last served as a group, most recent last, up
    to `limit`: mode auto's rule 1a keeps a stored document's later questions on the group path
    (its windows are in the speculator cache, its KV not in the prompt cache), instead of paying a full
    prefill for it as well (serving.py `_auto_group`)."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._keys: dict[tuple, None] = {}

    @staticmethod
    def key(job) -> tuple:
        p = job.prompt
        return (job.scope, p.doc_start, p.doc_end, p.pinned, tokens_sha256(job.token_array()[: p.doc_end]))

    def add(self, job) -> None:
        k = self.key(job)
        self._keys.pop(k, None)
        self._keys[k] = None
        while len(self._keys) > self.limit:
            self._keys.pop(next(iter(self._keys)))

    def __contains__(self, job) -> bool:
        return self.key(job) in self._keys


def still_pending(job) -> bool:
    """Whether a mate `job` waits for is still being tokenized or scored (and may still join)."""
    return any(m.slot >= 0 and m.stage in _BEFORE_SCORED and groupable(m) for m in job.group_pending)


def form(members) -> SlotGroup:
    """The group of `members` (all scored, same document): every member's kept set becomes head +
    union + its own tail, and its prefill plan is made (job.pre_toks / pre_pos / next_pos; set-up
    uses it as it is)."""
    prompts = [m.prompt for m in members]
    union = union_kept(prompts, [m.kept for m in members])
    first = prompts[0]
    own = [sum(1 for i in m.kept if first.doc_start <= i < first.doc_end) for m in members]
    for m in members:
        m.kept = forced_kept(m.prompt, union)
        m.pre_toks, m.pre_pos, m.next_pos = prefill_plan(m.prompt.tokens, m.kept, m.positions)
    # head + union (+ pinned document indices) are the same first entries of every member's plan
    lead = members[0]
    n_shared = sum(1 for k in lead.kept if k < first.doc_end)
    tail_from = int(lead.pre_pos[n_shared]) if n_shared < len(lead.pre_pos) else int(lead.next_pos)
    group = SlotGroup(list(members), len(union), first.doc_end - first.doc_start, n_shared, tail_from, own)
    for m in members:
        m.group = group
    return group


__all__ = ["SlotGroup", "groupable", "same_document", "mates", "still_pending", "form"]
