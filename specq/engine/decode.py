"""The decode loop: one token at a time, or drafted runs verified in one target batch.

The loop owns the target's KV cache after the prefill: a verification batch writes the last emitted
token plus the draft; rejected draft cells are removed again (seq_rm) so the cache always holds
exactly the accepted history. A drafter that reads the target's hidden states (MTP, EAGLE3:
drafters_hidden.py) has `observe(ctx, rows, tokens, positions)` called after every target decode
with the tokens that stay in the cache (rows of that batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .llama import Context
from .sampling import Sampler
from .speculative import Draft, Drafter, DraftStats, verify


@dataclass
class Generation:
    tokens: list[int]
    finish_reason: str  # "stop" (end-of-generation token) or "length"
    draft: DraftStats


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
) -> Generation:
    """Decode after a prefill whose last logits are `first_logits`; new tokens go at `next_pos`, ...

    `accept(token)` is called with each emitted token; True ends the generation there (a stop string
    matched: finish_reason "stop").

    The target's output is the same with or without a drafter (greedy: identical tokens; sampled:
    the same distribution).
    """
    model = ctx.model
    stats = DraftStats(method=getattr(drafter, "name", "none") if drafter else "none")
    n_draft = max(1, min(int(n_draft), ctx.n_batch - 1))
    draft_min = min(max(1, int(draft_min)), n_draft)  # clamped to [1, n_draft]
    out: list[int] = []
    history = list(prompt_tokens)
    tok = sampler.sample(first_logits)  # sampled, not yet in the cache
    pos = next_pos
    observe = getattr(drafter, "observe", None)
    finish = "length"
    while True:
        if model.is_eog(tok):
            finish = "stop"
            break
        out.append(tok)
        history.append(tok)
        if progress is not None:
            progress(len(out), max_tokens)
        if accept is not None and accept(tok):
            finish = "stop"
            break
        if len(out) >= max_tokens:
            break
        # one verification emits up to k + 1 tokens: drafting more than room - 1 only wastes work
        room = max_tokens - len(out)
        want = min(n_draft, room - 1)
        draft = drafter.propose(history, want) if drafter is not None and want >= draft_min else None
        if draft is not None and len(draft.tokens) > want:
            draft = Draft(list(draft.tokens[:want]), list(draft.probs[:want]) if draft.probs is not None else None)
        if draft is not None and len(draft.tokens) >= draft_min:
            k = len(draft.tokens)
            ctx.decode([tok] + list(draft.tokens), list(range(pos, pos + k + 1)), logits="all")
            rows = [ctx.logits_row(i) for i in range(k + 1)]
            emitted, n_acc = verify(draft, rows, sampler)
            if observe is not None:  # the last token and the accepted drafts stay in the cache
                observe(ctx, range(1 + n_acc), [tok] + list(draft.tokens[:n_acc]), range(pos, pos + 1 + n_acc))
            if n_acc < k:
                ctx.seq_rm(0, pos + 1 + n_acc, -1)  # drop the rejected draft cells
            pos += 1 + n_acc
            stats.drafted += k
            stats.accepted += n_acc
            stats.verify_batches += 1
            stats.accepted_lens.append(n_acc)
            stopped = False
            for t in emitted[:-1]:  # accepted drafts: already in the cache
                if model.is_eog(t):
                    finish, stopped = "stop", True
                    break
                out.append(t)
                history.append(t)
                if progress is not None:
                    progress(len(out), max_tokens)
                if accept is not None and accept(t):
                    finish, stopped = "stop", True
                    break
                if len(out) >= max_tokens:
                    stopped = True
                    break
            if stopped:
                break
            drafter.accept(history, n_acc)
            tok = emitted[-1]
        else:
            ctx.decode([tok], [pos], logits="last")
            if observe is not None:
                observe(ctx, [0], [tok], [pos])
            pos += 1
            tok = sampler.sample(ctx.logits_row(-1))
    return Generation(tokens=out, finish_reason=finish, draft=stats)
