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
    if not n_chunks:
        return []
    data = b"".join(pieces)
    starts = np.concatenate([[0], np.cumsum(np.fromiter((len(p) for p in pieces), dtype=np.int64, count=n))])

    def chunk_of(byte: int) -> int:  # the chunk of the token holding this byte
        return min(int(np.searchsorted(starts, byte, side="right")) - 1, n - 1) // chunk

    parents: list[set[int]] = [set() for _ in range(n_chunks)]
    stack: list[tuple[int, int]] = []  # (indentation, chunk of its first non-blank byte), indentation rising
    pos = 0
    for line in data.split(b"\n"):
        a, b = pos, pos + len(line)
        pos = b + 1
        body = line.lstrip(b" \t")
        if not body.strip():
            continue
        indent = len(line) - len(body)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        first, last = chunk_of(a + indent), chunk_of(b - 1)
        if stack:
            head = stack[-1][1]
            for c in range(first, last + 1):
                if c != head:
                    parents[c].add(head)
        stack.append((indent, first))
    return [tuple(sorted(p)) for p in parents]
