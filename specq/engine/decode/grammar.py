"""Grammar-constrained decoding that stays exact under speculative decoding.

Each position's distribution is the target's masked by the grammar (forbidden tokens get -inf logits,
then the sampler's own transform): sampling draws from it, and drafted tokens are verified against it,
so the output is the same tokens (greedy) or the same distribution (sampled) with or without a drafter.

Greedy takes a cheap path: the argmax is checked alone against the grammar (one token through
llama.cpp's filter) and the whole vocabulary is masked only when the grammar forbids it. Sampling masks
the whole vocabulary (the normalised masked distribution is needed). A draft is checked along a clone of
the grammar (row i is masked by the grammar after draft[:i]); the first drafted token the grammar forbids
is rejected by verification (its masked probability is 0), so rows past it are left as they are. The
grammar itself advances only with emitted tokens, which all came from masked distributions: llama.cpp
aborts on a forbidden accept. End-of-generation is allowed only where the grammar may end.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ...contracts import EngineError
from ..llama.grammar import Grammar
from .sampling import Sampler


class Guide:
    """The grammar state of one generation, and the time spent in it (`ms`)."""

    def __init__(self, grammar: Grammar, is_eog) -> None:
        self.grammar = grammar
        self.is_eog = is_eog
        self.ms = 0.0
        self.full_masks = 0

    def _mask(self, logits: np.ndarray, g: Grammar) -> np.ndarray:
        allowed = g.allowed()
        self.full_masks += 1
        if not allowed.any():
            raise EngineError("the JSON Schema's grammar allows no next token (the generation cannot go on)")
        out = np.array(logits, dtype=np.float32, copy=True)
        out[~allowed] = -np.inf
        return out

    def constrain(self, logits: np.ndarray, sampler: Sampler, g: Grammar | None = None) -> np.ndarray:
        """`logits` with what the grammar `g` (default: the current state) forbids at -inf (greedy: only
        when it forbids the argmax, which is all greedy reads)."""
        t0 = time.perf_counter()
        g = g or self.grammar
        try:
            if sampler.greedy and g.allows(int(np.argmax(logits))):
                return logits
            return self._mask(logits, g)
        finally:
            self.ms += (time.perf_counter() - t0) * 1000.0

    def pick(self, logits: np.ndarray, sampler: Sampler) -> int:
        return sampler.sample(self.constrain(logits, sampler))

    def rows(self, draft: Sequence[int], rows: list[np.ndarray], sampler: Sampler) -> list[np.ndarray]:
        """The verification rows masked along the draft (module doc)."""
        g = self.grammar.clone()
        out = list(rows)
        for i, d in enumerate(draft):
            out[i] = self.constrain(rows[i], sampler, g)
            t0 = time.perf_counter()
            ok = g.allows(d) and not self.is_eog(d)
            if ok:
                g.accept(d)
            self.ms += (time.perf_counter() - t0) * 1000.0
            if not ok:  # rejected at i at the latest (an end-of-generation draft ends the run there too)
                return out
        out[len(draft)] = self.constrain(rows[len(draft)], sampler, g)
        return out

    def accept(self, token: int) -> None:
        """Advance with an emitted token (one that came from a masked distribution)."""
        if self.is_eog(token):
            return
        t0 = time.perf_counter()
        self.grammar.accept(token)
        self.ms += (time.perf_counter() - t0) * 1000.0


def guide_for(model, json_schema: dict | None) -> Guide | None:
    """The guide of a job's `json_schema` over `model`'s vocabulary (None: unconstrained); InputError
    when the schema cannot become a grammar (the job fails with that message)."""
    if json_schema is None:
        return None
    return Guide(Grammar.from_schema(model.vocab, model.n_vocab, json_schema), model.is_eog)


__all__ = ["Guide", "guide_for"]
