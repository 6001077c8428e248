"""Speculative decoding: drafters propose tokens, the target verifies them in one batch.

Greedy verification keeps drafted tokens while each equals the target's argmax, then emits the
target's own token: the output is identical to plain greedy decoding. Sampled verification is
rejection sampling (Leviathan et al. 2023; Chen et al. 2023): accept x ~ q with probability
min(1, p(x)/q(x)); at the first rejection draw from norm(max(0, p - q)); if all are accepted draw a
bonus token from p. Every emitted token is then an exact draw from the target's distribution p. An
n-gram draft is a one-hot q.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from .sampling import Sampler


@dataclass
class Draft:
    tokens: list[int]
    #: the drafter's distribution for each token (dense, same transform as the target's sampler);
    #: None = deterministic proposals (one-hot q), e.g. n-gram lookup or greedy model drafts
    probs: list[np.ndarray] | None = None


class Drafter(Protocol):
    """What the decode loop needs from a drafter (one class per drafter, see drafters.py).

    A drafter that reads the target's hidden states (MTP, EAGLE3: drafters_hidden.py) also has
    `observe(ctx, rows, tokens, positions)`, called after every target decode (prefill chunks too)
    with the tokens that stay in the target's cache, as rows of that batch."""

    name: str

    def propose(self, history: Sequence[int], n: int) -> Draft:
        """Up to n tokens likely to follow `history` (the whole prompt + everything emitted)."""
        ...

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        """Called after each verification with the new history and how many drafted tokens were kept."""
        ...


@dataclass
class DraftStats:
    method: str = "none"
    drafted: int = 0
    accepted: int = 0
    verify_batches: int = 0
    accepted_lens: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "accept_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "mean_accepted_len": round(float(np.mean(self.accepted_lens)), 4) if self.accepted_lens else 0.0,
            "verify_batches": self.verify_batches,
        }


def pick_draft_token(logits: np.ndarray, sampler: Sampler | None, p_min: float) -> tuple[int, np.ndarray | None] | None:
    """A model-like drafter's next token from its logits: the argmax (sampler None; q one-hot) or a draw
    from the sampler's transform (q returned); None = stop drafting, its top probability is below
    p_min (greedy: the plain softmax at temperature 1; sampling: the transformed q)."""
    if sampler is None:
        d = int(np.argmax(logits))
        if p_min > 0.0:
            z = logits.astype(np.float64)
            if 1.0 / float(np.exp(z - z[d]).sum()) < p_min:
                return None
        return d, None
    q = sampler.probs(logits)
    if p_min > 0.0 and float(q.max()) < p_min:
        return None
    return sampler.draw(q), q


def draft_tokens(logits: np.ndarray, n: int, sampler: Sampler | None, p_min: float,
                 is_eog: Callable[[int], bool], step: Callable[[int], np.ndarray | None]) -> Draft:
    """A model-like drafter's draft: pick a token from `logits` (pick_draft_token), then
    `step(token)` decodes it and returns the next logits (None: no room left), until n tokens, an
    end-of-generation token or a p_min stop."""
    tokens: list[int] = []
    probs: list[np.ndarray] = []
    while True:
        picked = pick_draft_token(logits, sampler, p_min)
        if picked is None:
            break
        d, q = picked
        if q is not None:
            probs.append(q)
        tokens.append(d)
        if len(tokens) >= n or is_eog(d):
            break
        logits = step(d)
        if logits is None:
            break
    return Draft(tokens, probs if sampler is not None else None)


def verify(draft: Draft, rows: Sequence[np.ndarray], sampler: Sampler) -> tuple[list[int], int]:
    """Check `draft` against the target's logits rows (len(draft)+1 rows: one per drafted token + bonus).

    Returns (emitted, n_accepted): the accepted drafted tokens followed by exactly one token from the
    target (the correction at the first rejection, or the bonus token).
    """
    k = len(draft.tokens)
    assert len(rows) == k + 1
    if sampler.greedy:
        for i, d in enumerate(draft.tokens):
            t = int(np.argmax(rows[i]))
            if t != d:
                return list(draft.tokens[:i]) + [t], i
        return list(draft.tokens) + [int(np.argmax(rows[k]))], k
    for i, d in enumerate(draft.tokens):
        p = sampler.probs(rows[i])
        if draft.probs is None:
            q_d = 1.0
            q = None
        else:
            q = draft.probs[i]
            q_d = float(q[d])
        if q_d > 0 and sampler.rng.random() < min(1.0, p[d] / q_d):
            continue
        if q is None:
            residual = p.copy()
            residual[d] = 0.0
        else:
            residual = np.maximum(p - q, 0.0)
        if residual.sum() <= 0:
            residual = p
        return list(draft.tokens[:i]) + [sampler.draw(residual / residual.sum())], i
    return list(draft.tokens) + [sampler.draw(sampler.probs(rows[k]))], k
