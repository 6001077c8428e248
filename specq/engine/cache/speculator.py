"""Reusing the speculator's work on a document across questions (#17 item 2), and the byte-budgeted
LRU store of saved KV states that it shares with the target's prefix cache (prefix_cache.py).

Why it works. A native prompt is [template head][document][question + template tail] (prompt.py:
the document precedes the question, also in the chat template), and the windowed scorer's window w
is head + doc[a_w:b_w] + tail (scoring.py). The speculator's KV of head + doc[a_w:b_w] depends only on
those tokens, so it is saved once (`llama_state_seq_get_data`) and restored for every further question
(`llama_state_seq_set_data`): only the question tail and the lookahead run again. Scores are computed
from the lookahead queries against the K cache of the whole window; a restored prefix holds exactly
the K bytes that were saved, in cells 0..len-1 (cell i = position i, as scoring reads it). With a
cache the prefix is always prefilled by its own decode call (then saved), so a first and a further
question read identical prefix keys; an uncached run (one decode call for the whole window) differs
from them only by llama.cpp's batch-composition rounding (tests: max relative score difference
<= 1e-3, identical kept set).

Keys. An entry's key holds the model file's sha256, every numerics setting of the context that
computed it (type_k, flash_attn, repack, batch-invariant, n_ubatch, backend, single context or
parallel streams), the tenant (`scope`: two tenants never share an entry, even for the same text) and
the sha256 of the exact token ids of the prefix. Any change is a miss, never a wrong hit.

Which windows are saved (`policy`, EngineOptions.spec_cache_save, SPECQ_SPEC_CACHE_SAVE). `always`
(the default): every window prefix a run prefilled is saved. `repeat`: only where a later question is
expected, i.e. the job asks about a stored document (`begin(expect_reuse=True)`: the worker's
`document_id` jobs), or the same window prefix (same key: scope, numerics, tokens) was prefilled once
before in this process and not saved then (its second sight; the third question hits). A
question served from the scorer's resident streams (scoring.py) looks nothing up, so it does not
count as a sight. A one-off
document's windows are then never copied to the host: at 32K tokens with the 0.5B speculator that is
8 states of ~49 MB (~400 MB) per job, device to host into fresh host memory, on the engine thread,
with no later hit to pay for it (docs/serving.md "Where the time goes"). Lookups and restores are the
same under both policies, and the prefix is still prefilled by its own decode call, so the scores and
kept tokens do not depend on the policy. `save_ms` (the result's `timings_ms.cache_save`) is the time
spent saving.

Budget. One `StateStore` per engine, `SPECQ_CACHE_BYTES` (EngineOptions.cache_bytes) for both caches,
in host memory; least recently used entries are evicted first; an entry larger than the budget is
not stored. 0 turns both caches off. `SPECQ_CACHE_DIR` (EngineOptions.cache_dir) mirrors the store in
a directory, so it outlives the process (cache_disk.py).

Save/restore vs sequence copy: the saved state is host memory, so it survives the context being used
for other prompts and it is bounded by bytes. A `llama_memory_seq_cp` cache would keep the cells in
the context itself (no copy at all), but pins context cells per cached document; not measured here.
"""

from __future__ import annotations

import llama_cpp  # isort: skip  (before numpy)

import ctypes
import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ...contracts import DecodeError

#: default byte budget of a worker's caches (SPECQ_CACHE_BYTES); 0 = off
DEFAULT_CACHE_BYTES = 2 << 30


# --- saving and restoring one sequence's KV ----------------------------------------------------------------


_U8P = ctypes.POINTER(ctypes.c_uint8)


