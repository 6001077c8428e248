"""Which prompt tokens the target prefills: the top-scoring chunks of the document + protected regions."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def chunk_scores(doc_scores: np.ndarray, chunk: int) -> np.ndarray:
    """Mean token score of each `chunk`-token chunk (the last chunk may be shorter)."""
    n = doc_scores.shape[0]
    n_chunks = math.ceil(n / chunk)
    sums = np.add.reduceat(doc_scores.astype(np.float64), np.arange(0, n, chunk)) if n else np.zeros(0)
    sizes = np.minimum(chunk, n - np.arange(n_chunks) * chunk)
    return sums / sizes


def select_kept(
    doc_scores: np.ndarray,
    *,
    doc_start: int,
    n_prompt: int,
    protected: Sequence[int],
    keep: float,
    chunk: int = 32,
    max_keep: int = 0,
) -> list[int]:
    """Sorted prompt indices to prefill.

    The document (prompt[doc_start : doc_start + len(doc_scores)]) is cut into `chunk`-token chunks
    ranked by mean score; the top ceil(n_chunks * keep) are kept (ties: the earlier chunk). With
    `max_keep` > 0 the lowest-ranked kept chunks are dropped until at most max_keep document tokens
    remain (whole chunks, never every n-th token). Protected indices are always kept.
    """
    n_doc = int(doc_scores.shape[0])
    kept = set(int(i) for i in protected)
    if n_doc:
        means = chunk_scores(doc_scores, chunk)
        n_chunks = means.shape[0]
        k = min(n_chunks, math.ceil(n_chunks * keep - 1e-9))
        order = np.argsort(-means, kind="stable")[:k]
        if max_keep > 0:
            sizes = np.minimum(chunk, n_doc - order * chunk)
            while order.size and int(sizes.sum()) > max_keep:
                order, sizes = order[:-1], sizes[:-1]
        for c in order:
            start = doc_start + int(c) * chunk
            kept.update(range(start, min(start + chunk, doc_start + n_doc)))
    return sorted(i for i in kept if 0 <= i < n_prompt)
