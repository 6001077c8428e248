"""Batch-invariant mode: target numerics under which a token's logits do not depend on how many tokens
were decoded with it, so greedy speculative decoding gives plain greedy decoding's tokens bit for bit.

llama.cpp's CPU backend picks kernels by batch size, and the kernels round differently (found in its
source, measured with scripts/check_batch_invariance.py; docs/speculative-decoding.md has the table):

1. repacked weights (extra buffer types): gemv for the last n % 4 rows of a batch, gemm for the rest;
2. the tiled K-quant matmul takes batches of >= 8 rows, vec_dot below;
3. flash attention over an F16/F32 K cache splits a lone query's KV (>= 512 cells) across threads
   (`use_split_kv_path`) and tiles >= 64 queries; any other K type runs one per-row path always;
4. without flash attention, llamafile's sgemm computes KQ and KQV for >= 2 tokens, vec_dot for 1.

The mode avoids each switch with settings only: no repacking (1), verification batches of at most
MAX_INVARIANT_BATCH tokens (2, 3), flash attention on (4) with a q8_0 K cache (3). Measured: max
|Δlogit| = 0 between lone decodes and batches of 2-7, at 2.2K cells, 1 and 2 threads.
It covers the CPU kernels only: a GPU backend has its own batch-size-dependent kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...contracts import InputError
from ..options import EngineOptions

#: largest verification batch (last token + draft) that stays on the per-row kernels: the tiled
#: K-quant matmul starts at 8 rows
MAX_INVARIANT_BATCH = 7
#: K cache type that keeps CPU flash attention on its per-row path for every batch size
INVARIANT_TYPE_K = "q8_0"


@dataclass(frozen=True)
class Numerics:
    """How the target is loaded and its context built, resolved from EngineOptions."""

    #: the target is in batch-invariant mode
    batch_invariant: bool
    repack: bool
    flash_attn: bool
    type_k: str
    #: cap on drafted tokens per verification batch (n_draft); 0 = none
    max_draft: int
    #: why: shown in the run result's warnings where it matters
    note: str = ""


def on_cpu(options: EngineOptions, backend: str) -> bool:
    """Whether the target's decode kernels are llama.cpp's CPU ones."""
    return backend == "cpu" or options.n_gpu_layers == 0


def resolve(options: EngineOptions, backend: str) -> Numerics:
    """auto (the default) = off, on the CPU too: the mode costs prefill time that grows with the
    prompt (−19% tok/s at 4.4K tokens, −33% at 7.8K on the real pair; several-fold on the tiny test
    models: docs/speculative-decoding.md) and buys something only for jobs that draft — specq's
    default is `draft none`. `on` gives drafting jobs tokens identical to `--draft none` on the CPU
    (for a whole worker: numerics are fixed when the model loads); `off` forces it off."""
    choice = options.batch_invariant
    if choice not in ("auto", "on", "off"):
        raise InputError(f"batch_invariant must be auto, on or off, not {choice!r}")
    cpu = on_cpu(options, backend)
    on = choice == "on"
    if not on:
        return Numerics(False, options.repack, options.flash_attn, "f16", 0)
    note = "" if cpu else (
        "batch-invariant mode covers llama.cpp's CPU kernels; on a GPU greedy speculative output can "
        "still differ from --draft none at near-ties"
    )
    return Numerics(True, False, True, INVARIANT_TYPE_K, MAX_INVARIANT_BATCH - 1, note)


def draft_warning(numerics: Numerics, n_draft: int, greedy: bool) -> list[str]:
    """Warnings for a run that drafts: the cap applied, or why greedy output may differ from none's."""
    out = []
    if numerics.batch_invariant and numerics.max_draft and n_draft > numerics.max_draft:
        out.append(f"n_draft {n_draft} capped at {numerics.max_draft} by batch-invariant mode "
                   f"(llama.cpp switches Q4_K matmul kernels at {MAX_INVARIANT_BATCH + 1} tokens)")
    if greedy and not numerics.batch_invariant:
        out.append("batch-invariant mode is off: greedy speculative output can differ from --draft none "
                   "at near-ties (llama.cpp's kernels depend on the batch size)")
    elif greedy and numerics.note:
        out.append(numerics.note)
    return out


__all__ = ["MAX_INVARIANT_BATCH", "INVARIANT_TYPE_K", "Numerics", "resolve", "on_cpu", "draft_warning"]
