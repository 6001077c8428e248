"""The decode loop: one token at a time, or drafted runs verified in one target batch.

The loop owns the target's KV cache after the prefill: a verification batch writes the last emitted
token plus the draft; rejected draft cells are removed again (seq_rm) so the cache always holds
exactly the accepted history. A drafter that reads the target's hidden states (MTP, EAGLE3:
drafters_hidden.py) has `observe(ctx, rows, tokens, positions)` called after every target decode
with the tokens that stay in the cache (rows of that batch).

`SeqDecoder` is one sequence's decode state, stepped from outside: `plan()` gives the tokens of its
next target batch (the last emitted token plus a draft), the caller decodes them (alone, or together
with other sequences' tokens in one batch: engine/serving/loop.py), then `absorb(ctx, base)` reads its
rows (from row `base` of that batch), verifies, rolls its own sequence back and emits. `generate` is
the one-sequence loop over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..llama.binding import Context, Model
from .grammar import Guide
from .sampling import Sampler
from .speculative import Draft, Drafter, DraftStats, verify


@dataclass
class Generation:
    tokens: list[int]
    finish_reason: str  # "stop" (end-of-generation token) or "length"
    draft: DraftStats


class SeqDecoder:
    """One sequence's decode after its prefill (module doc). `done` once it has finished."""

    def __init__(
        self,
        model: Model,
        prompt_tokens: Sequence[int],
        first_logits: np.ndarray,
        next_pos: int,
        *,
        max_tokens: int,
        sampler: Sampler,
        n_batch: int,
        drafter: Drafter | None = None,
        n_draft: int = 4,
        draft_min: int = 1,
        progress: Callable[[int, int], None] | None = None,
        accept: Callable[[int], bool] | None = None,
        seq: int = 0,
        ignore_eos: bool = False,
        guide: Guide | None = None,
    ) -> None:
        self.model = model
        self.guide = guide
        self.ignore_eos = ignore_eos
        self.max_tokens = max_tokens
        self.sampler = sampler
        self.drafter = drafter
        self.progress = progress
        self.accept_cb = accept
        self.seq = seq
        self.stats = DraftStats(method=getattr(drafter, "name", "none") if drafter else "none")
        self.n_draft = max(1, min(int(n_draft), n_batch - 1))
        self.draft_min = min(max(1, int(draft_min)), self.n_draft)  # clamped to [1, n_draft]
        self.out: list[int] = []
        self.history = list(prompt_tokens)
        self.pos = next_pos
        self.observe = getattr(drafter, "observe", None)
        self.finish = "length"
        self.done = False
        self._draft: Draft | None = None
        self.tok = self._sample(first_logits)  # sampled, not yet in the cache
        self._take(self.tok)

    def _sample(self, logits: np.ndarray) -> int:
        return self.sampler.sample(logits) if self.guide is None else self.guide.pick(logits, self.sampler)

    def _take(self, t: int) -> bool:
        """Emit token t (unless it ends the generation); False once the generation is over."""
        if self.model.is_eog(t) and not self.ignore_eos:
            self.finish, self.done = "stop", True
            return False
        if self.guide is not None:
            self.guide.accept(t)
        self.out.append(t)
        self.history.append(t)
        if self.progress is not None:
            self.progress(len(self.out), self.max_tokens)
        if self.accept_cb is not None and self.accept_cb(t):
            self.finish, self.done = "stop", True
            return False
        if len(self.out) >= self.max_tokens:
            self.done = True
            return False
        return True

    def plan(self) -> tuple[list[int], list[int]]:
        """The tokens and positions of this sequence's next target batch (all need logits)."""
        # one verification emits up to k + 1 tokens: drafting more than room - 1 only wastes work
        room = self.max_tokens - len(self.out)
        want = min(self.n_draft, room - 1)
        drafter = self.drafter
        draft = drafter.propose(self.history, want) if drafter is not None and want >= self.draft_min else None
        if draft is not None and len(draft.tokens) > want:
            draft = Draft(list(draft.tokens[:want]), list(draft.probs[:want]) if draft.probs is not None else None)
        if draft is None or len(draft.tokens) < self.draft_min:
            draft = None
        self._draft = draft
        toks = [self.tok] + (list(draft.tokens) if draft is not None else [])
        return toks, list(range(self.pos, self.pos + len(toks)))

    def absorb(self, ctx: Context, base: int = 0) -> None:
        """Read this sequence's rows base.. of the batch just decoded: verify, roll back, emit."""
        draft, tok, pos = self._draft, self.tok, self.pos
        self._draft = None
        if draft is not None:
            k = len(draft.tokens)
            rows = [ctx.logits_row(base + i) for i in range(k + 1)]
            if self.guide is not None:
                rows = self.guide.rows(draft.tokens, rows, self.sampler)
            emitted, n_acc = verify(draft, rows, self.sampler)
            if self.observe is not None:  # the last token and the accepted drafts stay in the cache
                self.observe(ctx, range(base, base + 1 + n_acc), [tok] + list(draft.tokens[:n_acc]),
                             range(pos, pos + 1 + n_acc))
            if n_acc < k:
                ctx.seq_rm(self.seq, pos + 1 + n_acc, -1)  # drop the rejected draft cells
            self.pos = pos + 1 + n_acc
            st = self.stats
            st.drafted += k
            st.accepted += n_acc
            st.verify_batches += 1
            st.accepted_lens.append(n_acc)
            for t in emitted[:-1]:  # accepted drafts: already in the cache
                if not self._take(t):
                    return
            self.drafter.accept(self.history, n_acc)
            self.tok = emitted[-1]
        else:
            if self.observe is not None:
                self.observe(ctx, [base], [tok], [pos])
            self.pos = pos + 1
            self.tok = self._sample(ctx.logits_row(base))
        self._take(self.tok)

    def result(self) -> Generation:
        return Generation(tokens=self.out, finish_reason=self.finish, draft=self.stats)


def generate(
    ctx: Context,
    prompt_tokens: Sequence[int],
    first_logits: np.ndarray,
    next_pos: int,
    *,
    max_tokens: int,
    sampler: Sampler,
    drafter: Drafter | None = None,
    n_draft: int = 4,
    draft_min: int = 1,
    progress: Callable[[int, int], None] | None = None,
    accept: Callable[[int], bool] | None = None,
    ignore_eos: bool = False,
    after_first: Callable[[], None] | None = None,
    guide: Guide | None = None,
) -> Generation:
    """Decode after a prefill whose last logits are `first_logits`; new tokens go at `next_pos`, ...

    `accept(token)` is called with each emitted token; True ends the generation there (a stop string
    matched: finish_reason "stop"). `after_first()` runs once the first token is sampled and emitted,
    before anything more enters the context (the prompt cache's save: it delays the second token, not
    the first). `guide`: the output constrained to a grammar (decode/grammar.py).

    The target's output is the same with or without a drafter (greedy: identical tokens; sampled:
    the same distribution).
    """
    dec = SeqDecoder(ctx.model, prompt_tokens, first_logits, next_pos, max_tokens=max_tokens, sampler=sampler,
                     n_batch=ctx.n_batch, drafter=drafter, n_draft=n_draft, draft_min=draft_min,
                     progress=progress, accept=accept, ignore_eos=ignore_eos, guide=guide)
    if after_first is not None:
        after_first()
    while not dec.done:
        toks, pos = dec.plan()
        ctx.decode(toks, pos, logits="all" if len(toks) > 1 else "last")
        dec.absorb(ctx, 0)
    return dec.result()
