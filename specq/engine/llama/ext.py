"""Hidden states in and out of llama.cpp for the MTP and EAGLE3 drafters.

* Out of the target: llama.cpp's staging header `src/llama-ext.h` (it warns of breaking changes) has
  `llama_set_embeddings_nextn` / `llama_get_embeddings_nextn(_ith)` (the final hidden state of every
  token, "h_nextn"), `llama_set/get_embeddings_layer_inp` (the input of a chosen layer) and
  `llama_model_target_layer_ids(_n)` (the target layers an EAGLE3 head reads). llama-cpp-python does
  not bind them, and the header is C++ without `extern "C"`, so the library exports them under
  Itanium-mangled names: they are looked up here by those (the plain name first, should a later
  llama.cpp add `extern "C"`) and probed once at import, as llama.py does for patch 0002's setter.
  `missing()` names what this build lacks; the drafters are refused with that list.
* Into a drafter: `EmbdBatch` fills a `llama_batch` with both token ids and one embedding row per
  token (the target's hidden state for an MTP block, the fused features for an EAGLE3 decoder), or
  embedding rows only (the EAGLE3 encoder). llama.cpp turns such a batch into its extended batch
  (`llama_batch_compat`: token + `set_embd_token`), the entries common/speculative.cpp builds;
  `llama_batch_ext_set_embd_state` exists but is a stub that returns false in this llama.cpp.

`get_embeddings_layer_inp` aborts the process (GGML_ASSERT) for a layer not switched on, so the
layers switched on are tracked here per context and anything else is refused in Python.
"""

from __future__ import annotations

import llama_cpp  # isort: skip  (before numpy, see llama.py)

import ctypes
from typing import Sequence

import numpy as np

from ...contracts import DecodeError
from .binding import Context, Model, last_log_line

_CTX = "P13llama_context"
_MODEL_CONST = "PK11llama_model"


def _mangled(name: str, *params: str) -> str:
    return f"_Z{len(name)}{name}{''.join(params)}"


def _bind(name: str, params: Sequence[str], argtypes: list, restype) -> object | None:
    lib = llama_cpp.llama_cpp._lib
    for symbol in (name, _mangled(name, *params)):
        try:
            fn = getattr(lib, symbol)
        except AttributeError:
            continue
        fn.argtypes = argtypes
        fn.restype = restype
        return fn
    return None


_c_ctx, _c_model = ctypes.c_void_p, ctypes.c_void_p
_f32p = ctypes.POINTER(ctypes.c_float)

_SET_NEXTN = _bind("llama_set_embeddings_nextn", [_CTX, "b", "b"], [_c_ctx, ctypes.c_bool, ctypes.c_bool], None)
_GET_NEXTN = _bind("llama_get_embeddings_nextn", [_CTX], [_c_ctx], _f32p)
_GET_NEXTN_ITH = _bind("llama_get_embeddings_nextn_ith", [_CTX, "i"], [_c_ctx, ctypes.c_int32], _f32p)
_SET_LAYER_INP = _bind("llama_set_embeddings_layer_inp", [_CTX, "j", "b"],
                       [_c_ctx, ctypes.c_uint32, ctypes.c_bool], None)
_GET_LAYER_INP = _bind("llama_get_embeddings_layer_inp", [_CTX, "j"], [_c_ctx, ctypes.c_uint32], _f32p)
_TARGET_IDS = _bind("llama_model_target_layer_ids", [_MODEL_CONST], [_c_model], ctypes.POINTER(ctypes.c_int32))
_TARGET_IDS_N = _bind("llama_model_target_layer_ids_n", [_MODEL_CONST], [_c_model], ctypes.c_uint32)

_FUNCTIONS = {
    "llama_set_embeddings_nextn": _SET_NEXTN,
    "llama_get_embeddings_nextn": _GET_NEXTN,
    "llama_get_embeddings_nextn_ith": _GET_NEXTN_ITH,
    "llama_set_embeddings_layer_inp": _SET_LAYER_INP,
    "llama_get_embeddings_layer_inp": _GET_LAYER_INP,
    "llama_model_target_layer_ids": _TARGET_IDS,
    "llama_model_target_layer_ids_n": _TARGET_IDS_N,
}

#: what each drafter needs
MTP_NEEDS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith")
EAGLE3_NEEDS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith",
                "llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp", "llama_model_target_layer_ids",
                "llama_model_target_layer_ids_n")


def missing(names: Sequence[str] = tuple(_FUNCTIONS)) -> list[str]:
    """Which of these llama-ext.h functions this llama.cpp build does not export."""
    return [n for n in names if _FUNCTIONS.get(n) is None]


