"""Benchmarks on random weights only: an emulated overlap of several questions' selections.

Why. Group-sparse prefill (group_sparse.py, serving_group.py) prefills the union of a document's
questions' kept chunks. On random weights each question's selection is close to independent, so 8
selections of 30% cover ~94% of the document; on the real pair the questions' selections overlap
(10 questions at 4K: union 43% of the document, median; docs/history.md). A GPU benchmark on
random-weight shapes would therefore measure group-sparse at a union no real pair produces. With
`EmulatedUnion(U, K)` handed to the Engine as its `select_override` (the benchmark injects it:
`specq bench worker --union U:K`, which bench/gpu/serve.sh runs for `SPECQ_BENCH_UNION=U:K`;
production code never builds one and never reads that variable) every specprefill selection is replaced, AFTER the real scoring and selection ran (their cost is paid as
usual), by the same number of document chunks drawn so that K questions about one document cover
about U of it: a shared part, the same chunks for every question about the document (seeded by the
document's tokens), plus a private part seeded by the whole prompt (the question). Head, template
tail and pinned indices stay kept. Every result of such a run carries a warning that says so.

With own fraction f (the job's keep) and C chunks: private p = (U - f) / (K - 1) * C chunks, shared
f * C - p; K questions then cover f*C + (K-1)*p = U*C chunks (less where two private draws collide).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

ENV = "SPECQ_BENCH_UNION"


def parse(raw: str) -> tuple[float, int]:
    """(U, K) from "U:K"; a bad value raises ValueError."""
    raw = raw.strip()
    try:
        u, k = raw.split(":")
        union, members = float(u), int(k)
    except ValueError:
        raise ValueError(f"the union must be U:K (a union fraction and a group size, e.g. 0.43:8), not {raw!r}") from None
    if not (0.0 < union <= 1.0 and members >= 2):
        raise ValueError(f"the union U:K needs U in (0, 1] and K >= 2, not {raw!r}")
    return union, members


@dataclass(frozen=True)
class EmulatedUnion:
    """A selection override for `Engine(select_override=...)`: `(kept, prompt, chunk) -> kept`."""

    union: float
    members: int

    @classmethod
    def parse(cls, raw: str) -> "EmulatedUnion":
        return cls(*parse(raw))

    def __call__(self, kept: list[int], prompt, chunk: int) -> list[int]:
        return emulate(kept, prompt, chunk, self.union, self.members)

    def __str__(self) -> str:  # what the run's spec.reason names
        return f"{ENV}={self.union}:{self.members}"


def _seed(tokens) -> int:
    return int.from_bytes(hashlib.blake2b(np.asarray(tokens, dtype=np.int32).tobytes(), digest_size=8).digest(), "little")


def emulate(kept: list[int], prompt, chunk: int, union: float, members: int) -> list[int]:
    """`kept` with its document chunks replaced as the module doc says (the same number of chunks)."""
    start, end = prompt.doc_start, prompt.doc_end
    n_doc = end - start
    if n_doc <= 0 or chunk <= 0:
        return kept
    pinned = set(prompt.pinned)
    outside = [i for i in kept if not (start <= i < end) or i in pinned]
    own = len({(i - start) // chunk for i in kept if start <= i < end and i not in pinned})
    n_chunks = -(-n_doc // chunk)
    private = int(round(max(0.0, union * n_chunks - own) / (members - 1)))
    private = min(private, own)
    shared = own - private
    order = np.random.default_rng(_seed(prompt.tokens[:end])).permutation(n_chunks)
    picked = set(order[:shared].tolist())
    rest = order[shared:]
    if private and len(rest):
        draw = np.random.default_rng(_seed(prompt.tokens)).choice(len(rest), size=min(private, len(rest)), replace=False)
        picked.update(rest[draw].tolist())
    doc = [i for c in picked for i in range(start + c * chunk, min(end, start + (c + 1) * chunk))]
    return sorted(set(outside) | set(doc))


__all__ = ["ENV", "EmulatedUnion", "parse", "emulate"]
