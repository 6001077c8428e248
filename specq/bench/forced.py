"""A drafter wrapper that forces the acceptance rate, for cost curves and rollback tests.

Random weights make every real drafter's acceptance meaningless, so `ForcedDrafter` lets a real
drafter do all of its work (its context decodes, its cache is kept in step with the target — its
cost and its state) and then replaces what it proposed with the target's known greedy continuation,
each drafted token kept with probability `rate` until the first one that is not (that one is
corrupted, so greedy verification rejects it there). Accepted drafts per verification batch of k are
then distributed as in the usual i.i.d. model (expected sum_{i=1..k} rate^i). The target still
verifies everything: output stays the target's own.

With no wrapped drafter (or one that proposed nothing, e.g. n-gram lookup without a match) it still
proposes n tokens: a drafter that costs nothing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..engine.decode.speculative import Draft


class ForcedDrafter:
    def __init__(self, inner, reference: Sequence[int], prompt_len: int, rate: float, n_vocab: int,
                 seed: int = 0) -> None:
        """reference: the target's plain greedy output after this prompt; prompt_len: len(prompt)."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError("rate must be in [0, 1]")
        self.inner = inner
        self.name = getattr(inner, "name", "free") if inner is not None else "free"
        self.ref = list(reference)
        self.prompt_len = int(prompt_len)
        self.rate = float(rate)
        self.n_vocab = int(n_vocab)
        self.rng = np.random.default_rng(seed)
        if inner is not None and hasattr(inner, "observe"):
            self.observe = inner.observe  # a hidden-state drafter keeps reading the target

    def propose(self, history: Sequence[int], n: int) -> Draft:
        if self.inner is not None:
            self.inner.propose(history, n)
        done = len(history) - self.prompt_len
        toks = list(self.ref[done:done + n])
        for i in range(len(toks)):
            if self.rng.random() >= self.rate:
                toks[i] = (toks[i] + 1 + int(self.rng.integers(self.n_vocab - 1))) % self.n_vocab
                break
        return Draft(toks)

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        if self.inner is not None:
            self.inner.accept(history, n_accepted)


__all__ = ["ForcedDrafter"]