def _require(names: Sequence[str]) -> None:
    lacking = missing(names)
    if lacking:
        raise DecodeError("this llama.cpp build does not export " + ", ".join(lacking) + " (src/llama-ext.h)")


# -------------------------------------------------------------------------------------------------- out


def set_hidden_output(ctx: Context, on: bool = True, *, masked: bool = False) -> None:
    """Make `ctx` emit every token's final hidden state (masked: only tokens with logits).

    Unmasked, llama.cpp runs the last layer over every row of a batch instead of only the rows with
    logits (glm4-moe.cpp, mimo2.cpp: no `inp_out_ids` crop), so it changes that layer's kernels'
    batch sizes: the engine keeps it on for every run of an MTP target, drafting or not.
    """
    _require(["llama_set_embeddings_nextn"])
    _SET_NEXTN(ctx.ptr, bool(on), bool(masked))
    ctx.hidden_output = (bool(on), bool(masked))


def n_embd_out(model: Model) -> int:
    return int(llama_cpp.llama_model_n_embd_out(model.ptr))


def hidden_rows(ctx: Context, rows: Sequence[int]) -> np.ndarray:
    """Copies of the hidden states of rows `rows` of ctx's last batch, shape (len(rows), n_embd_out).

    Unmasked output indexes rows by batch position; masked output by the rows that had logits.
    """
    _require(MTP_NEEDS)
    on, masked = getattr(ctx, "hidden_output", (False, False))
    if not on:
        raise DecodeError("hidden-state output is off for this context (set_hidden_output)")
    width = n_embd_out(ctx.model)
    rows = list(rows)
    if rows and not masked and rows == list(range(rows[0], rows[0] + len(rows))) and rows[0] >= 0:
        base = _GET_NEXTN(ctx.ptr)  # unmasked rows are dense in batch order: one view
        if not base:
            raise DecodeError(f"no hidden states for the last batch: {last_log_line()}")
        flat = np.ctypeslib.as_array(base, shape=((rows[0] + len(rows)) * width,))
        return flat[rows[0] * width:].reshape(len(rows), width).copy()
    out = np.empty((len(rows), width), dtype=np.float32)
    for j, i in enumerate(rows):
        ptr = _GET_NEXTN_ITH(ctx.ptr, int(i))
        if not ptr:
            raise DecodeError(f"no hidden state for row {i} of the last batch: {last_log_line()}")
        out[j] = np.ctypeslib.as_array(ptr, shape=(width,))
    return out


def enable_layer_inputs(ctx: Context, layers: Sequence[int]) -> None:
    """Make `ctx` keep the input of each of these layers for every token of a batch (EAGLE3's features).

    A layer id equal to the model's n_layer is the last layer's output (the final hidden state)."""
    _require(EAGLE3_NEEDS)
    on = set(getattr(ctx, "layer_inputs", ()))
    n_layer = ctx.model.n_layer
    for lid in layers:
        if not 0 <= lid <= n_layer:
            raise DecodeError(f"layer {lid} is outside the target's 0..{n_layer}")
        _SET_LAYER_INP(ctx.ptr, int(lid), True)
        on.add(int(lid))
    ctx.layer_inputs = frozenset(on)


def layer_input_rows(ctx: Context, layer: int, first: int, n: int) -> np.ndarray:
    """Copies of rows first..first+n-1 of `layer`'s input in ctx's last batch, shape (n, n_embd)."""
    if layer not in getattr(ctx, "layer_inputs", ()):
        raise DecodeError(f"layer {layer}'s input is not extracted (enable_layer_inputs)")
    ptr = _GET_LAYER_INP(ctx.ptr, int(layer))
    if not ptr:
        raise DecodeError(f"llama.cpp returned no input for layer {layer}")
    e = ctx.model.n_embd
    flat = np.ctypeslib.as_array(ptr, shape=((first + n) * e,))
    return flat[first * e:].reshape(n, e).copy()


def target_layer_ids(model: Model) -> list[int]:
    """The target layers an EAGLE3 (or DFlash) head reads, from its GGUF (`<arch>.target_layers`)."""
    _require(["llama_model_target_layer_ids", "llama_model_target_layer_ids_n"])
    n = int(_TARGET_IDS_N(model.ptr))
    ptr = _TARGET_IDS(model.ptr)
    return [int(ptr[i]) for i in range(n)] if n and ptr else []


# -------------------------------------------------------------------------------------------------- in


