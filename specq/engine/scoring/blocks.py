"""The indentation structure of a document, in chunks: which chunk holds the line a chunk's lines hang from.

Why (the `scope` chunk rule, selection.rank_scores): in code, the line the lookahead attends to
(a `raise` with the message the question quotes, a constant's value) often says nothing of where it
sits; the line it hangs from (the `def`, the `raise` of a message on a continuation line, the
`if`) does, and it can sit chunks away with a low score of its own. A line's *header* is the
nearest line before it with less indentation (blank lines skipped): the indentation tree of Python,
C, YAML, Markdown lists, indented prose. Text with no indentation has no headers and the rule
changes nothing there.

Works on the document tokens' bytes (Model.token_bytes), so the engine needs no character offsets:
lines are cut at b"\\n" and indentation counts leading spaces and tabs.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def header_chunks(pieces: Sequence[bytes], chunk: int) -> list[tuple[int, ...]]:
    """For each `chunk`-token chunk of the token sequence `pieces`, the other chunks holding the
    header line (the first non-blank byte of it) of a line that has a non-blank byte in the chunk."""
    n = len(pieces)
    n_chunks = -(-n // chunk) if n else 0
    parents: list[set[int]] = [set() for _ in range(n_chunks)]
    for c, h in header_pairs(pieces, chunk):
        parents[c].add(h)
    return [tuple(sorted(p)) for p in parents]


def _lines(pieces: Sequence[bytes]):
    """One pass over the non-blank lines of the tokens' bytes: (starts, first, last, head, end) with
    starts the byte offset of each token (and the total), and per non-blank line its first non-blank byte,
    its last byte, its header line (the nearest earlier line with less indentation; -1: none) and the last
    line of the block it heads (itself when no later line is indented deeper), as int64 arrays."""
    n = len(pieces)
    starts = np.concatenate([[0], np.cumsum(np.fromiter((len(p) for p in pieces), dtype=np.int64, count=n))])
    firsts: list[int] = []
    lasts: list[int] = []
    heads: list[int] = []
    ends: list[int] = []
    stack: list[tuple[int, int]] = []  # (indentation, line), indentation rising
    pos = 0
    for line in b"".join(pieces).split(b"\n"):
        a, b = pos, pos + len(line)
        pos = b + 1
        body = line.lstrip(b" \t")
        if not body.strip():
            continue
        indent = len(line) - len(body)
        i = len(firsts)
        while stack and stack[-1][0] >= indent:
            ends[stack.pop()[1]] = i - 1
        heads.append(stack[-1][1] if stack else -1)
        stack.append((indent, i))
        firsts.append(a + indent)
        lasts.append(b - 1)
        ends.append(i)
    for _, i in stack:
        ends[i] = len(firsts) - 1
    arr = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return starts, arr(firsts), arr(lasts), arr(heads), arr(ends)


def _chunk_of_bytes(starts: np.ndarray, offsets: np.ndarray, chunk: int) -> np.ndarray:
    """The chunk holding the token of each byte offset (one searchsorted)."""
    tok = np.searchsorted(starts, offsets, side="right") - 1
    return np.minimum(tok, len(starts) - 2) // chunk


def header_pairs(pieces: Sequence[bytes], chunk: int) -> np.ndarray:
    """header_chunks as (chunk, header chunk) rows (int64, shape (k, 2), unique): one pass over the
    lines, one searchsorted for all their bytes (~50 ms for 128K tokens of code)."""
    if not len(pieces):
        return np.zeros((0, 2), dtype=np.int64)
    starts, firsts, lasts, head_of, _ = _lines(pieces)
    if not firsts.size:
        return np.zeros((0, 2), dtype=np.int64)
    chunks = _chunk_of_bytes(starts, np.concatenate([firsts, lasts]), chunk)
    first, last = chunks[: firsts.size], chunks[firsts.size:]
    has = head_of >= 0
    rows = []
    for span in range(int((last - first).max()) + 1):  # a line over several chunks: each of them
        m = has & (first + span <= last)
        rows.append(np.stack([first[m] + span, first[head_of[m]]], axis=1))
    pairs = np.concatenate(rows)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return np.unique(pairs, axis=0)


def block_ids(pieces: Sequence[bytes], chunk: int, max_chunks: int) -> np.ndarray:
    """For each `chunk`-token chunk, the block it belongs to (-1: none), for the `block` chunk rule.

    A block is a header line and every line after it indented deeper (blank lines inside it included): a
    function, a class, an indented paragraph. A chunk belongs to the largest block that holds it and spans
    at most `max_chunks` chunks (so a method, not its whole class); ids are the blocks' first chunks.
    Blocks nest, so the largest first, each chunk keeping the first block that claims it."""
    n = len(pieces)
    out = np.full(-(-n // chunk) if n else 0, -1, dtype=np.int64)
    if not n:
        return out
    starts, firsts, lasts, _, ends = _lines(pieces)
    if not firsts.size:
        return out
    chunks = _chunk_of_bytes(starts, np.concatenate([firsts, lasts[ends]]), chunk)
    a_c, b_c = chunks[: firsts.size], chunks[firsts.size:]
    has_body = ends > np.arange(firsts.size)
    size = b_c - a_c + 1
    for i in np.lexsort((a_c, -size)):  # largest first
        if has_body[i] and size[i] <= max_chunks:
            span = out[a_c[i]: b_c[i] + 1]
            span[span < 0] = a_c[i]
    return out
