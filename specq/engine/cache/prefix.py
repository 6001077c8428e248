"""The target's prompt cache (#17 item 3): KV reused by the longest common token prefix, as
llama-server's prompt cache and vLLM's prefix caching do.

After a full prefill (baseline jobs, and OpenAI chat/completion requests, which are full prefills
unless they ask for specprefill) the target's KV of the whole prompt is saved into the engine's
`StateStore` (spec_cache.py: one byte budget, LRU). A later prompt of the same tenant and numerics
restores the entry sharing its longest token prefix, drops the cells past that prefix
(`llama_memory_seq_rm`) and prefills only the rest. At least the last prompt token is always decoded
again (its logits start the answer). Sparse prefills are never stored or served: their kept chunks
differ per question.

No second copy. A prompt that restored almost all of itself (another question about a cached
document: only the question was prefilled) is not saved again: the new entry would serve a later
prompt no longer a prefix than the one it came from, and would cost a second copy of the whole
document's KV (~1.7 GB at 32K tokens on a 7B, device to host, on the serving thread: 0.55-0.85 s on
the H200, docs/history.md 2026-12-05) and evict other
documents from the budget. Saved again: a prompt with at least `RESAVE_MIN_NEW_TOKENS` and
`RESAVE_MIN_NEW_FRACTION` of itself newly prefilled (a continued chat that grew).

Keys are those of spec_cache (model sha256, type_k, flash_attn, repack, batch-invariant, n_ubatch,
backend) plus the tenant; entries of other tenants or numerics are never looked at.

Engine-level API:
    cache = PrefixCache(store, numerics)
    hit = cache.prefill(ctx, scope, tokens)      # -> PrefixUse(reused, bytes_restored, …); ctx then holds
                                                 #    the whole prompt, logits of the last token ready
    start = cache.restore(ctx, seq, scope, tokens, use)   # the serving slots: the cached prefix into one
    cache.save(ctx, seq, scope, tokens, use)              #   sequence, and the whole prompt after its prefill
    cache.lookup(scope, tokens)                  # -> (entry, common) or None, no restore (mode auto)
"""

from __future__ import annotations

import llama_cpp  # isort: skip  (before numpy)

from .speculator import Entry, Numerics, StateStore, restore_seq, save_seq, tokens_sha256  # isort: skip

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ...contracts import DecodeError
from ..llama.progress import counted

log = logging.getLogger("specq.engine")

#: a hit shorter than this many tokens is not worth a restore
MIN_REUSE_TOKENS = 16
#: after a hit, a prompt is saved again only when at least this many of its tokens, and this
#: fraction of them, were newly prefilled (module doc, "No second copy")
RESAVE_MIN_NEW_TOKENS = 256
RESAVE_MIN_NEW_FRACTION = 0.1