class EmbdBatch:
    """A reusable llama_batch of up to `n_max` entries with an embedding row each (width `n_embd`)."""

    def __init__(self, n_max: int, n_embd: int) -> None:
        self.n_max, self.n_embd = int(n_max), int(n_embd)
        self._cap = 0
        self._grow(min(self.n_max, 64))

    def _grow(self, n: int) -> None:
        """Room for n entries (buffers grow on demand: most drafter batches hold a handful)."""
        if n <= self._cap:
            return
        cap = min(self.n_max, max(n, 2 * self._cap))
        self._tok = np.zeros(cap, dtype=np.int32)
        self._pos = np.zeros(cap, dtype=np.int32)
        self._nseq = np.ones(cap, dtype=np.int32)
        self._seq = np.zeros(cap, dtype=np.int32)
        self._logits = np.zeros(cap, dtype=np.int8)
        self._embd = np.zeros((cap, self.n_embd), dtype=np.float32)
        # entry i's seq_id list is the one-element array at self._seq[i]
        self._seq_addr = (self._seq.ctypes.data + 4 * np.arange(cap, dtype=np.uint64)).astype(np.uint64)
        self._seq_ptrs = (ctypes.POINTER(llama_cpp.llama_seq_id) * cap).from_buffer(self._seq_addr)
        self._cap = cap

    def _batch(self, n: int, with_tokens: bool) -> llama_cpp.llama_batch:
        b = llama_cpp.llama_batch()
        b.n_tokens = n
        b.token = self._tok.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token)) if with_tokens else None
        b.embd = self._embd.ctypes.data_as(_f32p)
        b.pos = self._pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
        b.n_seq_id = self._nseq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b.seq_id = self._seq_ptrs
        b.logits = self._logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        return b

    def _fill(self, positions: Sequence[int], embd: np.ndarray, seq: int, logits: Sequence[bool] | str) -> int:
        n = len(positions)
        if n == 0 or n > self.n_max:
            raise ValueError(f"batch of {n} entries (1..{self.n_max})")
        self._grow(n)
        embd = np.asarray(embd, dtype=np.float32)
        if embd.shape != (n, self.n_embd):
            raise ValueError(f"embedding rows of shape {embd.shape}, expected ({n}, {self.n_embd})")
        self._pos[:n] = positions
        self._seq[:n] = seq
        self._embd[:n] = embd
        if isinstance(logits, str):
            self._logits[:n] = 1 if logits == "all" else 0
            if logits == "last":
                self._logits[n - 1] = 1
        else:
            self._logits[:n] = np.asarray(logits, dtype=np.int8)
        return n

    def decode(self, ctx: Context, tokens: Sequence[int], positions: Sequence[int], embd: np.ndarray, *,
               seq: int = 0, logits: Sequence[bool] | str = "last") -> None:
        """Decode (token, embedding row) pairs at `positions` of sequence `seq` of `ctx`."""
        n = self._fill(positions, embd, seq, logits)
        if len(tokens) != n:
            raise ValueError("tokens and positions differ in length")
        self._tok[:n] = tokens
        ctx.run_decode(self._batch(n, True), self._seq[:n], self._pos[:n], what="llama_decode of a drafter batch")

    def encode(self, ctx: Context, embd: np.ndarray, *, seq: int = 0) -> None:
        """Run ctx's encoder over embedding rows only (an EAGLE3 head's feature fusion); every row is an
        output. The encoder is per token, but llama.cpp still checks positions against the sequence's
        cells: placeholders after its last one (as common/speculative.cpp does)."""
        n = len(embd)
        start = ctx.seq_pos_max(seq) + 1
        self._fill(range(start, start + n), embd, seq, "all")
        ctx.run_decode(self._batch(n, False), self._seq[:n], self._pos[:n], encode=True,
                       what="llama_encode of a drafter batch")


def encoder_output(ctx: Context, n: int, width: int) -> np.ndarray:
    """The first n rows of ctx's hidden-state output after `EmbdBatch.encode` (EAGLE3's fused g)."""
    _require(["llama_get_embeddings_nextn"])
    ptr = _GET_NEXTN(ctx.ptr)
    if not ptr:
        raise DecodeError(f"the encoder produced no output: {last_log_line()}")
    return np.ctypeslib.as_array(ptr, shape=(n * width,)).reshape(n, width).copy()


__all__ = [
    "EAGLE3_NEEDS", "MTP_NEEDS", "EmbdBatch", "enable_layer_inputs", "encoder_output", "hidden_rows",
    "layer_input_rows", "missing", "n_embd_out", "set_hidden_output", "target_layer_ids",
]