def save_seq(ctx, seq_id: int = 0) -> np.ndarray:
    """The KV state of sequence `seq_id` of `ctx` (a Context), in host memory.

    Why a numpy array and not `bytes`: llama.cpp writes the state straight into an uninitialised
    buffer (`np.empty`: no zeroing), and nothing copies it again. The former path (a zeroed ctypes
    array, then `bytes(...)`) wrote the state's size three times; at 32K tokens of a 7B (1.7 GB) a
    save took 2.0-3.0 s on the H200 host (0.55-0.85 s now), on the serving thread, stalling every
    slot's decode (docs/history.md, 2026-12-05)."""
    size = int(llama_cpp.llama_state_seq_get_size(ctx.ptr, seq_id))
    buf = np.empty(size, dtype=np.uint8)
    got = int(llama_cpp.llama_state_seq_get_data(ctx.ptr, buf.ctypes.data_as(_U8P), size, seq_id))
    if got <= 0:
        raise DecodeError(f"could not save the KV state of sequence {seq_id}")
    out = buf[:got]
    out.flags.writeable = False
    return out


def restore_seq(ctx, data: bytes | np.ndarray, seq_id: int = 0) -> None:
    """Put a state from `save_seq` (or its bytes from disk) into sequence `seq_id` of `ctx` (whose cache
    should be empty for it: the cells land in the first free slot, cell i = position i in a cleared
    cache). The state is read in place, not copied first."""
    arr = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    got = int(llama_cpp.llama_state_seq_set_data(ctx.ptr, arr.ctypes.data_as(_U8P), arr.size, seq_id))
    if got != arr.size:
        raise DecodeError(f"could not restore a saved KV state into sequence {seq_id} ({got} of {arr.size} bytes)")


# --- keys --------------------------------------------------------------------------------------------------

_FILE_HASHES: dict[tuple[str, int, int], str] = {}
_FILE_LOCK = threading.Lock()


