"""Sparse prefill: the target reads only the kept prompt tokens.

`original` positions: each kept token keeps its position id in the full prompt (gaps where tokens
were dropped), so RoPE sees the document's real geometry and decoding continues at N. This needs our
patched llama.cpp (stock builds refuse gaps). `compressed`: kept tokens are renumbered 0..K-1 and
decoding continues at K — what a stock build can run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..llama.binding import Context
from ..llama.progress import counted


@dataclass
class PrefillResult:
    next_pos: int  # where decoding continues
    n_kept: int
    logits: np.ndarray  # the target's logits after the last prompt token


def prefill_plan(tokens: Sequence[int], kept: Sequence[int], positions: str = "original") -> tuple[np.ndarray, np.ndarray, int]:
    """(tokens, positions, next_pos) of a sparse prefill of tokens[kept] (checked: sorted, unique,
    ending at the last prompt token); the serving loop decodes them in chunks into its sequence."""
    n = len(tokens)
    idx = np.asarray(kept, dtype=np.int64)
    if idx.size == 0 or idx[-1] != n - 1:
        raise ValueError("the kept indices must include the last prompt token")
    if idx.size > 1 and np.any(np.diff(idx) <= 0):
        raise ValueError("the kept indices must be sorted and unique")
    toks = np.asarray(tokens, dtype=np.int32)[idx]
    if positions == "original":
        pos, next_pos = idx.astype(np.int32), n
    elif positions == "compressed":
        pos, next_pos = np.arange(idx.size, dtype=np.int32), int(idx.size)
    else:
        raise ValueError(f"unknown positions mode {positions!r}")
    return toks, pos, next_pos


def sparse_prefill(ctx: Context, tokens: Sequence[int], kept: Sequence[int], positions: str = "original", *,
                   observe: Callable | None = None, progress: Callable[[int, int], None] | None = None) -> PrefillResult:
    """Prefill tokens[kept] into an empty cache; `kept` must be sorted, unique, and end at len(tokens)-1.

    observe: a hidden-state drafter's `observe(ctx, rows, tokens, positions)`, called after each
    llama_decode (calls of ctx.call_tokens tokens, as Context.decode splits them anyway).
    progress: `progress(kept tokens prefilled, kept tokens)` after each llama_decode call (the long
    phase of a long prompt: the job's progress shows i/n through it); raising from it ends the prefill."""
    toks, pos, next_pos = prefill_plan(tokens, kept, positions)
    idx = toks
    ctx.clear()
    if observe is None:
        ctx.decode(toks, pos, logits="last", after_call=counted(ctx, 0, int(idx.size), progress))
    else:
        for start in range(0, idx.size, ctx.call_tokens):
            end = min(start + ctx.call_tokens, idx.size)
            ctx.decode(toks[start:end], pos[start:end], logits="last" if end == idx.size else "none")
            observe(ctx, range(end - start), toks[start:end].tolist(), pos[start:end].tolist())
            if progress is not None:
                progress(end, int(idx.size))
    return PrefillResult(next_pos=next_pos, n_kept=int(idx.size), logits=ctx.logits_row(-1))
