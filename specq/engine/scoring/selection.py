"""Which prompt tokens the target prefills: the top-scoring chunks of the document + protected regions."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .blocks import block_ids, header_pairs
from ..options import CHUNK_RULES, DEFAULT_CHUNK_RULE


def chunk_scores(doc_scores: np.ndarray, chunk: int) -> np.ndarray:
    """Mean token score of each `chunk`-token chunk (the last chunk may be shorter)."""
    n = doc_scores.shape[0]
    n_chunks = math.ceil(n / chunk)
    sums = np.add.reduceat(doc_scores.astype(np.float64), np.arange(0, n, chunk)) if n else np.zeros(0)
    sizes = np.minimum(chunk, n - np.arange(n_chunks) * chunk)
    return sums / sizes


#: the `scope` rule: a header line's chunk ranks at least this share of the best chunk hanging from it
HEADER_WEIGHT = 0.75
#: the `block` rule: a block ranks its chunks at this share of its best chunk's rank (below it, so the best
#: chunk itself goes first), and a block spans at most BLOCK_MAX_CHUNKS chunks (512 tokens at chunk 32)
BLOCK_WEIGHT = 0.99
BLOCK_MAX_CHUNKS = 16


def rank_scores(doc_scores: np.ndarray, chunk: int, rule: str = DEFAULT_CHUNK_RULE,
                headers: np.ndarray | None = None) -> np.ndarray:
    """The score each chunk is ranked by.

    `mean`: the chunk's mean token score (chunk_scores). `border`: the largest of that mean and the
    means of the two chunk-sized spans that straddle the chunk's borders (half in it, half in its
    neighbour; cut at the document's ends). Why: a sentence the lookahead attends to is cut by the
    fixed chunk grid about half the time, and under `mean` the chunk holding its smaller part ranks
    low, so the answer line is kept only in part. On the real pair's recall tasks every missed
    answer at keep 0.3 was such a two-chunk line (single-chunk evidence: 219 of 219 kept); `border`
    keeps the neighbour of a strongly attended border at the same budget (docs/history.md, "Chunk
    borders"). A chunk's own mean is never lowered, so a chunk ranked high by `mean` stays high.

    `scope` (opt-in): `border`, then each chunk holding a header line (`headers`: blocks.header_pairs,
    rows (chunk, chunk holding the header of one of its lines)) ranks at least HEADER_WEIGHT
    (3/4) as high as the chunks hanging from it: below its line, so a header displaces only chunks
    clearly weaker than the line it explains (at full weight the headers of every strong chunk took
    budget from other evidence: 16K recall fell below `border`'s). Why: the misses left under
    `border` were code lines kept without the line they hang from (a `raise` without its `def` or
    `if`, a message on a continuation line without its `raise`), chunks apart. Needs `headers`; text
    without indentation has none and ranks as under `border`. Not the default: recall rose (8K 0.950,
    16K 0.960) but the target answered worse from its kept sets at 4K (docs/history.md "Header lines").

    `block` (opt-in, issue 49 item 4): `border`, then every chunk of a block (`headers` here: blocks.block_ids,
    the block of each chunk: a header line and its deeper-indented lines, at most BLOCK_MAX_CHUNKS chunks)
    ranks at least BLOCK_WEIGHT of the block's best chunk: once a function is attended to, all of it is
    kept before weaker chunks elsewhere. Why: a code review's bug line or a call site sits inside a function
    whose name the question gives; the look-ahead attends to the name, not to every line of the body.
    """
    if rule not in CHUNK_RULES:
        raise ValueError(f"chunk rule {rule!r}: one of {', '.join(CHUNK_RULES)}")
    if rule == "block":
        if headers is None:
            raise ValueError("the block chunk rule needs the document's block ids (blocks.block_ids)")
        ranks = rank_scores(doc_scores, chunk, "border")
        ids = np.asarray(headers, dtype=np.int64).reshape(-1)
        if ids.shape[0] != ranks.shape[0]:
            raise ValueError(f"block ids for {ids.shape[0]} chunks, scores for {ranks.shape[0]}")
        inside = ids >= 0
        best = np.full(ranks.shape[0], -np.inf)
        np.maximum.at(best, ids[inside], ranks[inside])
        out = ranks.copy()
        out[inside] = np.maximum(ranks[inside], BLOCK_WEIGHT * best[ids[inside]])
        return out
    if rule == "scope":
        if headers is None:
            raise ValueError("the scope chunk rule needs the document's header pairs (blocks.header_pairs)")
        ranks = rank_scores(doc_scores, chunk, "border")
        pairs = np.asarray(headers, dtype=np.int64).reshape(-1, 2)
        if pairs.size and int(pairs.max()) >= ranks.shape[0]:
            raise ValueError(f"header pairs name chunk {int(pairs.max())}, scores for {ranks.shape[0]} chunks")
        out = ranks.copy()
        np.maximum.at(out, pairs[:, 1], HEADER_WEIGHT * ranks[pairs[:, 0]])
        return out
    means = chunk_scores(doc_scores, chunk)
    if rule == "mean":
        return means
    n, n_chunks = int(doc_scores.shape[0]), means.shape[0]
    if n_chunks < 2 or chunk < 2:  # one chunk, or one-token chunks: no line to join
        return means
    cs = np.concatenate([[0.0], np.cumsum(doc_scores.astype(np.float64))])
    borders = np.arange(1, n_chunks) * chunk  # border j sits between chunk j-1 and chunk j
    a = np.maximum(borders - chunk // 2, 0)
    b = np.minimum(a + chunk, n)
    across = (cs[b] - cs[a]) / np.maximum(b - a, 1)  # across[j-1]: the span over border j
    out = means.copy()
    out[1:] = np.maximum(out[1:], across)  # a chunk's left border
    out[:-1] = np.maximum(out[:-1], across)  # its right border
    return out


def reads_text(rule: str) -> bool:
    """Whether `rule` needs the document tokens' bytes (`pieces`): `scope` (its header lines) and `block`."""
    return rule in ("scope", "block")


def headers_for(rule: str, pieces: Sequence[bytes] | None, chunk: int) -> np.ndarray | None:
    """The structure rank_scores needs under `rule` (reads_text), from the document tokens' bytes: header
    pairs for `scope`, block ids for `block`; None for the other rules."""
    if not reads_text(rule):
        return None
    if pieces is None:
        raise ValueError(f"the {rule} chunk rule needs the document tokens' bytes (pieces)")
    if rule == "block":
        return block_ids(pieces, chunk, BLOCK_MAX_CHUNKS)
    return header_pairs(pieces, chunk)


def chunk_order(doc_scores: np.ndarray, chunk: int, rule: str = DEFAULT_CHUNK_RULE,
                pieces: Sequence[bytes] | None = None) -> np.ndarray:
    """The chunks best first under `rule` (ties: the earlier chunk): every selection keeps a prefix."""
    return np.argsort(-rank_scores(doc_scores, chunk, rule, headers_for(rule, pieces, chunk)), kind="stable")


def _top_chunks(doc_scores: np.ndarray, chunk: int, keep: float, max_keep: int, rule: str,
                pieces: Sequence[bytes] | None) -> np.ndarray:
    """The prefix of chunk_order that `keep` allows, cut further (lowest-ranked first) to at most
    max_keep tokens when max_keep > 0."""
    order = chunk_order(doc_scores, chunk, rule, pieces)
    order = order[: window_budget(order.shape[0], keep)]
    if max_keep > 0:
        sizes = np.minimum(chunk, int(doc_scores.shape[0]) - order * chunk)
        while order.size and int(sizes.sum()) > max_keep:
            order, sizes = order[:-1], sizes[:-1]
    return order


def select_kept(
    doc_scores: np.ndarray,
    *,
    doc_start: int,
    n_prompt: int,
    protected: Sequence[int],
    keep: float,
    chunk: int = 32,
    max_keep: int = 0,
    rule: str = DEFAULT_CHUNK_RULE,
    pieces: Sequence[bytes] | None = None,
) -> list[int]:
    """Sorted prompt indices to prefill.

    The document (prompt[doc_start : doc_start + len(doc_scores)]) is cut into `chunk`-token chunks
    ranked by rank_scores (`rule`: CHUNK_RULES); the top ceil(n_chunks * keep) are kept (ties: the earlier chunk). With
    `max_keep` > 0 the lowest-ranked kept chunks are dropped until at most max_keep document tokens
    remain (whole chunks, never every n-th token). Protected indices are always kept. `pieces`: the
    document tokens' bytes, which the `scope` rule needs (its header lines).
    """
    n_doc = int(doc_scores.shape[0])
    kept = set(int(i) for i in protected)
    if n_doc:
        for c in _top_chunks(doc_scores, chunk, keep, max_keep, rule, pieces):
            start = doc_start + int(c) * chunk
            kept.update(range(start, min(start + chunk, doc_start + n_doc)))
    return sorted(i for i in kept if 0 <= i < n_prompt)


#: how the keep budget is spent across scoring windows
SELECTIONS = ("global", "per-window")


def window_budget(n_chunks: int, keep: float) -> int:
    """Chunks kept out of `n_chunks`: ceil(n_chunks * keep), the rule select_kept uses."""
    return min(n_chunks, math.ceil(n_chunks * keep - 1e-9))


def select_window(
    win_scores: np.ndarray,
    *,
    start: int,
    keep: float,
    chunk: int = 32,
    max_keep: int = 0,
    rule: str = DEFAULT_CHUNK_RULE,
    pieces: Sequence[bytes] | None = None,
) -> list[int]:
    """The per-window rule for one scoring window: sorted prompt indices of its kept chunks.

    `win_scores` are the scores of the window's document slice, which begins at prompt index `start`.
    The slice is cut into `chunk`-token chunks from its own start (a chunk never straddles two
    windows, and rank_scores' border spans are cut at the slice's ends, so a window's choice needs no
    other window's scores) and the top ceil(n_chunks * keep) by rank_scores (`rule`) are kept, ties to the earlier chunk. `max_keep` here is this window's share of the cap. Protected
    indices are not this function's business (the caller adds them). `pieces`: the bytes of the
    window's document tokens (the `scope` rule: header lines before the window are not seen).
    """
    n = int(win_scores.shape[0])
    if not n:
        return []
    kept: list[int] = []
    for c in sorted(int(c) for c in _top_chunks(win_scores, chunk, keep, max_keep, rule, pieces)):
        a = start + c * chunk
        kept.extend(range(a, min(a + chunk, start + n)))
    return kept


def window_cap(max_keep: int, n_win: int, n_doc: int) -> int:
    """A window's share of the `max_keep` cap, in proportion to its size (0 = no cap). The shares sum
    to at most max_keep (at least 1 token each, so a cap below the number of windows keeps nothing)."""
    if max_keep <= 0 or n_doc <= 0:
        return 0
    return max(1, (max_keep * n_win) // n_doc)


def select_kept_per_window(
    doc_scores: np.ndarray,
    windows: Sequence[tuple[int, int]],
    *,
    doc_start: int,
    n_prompt: int,
    protected: Sequence[int],
    keep: float,
    chunk: int = 32,
    max_keep: int = 0,
    rule: str = DEFAULT_CHUNK_RULE,
    pieces: Sequence[bytes] | None = None,
) -> list[int]:
    """select_kept with the keep ratio applied per scoring window (`windows`: document slices [a, b)
    tiling the document, as scoring.plan_windows makes them): the union of select_window over the
    windows, plus the protected indices. What the pipelined prefill keeps, computed at once."""
    n_doc = int(doc_scores.shape[0])
    kept = set(int(i) for i in protected)
    for a, b in windows:
        kept.update(select_window(doc_scores[a:b], start=doc_start + a, keep=keep, chunk=chunk,
                                  max_keep=window_cap(max_keep, b - a, n_doc), rule=rule,
                                  pieces=None if pieces is None else pieces[a:b]))
    return sorted(i for i in kept if 0 <= i < n_prompt)