def file_sha256(path: str | Path) -> str:
    """sha256 of a model file, computed once per process per (path, size, mtime)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    with _FILE_LOCK:
        if key not in _FILE_HASHES:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
            _FILE_HASHES[key] = h.hexdigest()
        return _FILE_HASHES[key]


def tokens_sha256(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()


@dataclass(frozen=True)
class Numerics:
    """Everything about a context that changes the KV bytes it computes for the same tokens."""

    model_sha256: str
    type_k: str
    flash_attn: bool
    repack: bool
    batch_invariant: bool
    n_ubatch: int
    backend: str
    #: "single" (one sequence) or "streams" (parallel KV streams of the scorer)
    layout: str = "single"

    def key(self) -> tuple:
        return tuple(vars(self).values())


# --- the store ---------------------------------------------------------------------------------------------


@dataclass
class Entry:
    key: tuple
    #: the saved KV state, read-only: save_seq's numpy array, or bytes loaded by the disk tier
    data: bytes | np.ndarray
    #: the tokens whose KV `data` holds (prefix cache: matched by longest common prefix)
    tokens: np.ndarray | None = None
    hits: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.data) + (0 if self.tokens is None else self.tokens.nbytes)


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    evictions: int = 0
    refused: int = 0  # entries larger than the whole budget

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class StateStore:
    """Saved KV states under one byte budget, least recently used evicted first. Thread-safe (the
    serving loop and a status reader may touch it from two threads)."""

    def __init__(self, budget_bytes: int = DEFAULT_CACHE_BYTES, disk=None) -> None:
        self.budget = max(0, int(budget_bytes))
        self._entries: OrderedDict[tuple, Entry] = OrderedDict()
        self.used = 0
        self.stats = StoreStats()
        self._lock = threading.Lock()
        #: a cache_disk.DiskTier: every entry also on disk, loaded back by the next store (SPECQ_CACHE_DIR)
        self.disk = disk if self.budget > 0 else None
        if self.disk is not None:
            for key, data, tokens in self.disk.load(self.budget):
                e = Entry(key, data, tokens)
                self._entries[key] = e
                self.used += e.nbytes

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple) -> Entry | None:
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            e.hits += 1
            self.stats.hits += 1
            return e

    def touch(self, key: tuple) -> None:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self._entries[key].hits += 1
                self.stats.hits += 1

    def put(self, key: tuple, data: bytes | np.ndarray, tokens: Sequence[int] | None = None) -> bool:
        """Store (or replace) an entry; False when it is larger than the whole budget."""
        e = Entry(key, data, None if tokens is None else np.asarray(tokens, dtype=np.int32))
        with self._lock:
            if e.nbytes > self.budget:
                self.stats.refused += 1
                return False
            old = self._entries.pop(key, None)
            if old is not None:
                self.used -= old.nbytes
            while self._entries and self.used + e.nbytes > self.budget:
                gone_key, gone = self._entries.popitem(last=False)
                self.used -= gone.nbytes
                self.stats.evictions += 1
                if self.disk is not None:
                    self.disk.remove(gone_key)
            self._entries[key] = e
            self.used += e.nbytes
            self.stats.stores += 1
            if self.disk is not None:  # queued in order, after the removals above
                self.disk.write(key, data, e.tokens)
            return True

    def entries(self, prefix: tuple) -> Iterator[Entry]:
        """A snapshot of the entries whose key starts with `prefix` (most recently used last)."""
        with self._lock:
            found = [e for k, e in self._entries.items() if k[: len(prefix)] == prefix]
        return iter(found)

    def clear(self) -> None:
        with self._lock:
            if self.disk is not None:
                for key in self._entries:
                    self.disk.remove(key)
            self._entries.clear()
            self.used = 0

    def summary(self) -> dict[str, Any]:
        out = {"budget_bytes": self.budget, "used_bytes": self.used, "entries": len(self._entries),
               **self.stats.as_dict()}
        if self.disk is not None:
            out["disk"] = self.disk.summary()
        return out


# --- the speculator's window prefixes ----------------------------------------------------------------------


@dataclass
class WindowCacheUse:
    """What one scoring run did with the cache (into the result's spec.cache)."""

    hits: int = 0
    misses: int = 0
    bytes_restored: int = 0
    bytes_saved: int = 0
    restore_ms: float = 0.0
    save_ms: float = 0.0
    #: speculator tokens prefilled by the run (a full hit: only the question tails)
    prefilled_tokens: int = 0
    #: missed windows not saved (policy `repeat`: a one-off document's first sight)
    not_saved: int = 0
    #: of the hits, windows whose prefix was still in the scorer's parallel stream from the question
    #: scored just before (same document and tenant): nothing restored (scoring.py, "Resident windows")
    resident: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "bytes_restored": self.bytes_restored,
                "bytes_saved": self.bytes_saved, "prefilled_tokens": self.prefilled_tokens,
                "not_saved": self.not_saved, "resident": self.resident}


#: which missed windows are saved (EngineOptions.spec_cache_save; module doc "Which windows are saved")
SAVE_POLICIES = ("always", "repeat")
#: policy `repeat`: window keys remembered as seen once (oldest forgotten first; ~300 bytes each)
SEEN_KEYS = 16384