@dataclass
class PrefixUse:
    """What one prefill did with the prompt cache (into the result's spec.cache)."""

    hit: bool = False
    #: prompt tokens whose KV came from the cache (the rest were prefilled)
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    bytes_restored: int = 0
    bytes_saved: int = 0
    #: not saved again: the hit covered nearly all of the prompt (module doc, "No second copy")
    resave_skipped: bool = False
    restore_ms: float = 0.0
    save_ms: float = 0.0
    #: the reused prefix was still in the job's own serving slot (serving.py), not restored from the store
    from_slot: bool = False
    #: the reused prefix was copied on the device from another serving slot that holds it (a job of the
    #: same document decoding there, or that slot's resident prompt), not restored from the store
    from_other_slot: bool = False
    #: the serving loop keeps the prompt in its slot and saves it only when the slot is about to be reused
    #: for another prompt (serving/loop.py, "Prompt saves"): not saved while this job ran
    save_deferred: bool = False

    def as_dict(self) -> dict:
        return {"hit": self.hit, "reused_tokens": self.reused_tokens, "prefilled_tokens": self.prefilled_tokens,
                "bytes_restored": self.bytes_restored, "bytes_saved": self.bytes_saved,
                "save_ms": round(self.save_ms, 1), "resave_skipped": self.resave_skipped, "from_slot": self.from_slot,
                "from_other_slot": self.from_other_slot, "save_deferred": self.save_deferred}


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixCache:
    NAMESPACE = "target-prefix"

    def __init__(self, store: StateStore, numerics: Numerics, *, min_reuse: int = MIN_REUSE_TOKENS) -> None:
        self.store = store
        self.numerics = numerics
        self.min_reuse = min_reuse

    def _base(self, scope: str) -> tuple:
        return (self.NAMESPACE, *self.numerics.key(), scope)

    def lookup(self, scope: str, tokens: Sequence[int]) -> tuple[Entry, int] | None:
        """The entry sharing the longest prefix with `tokens` and that prefix's length (at most
        len(tokens) - 1: the last token is always decoded), or None below `min_reuse` tokens."""
        if not self.store.enabled or len(tokens) < 2:
            return None
        toks = np.asarray(tokens, dtype=np.int32)
        best, best_n = None, 0
        for e in self.store.entries(self._base(scope)):
            n = common_prefix(e.tokens, toks)
            if n > best_n:
                best, best_n = e, n
        best_n = min(best_n, len(tokens) - 1)
        if best is None or best_n < self.min_reuse:
            return None
        return best, best_n

    def restore(self, ctx, seq: int, scope: str, tokens: Sequence[int], use: PrefixUse) -> int:
        """Put the longest cached prefix of `tokens` into sequence `seq` of `ctx` (empty for it) and
        return its length: the first position still to prefill (0 on a miss). Records the hit in `use`."""
        found = self.lookup(scope, tokens)
        if found is None:
            self.store.stats.misses += 1
            return 0
        entry, common = found
        t0 = time.perf_counter()
        try:
            restore_seq(ctx, entry.data, seq)
            if common < entry.tokens.size:
                ctx.seq_rm(seq, common, -1)
        except DecodeError:  # a state this context cannot take: a plain prefill instead
            ctx.seq_rm(seq, -1, -1)
            self.store.stats.misses += 1
            use.restore_ms = (time.perf_counter() - t0) * 1000.0
            return 0
        use.restore_ms = (time.perf_counter() - t0) * 1000.0
        self.store.touch(entry.key)
        use.hit, use.reused_tokens, use.bytes_restored = True, common, len(entry.data)
        return common

    def save(self, ctx, seq: int, scope: str, tokens: Sequence[int], use: PrefixUse) -> None:
        """Store sequence `seq` of `ctx`, which holds exactly `tokens` at positions 0..n-1 — unless `use`
        says a hit already covered nearly all of them (module doc, "No second copy")."""
        if not self.store.enabled:
            return
        if use.hit and self.covered(len(tokens), use.reused_tokens):
            use.resave_skipped = True
            return
        t0 = time.perf_counter()
        if int(llama_cpp.llama_state_seq_get_size(ctx.ptr, seq)) > self.store.budget:
            return  # it would not be stored: do not copy it out (GB at 32K tokens on a 7B)
        try:
            data = save_seq(ctx, seq)
        except DecodeError:  # a cache is an optimisation: the job goes on without the entry
            log.warning("prompt cache: could not save sequence %d (%d tokens); not cached", seq, len(tokens))
            return
        if self.store.put((*self._base(scope), len(tokens), tokens_sha256(tokens)), data, tokens):
            use.bytes_saved = len(data)
        use.save_ms = (time.perf_counter() - t0) * 1000.0

    @staticmethod
    def covered(n: int, reused: int) -> bool:
        """Whether a prompt of n tokens of which `reused` came from an entry is not worth a save of its own
        (module doc, "No second copy")."""
        new = n - reused
        return new < RESAVE_MIN_NEW_TOKENS or new < RESAVE_MIN_NEW_FRACTION * n

    def prefill(self, ctx, scope: str, tokens: Sequence[int], *, save: bool = True,
                progress: Callable[[int, int], None] | None = None) -> PrefixUse:
        """Fill a context's sequence 0 with `tokens` (positions 0..n-1), reusing the longest cached prefix;
        the logits of the last token are then in ctx.logits_row(-1). Saves the prompt's KV afterwards.
        progress: `progress(tokens in the cache, n)` after each llama_decode call (llama/progress.py)."""
        use = PrefixUse()
        n = len(tokens)
        ctx.clear()
        start = self.restore(ctx, 0, scope, tokens, use)
        ctx.decode(list(tokens[start:]), range(start, n), logits="last", after_call=counted(ctx, start, n, progress))
        use.prefilled_tokens = n - start
        if save:
            self.save(ctx, 0, scope, tokens, use)
        return use


__all__ = ["PrefixCache", "PrefixUse", "MIN_REUSE_TOKENS", "RESAVE_MIN_NEW_TOKENS", "RESAVE_MIN_NEW_FRACTION", "common_prefix"]
