"""Memoryless token samplers: greedy, temperature, top-k, top-p, seeded.

`probs()` is the exact distribution `sample()` draws from; speculative verification needs it (a
rejection-sampling accept test is only exact against the distribution the target really samples).
"""

from __future__ import annotations

import time

import numpy as np


class Sampler:
    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = -1) -> None:
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.seed = seed if seed >= 0 else time.time_ns() % (2**32)
        self.rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """The distribution sampled from, as a dense float64 vector (zeros outside top-k / top-p)."""
        n = logits.shape[0]
        if self.greedy:
            p = np.zeros(n)
            p[int(np.argmax(logits))] = 1.0
            return p
        z = logits.astype(np.float64) / self.temperature
        if 0 < self.top_k < n:
            idx = np.argpartition(-z, self.top_k - 1)[: self.top_k]
        else:
            idx = np.arange(n)
        zi = z[idx]
        e = np.exp(zi - zi.max())
        pi = e / e.sum()
        if self.top_p < 1.0:
            order = np.argsort(-pi, kind="stable")
            cum = np.cumsum(pi[order])
            cut = int(np.searchsorted(cum, self.top_p)) + 1  # smallest prefix with mass >= top_p
            keep = order[:cut]
            idx, pi = idx[keep], pi[keep] / pi[keep].sum()
        p = np.zeros(n)
        p[idx] = pi
        return p

    def sample(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        return self.draw(self.probs(logits))

    def draw(self, p: np.ndarray) -> int:
        """One draw from a dense distribution (inverse CDF with this sampler's generator)."""
        c = np.cumsum(p)
        return int(min(np.searchsorted(c, self.rng.random() * c[-1], side="right"), len(p) - 1))