@dataclass
class SpeculatorCache:
    """The speculator's KV of each window's head + document slice, per tenant.

    Engine-level API (the serving loop calls it the same way as the scorer does):
      `key(scope, prefix_tokens, layout)` -> the store key; `lookup(...)` -> the saved state (save_seq) or None;
      `save(...)` after prefilling exactly `prefix_tokens` into a cleared sequence.
    """

    store: StateStore
    numerics: Numerics
    use: WindowCacheUse = field(default_factory=WindowCacheUse)
    #: which missed windows are saved: SAVE_POLICIES (module doc "Which windows are saved")
    policy: str = "always"
    #: policy `repeat`: keys of windows prefilled once and not saved (their next miss saves them)
    _seen: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False)
    #: this run saves every missed window (policy `always`, or a stored document: begin(expect_reuse))
    _save_all: bool = field(default=True, init=False)

    NAMESPACE = "speculator"

    def __post_init__(self) -> None:
        if self.policy not in SAVE_POLICIES:
            raise ValueError(f"spec_cache_save must be {' or '.join(SAVE_POLICIES)}, not {self.policy!r}")

    def key(self, scope: str, prefix_tokens: Sequence[int], layout: str = "single") -> tuple:
        num = self.numerics.key()[:-1] + (layout,)
        return (self.NAMESPACE, *num, scope, len(prefix_tokens), tokens_sha256(prefix_tokens))

    def lookup(self, scope: str, prefix_tokens: Sequence[int], layout: str = "single") -> bytes | np.ndarray | None:
        if not self.store.enabled:
            return None
        e = self.store.get(self.key(scope, prefix_tokens, layout))
        return None if e is None else e.data

    def save(self, scope: str, prefix_tokens: Sequence[int], data: bytes | np.ndarray, layout: str = "single") -> bool:
        return self.store.enabled and self.store.put(self.key(scope, prefix_tokens, layout), data)

    def restore_into(self, ctx, scope: str, prefix_tokens: Sequence[int], seq_id: int = 0,
                     layout: str = "single") -> bool:
        """Restore the saved prefix into sequence `seq_id` of `ctx`; False (nothing done) on a miss."""
        data = self.lookup(scope, prefix_tokens, layout)
        if data is None:
            self.use.misses += 1
            return False
        t0 = time.perf_counter()
        try:
            restore_seq(ctx, data, seq_id)
        except DecodeError:  # no room, or a state this context cannot take: prefill instead
            ctx.seq_rm(seq_id, 0, -1)
            self.use.misses += 1
            return False
        self.use.restore_ms += (time.perf_counter() - t0) * 1000.0
        self.use.hits += 1
        self.use.bytes_restored += len(data)
        return True

    def save_from(self, ctx, scope: str, prefix_tokens: Sequence[int], seq_id: int = 0,
                  layout: str = "single") -> None:
        """Save the prefix just prefilled into sequence `seq_id` of `ctx`, unless the policy leaves it
        (`repeat`: a one-off document's window at its first sight, remembered so the next one saves)."""
        if not self.store.enabled:
            return
        if not self._admit(self.key(scope, prefix_tokens, layout)):
            self.use.not_saved += 1
            return
        t0 = time.perf_counter()
        data = save_seq(ctx, seq_id)
        if self.save(scope, prefix_tokens, data, layout):
            self.use.bytes_saved += len(data)
        self.use.save_ms += (time.perf_counter() - t0) * 1000.0

    def _admit(self, key: tuple) -> bool:
        if self._save_all:
            return True
        if key in self._seen:  # its second sight: a question about it came back
            del self._seen[key]
            return True
        self._seen[key] = None
        while len(self._seen) > SEEN_KEYS:
            self._seen.popitem(last=False)
        return False

    def begin(self, expect_reuse: bool = True) -> WindowCacheUse:
        """A fresh usage record for one run. `expect_reuse`: more questions about this document are
        expected (a stored document): under policy `repeat` its windows are saved at once; False: only
        windows seen before are saved. Policy `always` saves every missed window either way."""
        self.use = WindowCacheUse()
        self._save_all = self.policy == "always" or expect_reuse
        return self.use


def cache_bytes_from_env(default: int = DEFAULT_CACHE_BYTES) -> int:
    raw = os.environ.get("SPECQ_CACHE_BYTES", "").strip()
    if not raw:
        return default
    value = int(float(raw))
    if value < 0:
        raise ValueError("SPECQ_CACHE_BYTES must be >= 0")
    return value


__all__ = ["StateStore", "SpeculatorCache", "Numerics", "WindowCacheUse", "save_seq", "restore_seq", "file_sha256",
           "tokens_sha256", "DEFAULT_CACHE_BYTES", "cache_bytes_from_env", "SAVE_POLICIES"]
