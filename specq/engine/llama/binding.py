"""A thin, checked layer over llama-cpp-python's low-level API: models, contexts, batches, KV cache.

Why not `llama_cpp.Llama`: it cannot prefill at chosen positions, cannot draft with a second model,
and allocates n_ctx × n_vocab logits. Here every `llama_decode` return code is checked and a failure
raises DecodeError carrying llama.cpp's own last log line.

Our patches, bound here (each probed at import; a stock wheel lacks them):
* 0001 `llama_set_position_jumps`: a context built with `position_gaps=True` accepts forward jumps
  in positions (sparse prefill at original positions); every other context keeps the stock checks.
* 0002 `llama_set_eval_callback`: the graph eval callback switched on and off on a live context.
* 0003 `llama_set_stop` / `llama_set_stop_deadline`: a per-context flag and deadline read in C by the
  context's abort callback, which `Context.stop` (engine/llama/stop.py) drives.
"""

from __future__ import annotations

# llama_cpp before numpy: on the GPU machine, numpy first made model loading segfault.
import llama_cpp  # isort: skip

import collections
import ctypes
import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...contracts import DecodeError, JobTimeLimit, ModelError
from .stop import Stop, current as current_stop
from .token_memo import TokenMemo

# --------------------------------------------------------------------------------------------------
# logging: llama.cpp writes to stderr by default; keep its recent lines to quote in error messages

_LOG_LINES: collections.deque[str] = collections.deque(maxlen=64)
_LOG_LOCK = threading.Lock()
_VERBOSE = os.environ.get("SPECQ_LLAMA_LOG", "") not in ("", "0")
_GGML_LOG_LEVEL_WARN = 3


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    line = (text or b"").decode("utf-8", errors="replace")
    if _VERBOSE:
        os.write(2, line.encode())
    if level >= _GGML_LOG_LEVEL_WARN and line.strip():
        with _LOG_LOCK:
            _LOG_LINES.append(line.strip())


_BACKEND_READY = False
#: the variable ggml's CUDA backend reads (its presence, not its value) at its first graph
CUDA_GRAPHS_ENV = "GGML_CUDA_DISABLE_GRAPHS"
#: the CUDA-graph setting this process's first engine asked for (None: not yet decided)
_CUDA_GRAPHS: bool | None = None


def set_cuda_graphs(enabled: bool) -> bool:
    """Turn ggml's CUDA graphs on or off for this process (EngineOptions.cuda_graphs); returns the
    setting in force. ggml reads the environment once, at the first graph it computes, so only the
    first call decides: a later engine in the same process asking otherwise keeps the first one's
    setting (and gets a log line saying so)."""
    global _CUDA_GRAPHS
    if _CUDA_GRAPHS is None:
        _CUDA_GRAPHS = bool(enabled)
        if _CUDA_GRAPHS:
            os.environ.pop(CUDA_GRAPHS_ENV, None)
        else:
            os.environ[CUDA_GRAPHS_ENV] = "1"
    elif _CUDA_GRAPHS != bool(enabled):
        logging.getLogger(__name__).warning(
            "CUDA graphs stay %s: ggml read the setting at this process's first engine", "on" if _CUDA_GRAPHS else "off")
    return _CUDA_GRAPHS


def init_backend() -> None:
    """Once per process: quiet logging, backend init."""
    global _BACKEND_READY
    if _BACKEND_READY:
        return
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _BACKEND_READY = True


def last_log_line() -> str:
    with _LOG_LOCK:
        return _LOG_LINES[-1] if _LOG_LINES else ""


def clear_log() -> None:
    with _LOG_LOCK:
        _LOG_LINES.clear()


def backend_name() -> str:
    """'cuda', 'metal', … when the build can offload, else 'cpu'."""
    if not llama_cpp.llama_supports_gpu_offload():
        return "cpu"
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("cuda", "metal", "vulkan", "hip", "sycl"):
        if any(lib_dir.glob(f"*ggml-{name}*")):
            return name
    return "gpu"


def library_version() -> str:
    return getattr(llama_cpp, "__version__", "unknown")


def _bind_patch(name: str, argtypes: list, restype=None):
    """A function our patches add to libllama, or None on a build without it."""
    try:
        fn = getattr(llama_cpp.llama_cpp._lib, name)
    except AttributeError:
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


_SET_POSITION_JUMPS = _bind_patch("llama_set_position_jumps", [ctypes.c_void_p, ctypes.c_bool])
_SET_STOP = _bind_patch("llama_set_stop", [ctypes.c_void_p, ctypes.c_bool])
_SET_STOP_DEADLINE = _bind_patch("llama_set_stop_deadline", [ctypes.c_void_p, ctypes.c_int64])


def can_abort_in_c() -> bool:
    """Whether this build has patch 0003's per-context stop (a cancel cuts a running llama_decode)."""
    return _SET_STOP is not None and _SET_STOP_DEADLINE is not None


# --------------------------------------------------------------------------------------------------


class Model:
    """A loaded GGUF model and its vocabulary."""

    def __init__(self, path: str | Path, *, n_gpu_layers: int = -1, repack: bool = True, load_mtp: bool = False,
                 main_gpu: int = -1) -> None:
        """repack: let llama.cpp repack weights into its CPU-specific layouts (extra buffer types). Their
        kernels differ by batch size (gemv below 4 tokens, gemm above), so logits of one token depend
        on how many tokens were decoded with it (see EngineOptions.repack). load_mtp: also load the
        model's multi-token-prediction (NextN) blocks, if it has any (llama_ext.py, drafters_mtp.py).
        main_gpu >= 0: the whole model (and its contexts' KV caches) on that visible device (split mode
        none); -1: llama.cpp's default placement (layers split over the visible devices). Ignored by a
        CPU-only build."""
        init_backend()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}")
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 999
        params.use_extra_bufts = bool(repack)
        self.repack = bool(repack)
        params.load_mtp = bool(load_mtp)
        #: the device the model is pinned to (-1: not pinned)
        self.main_gpu = int(main_gpu) if main_gpu >= 0 and llama_cpp.llama_supports_gpu_offload() else -1
        if self.main_gpu >= 0:
            params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_NONE
            params.main_gpu = self.main_gpu
        self.load_mtp = bool(load_mtp)
        self.n_gpu_layers = n_gpu_layers if llama_cpp.llama_supports_gpu_offload() else 0
        clear_log()
        self.ptr = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.ptr:
            raise ModelError(f"llama.cpp could not load {self.path}: {last_log_line() or 'not a GGUF model?'}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self.ptr))
        self.n_layer = int(llama_cpp.llama_model_n_layer(self.ptr))
        self.n_head = int(llama_cpp.llama_model_n_head(self.ptr))
        self.n_head_kv = int(llama_cpp.llama_model_n_head_kv(self.ptr))
        self.n_embd = int(llama_cpp.llama_model_n_embd(self.ptr))
        #: NextN/MTP blocks after the trunk (0: none); usable only when loaded with load_mtp
        self.n_layer_nextn = int(llama_cpp.llama_model_n_layer_nextn(self.ptr))
        arch = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, b"general.architecture", arch, len(arch))
        self.arch = arch.value.decode("utf-8", errors="replace") if n > 0 else ""
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        tmpl = llama_cpp.llama_model_chat_template(self.ptr, None)
        self.chat_template: bytes | None = tmpl or None
        self._vocab_sig: str | None = None
        self.token_memo = TokenMemo()

    # -- tokens ------------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """A long text's tokens are remembered (token_memo.py: a stored document's next question)."""
        return self.token_memo.tokens(text, add_special, parse_special,
                                       lambda: self._tokenize(text, add_special, parse_special))

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise ModelError("tokenization failed")
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def pieces(self, tokens: Sequence[int]) -> list[bytes]:
        """token_bytes of each token (a vocabulary-bounded cache: a long document repeats its tokens)."""
        cache = self.__dict__.setdefault("_piece_cache", {})
        out = []
        for t in tokens:
            b = cache.get(t)
            if b is None:
                b = cache[t] = self.token_bytes(t)
            out.append(b)
        return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def vocab_signature(self) -> str:
        """A hash of every token's text: two models with equal signatures share token ids."""
        if self._vocab_sig is None:
            h = hashlib.sha256(str(self.n_vocab).encode())
            for t in range(self.n_vocab):
                h.update(llama_cpp.llama_vocab_get_text(self.vocab, t) or b"")
                h.update(b"\x00")
            self._vocab_sig = h.hexdigest()
        return self._vocab_sig

    def apply_chat_template(self, messages: list[tuple[str, str]], *, add_assistant: bool = True) -> str | None:
        """Render messages with the model's template (llama.cpp's built-in renderer); None if it has none."""
        if not self.chat_template:
            return None
        keep = [(r.encode(), c.encode()) for r, c in messages]
        chat = (llama_cpp.llama_chat_message * len(keep))()
        for i, (r, c) in enumerate(keep):
            chat[i].role = r
            chat[i].content = c
        size = sum(len(c) for _, c in keep) * 2 + 1024
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(self.chat_template, chat, len(keep), add_assistant, buf, size)
            if n < 0:
                return None  # template not supported by llama.cpp's built-in renderer
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n + 1
        return None

    def close(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


#: KV cache element types by name (ggml type ids)
KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}


class Context:
    """A llama context with one reusable batch, checked decoding and KV cache editing."""

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int,
        n_batch: int = 2048,
        n_ubatch: int = 512,
        n_threads: int = 0,
        flash_attn: bool = True,
        n_seq_max: int = 1,
        kv_unified: bool = True,
        cb_eval: object | None = None,
        type_k: str = "f16",
        ctx_type: int = 0,
        ctx_other: "Context | None" = None,
        position_gaps: bool = False,
        call_tokens: int = 0,
    ) -> None:
        """kv_unified=False gives each of the n_seq_max sequences its own stream of n_ctx / n_seq_max
        cells: a sequence then attends over its own cells only (no masked pass over the others').
        type_k: the K cache's element type (f16, q8_0); q8_0 keeps llama.cpp's CPU flash attention on
        one code path for every batch size (see specq/engine/llama/invariance.py). ctx_type: llama.cpp's
        context type (LLAMA_CONTEXT_TYPE_MTP runs the model's MTP blocks); ctx_other: the context an
        EAGLE3 head borrows the target's token embedding / output projection from.
        position_gaps: accept forward jumps in positions (patch 0001; `self.position_gaps` says whether
        this build could), else llama.cpp's stock checks. call_tokens: the most tokens one llama_decode
        call of a prefill gets (0 = n_batch); the run's `stop` is checked between calls."""
        self.model = model
        self.n_ctx = int(n_ctx)
        self.n_batch = max(1, min(int(n_batch), self.n_ctx))
        self.n_ubatch = max(1, min(int(n_ubatch), self.n_batch))
        self.n_seq_max = n_seq_max
        self.flash_attn = flash_attn
        threads = n_threads or (os.cpu_count() or 1)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self.n_ctx
        params.n_batch = self.n_batch
        params.n_ubatch = self.n_ubatch
        params.n_seq_max = n_seq_max
        params.kv_unified = kv_unified
        if type_k not in KV_TYPES:
            raise ValueError(f"unsupported K cache type {type_k!r} (known: {', '.join(KV_TYPES)})")
        params.type_k = KV_TYPES[type_k]
        #: the numerics this context was built with (recorded by benchmarks: specq/bench/provenance.py)
        self.type_k, self.n_threads = type_k, threads
        self.type_v = next((name for name, v in KV_TYPES.items() if v == params.type_v), str(params.type_v))
        params.n_threads = threads
        params.n_threads_batch = threads
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.no_perf = False
        params.ctx_type = int(ctx_type)
        if ctx_other is not None:
            params.ctx_other = ctx_other.ptr
        self._ctx_other = ctx_other  # the borrowed weights' context must outlive this one
        self._cb_eval = cb_eval  # keep the ctypes callback alive as long as the context
        if cb_eval is not None:
            params.cb_eval = cb_eval
            params.cb_eval_user_data = None
        clear_log()
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise ModelError(f"could not create a llama context (n_ctx {self.n_ctx}): {last_log_line()}")
        self.mem = llama_cpp.llama_get_memory(self.ptr)
        #: whether this context accepts gaps in positions (asked for, and this build has patch 0001)
        self.position_gaps = bool(position_gaps) and _SET_POSITION_JUMPS is not None
        if self.position_gaps:
            _SET_POSITION_JUMPS(self.ptr, True)
        #: tokens per llama_decode call of a prefill (a "none"/"last" logits batch)
        self.call_tokens = max(1, min(int(call_tokens) or self.n_batch, self.n_batch))
        #: this context's Stop (else the one of the thread's `stop.running` block, as Engine.run sets):
        #: checked before every call, and read in C during one through patch 0003's abort callback
        self.stop: Stop | None = None
        if _SET_STOP_DEADLINE is not None:
            _SET_STOP_DEADLINE(self.ptr, -1)  # installs the C abort callback (no deadline, flag clear)
        self.aborted_calls = 0
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, n_seq_max)
        b = self._batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))
        self._logits = np.ctypeslib.as_array(ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(self.n_batch,))
        self._seq_rows = [np.ctypeslib.as_array(b.seq_id[i], shape=(n_seq_max,)) for i in range(self.n_batch)]

    # -- decoding ----------------------------------------------------------------------------------
    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        *,
        seq_ids: Sequence[int] | int = 0,
        logits: str | Sequence[bool] = "last",
        after_call: Callable[[], None] | None = None,
    ) -> None:
        """Decode tokens at the given positions (split into batches of at most n_batch).

        logits: "last" (only the very last token), "all", "none", or a per-token mask. After the call,
        `logits_row(i)` reads the i-th output row of the final batch. A "last"/"none" batch goes in
        calls of at most `call_tokens` tokens, any other in calls of n_batch.
        after_call: run after each llama_decode call this makes, the last one included (the serving
        loop decodes other jobs on another context there, engine/scoring/scorer.py); it must not touch this
        context's cells, and an exception from it ends the decode (the calls already made stay).
        """
        n = len(tokens)
        if n != len(positions):
            raise ValueError("tokens and positions differ in length")
        if n == 0:
            return
        toks = np.asarray(tokens, dtype=np.int32)
        pos = np.asarray(positions, dtype=np.int32)
        seqs = np.full(n, seq_ids, dtype=np.int32) if isinstance(seq_ids, int) else np.asarray(seq_ids, dtype=np.int32)
        if isinstance(logits, str):
            mask = np.zeros(n, dtype=np.int8)
            if logits == "last":
                mask[-1] = 1
            elif logits == "all":
                mask[:] = 1
            elif logits != "none":
                raise ValueError(f"bad logits spec {logits!r}")
        else:
            mask = np.asarray(logits, dtype=np.int8)
        step = self.call_tokens if isinstance(logits, str) and logits in ("last", "none") else self.n_batch
        for start in range(0, n, step):
            end = min(start + step, n)
            self._decode_one(toks[start:end], pos[start:end], seqs[start:end], mask[start:end])
            if after_call is not None:
                after_call()

    def _decode_one(self, toks: np.ndarray, pos: np.ndarray, seqs: np.ndarray, mask: np.ndarray) -> None:
        m = len(toks)
        self._tok[:m] = toks
        self._pos[:m] = pos
        self._nseq[:m] = 1
        self._logits[:m] = mask
        for i in range(m):
            self._seq_rows[i][0] = seqs[i]
        self._batch.n_tokens = m
        self.run_decode(self._batch, seqs, pos)

    def run_decode(self, batch: llama_cpp.llama_batch, seqs: Sequence[int], pos: Sequence[int], *,
                   encode: bool = False, what: str = "llama_decode") -> None:
        """llama_decode (or llama_encode) of a filled batch, under the run's stop.

        Before the call `stop` is checked and its deadline handed to C; during it `Stop.cancel()` may
        trip the flag. An aborted call (2) leaves the cache as before it: every cell the call wrote
        is removed (llama.cpp removes only the aborted ubatch's), then the stop's reason is raised."""
        stop = self.stop or current_stop()
        if stop is not None:
            stop.check()
            if _SET_STOP_DEADLINE is not None:
                left = stop.remaining()
                _SET_STOP_DEADLINE(self.ptr, -1 if left is None else max(0, int(left * 1e6)))
            stop.enter(self)
        clear_log()
        try:
            rc = (llama_cpp.llama_encode if encode else llama_cpp.llama_decode)(self.ptr, batch)
        finally:
            if stop is not None:
                stop.leave(self)
                if _SET_STOP is not None:
                    _SET_STOP(self.ptr, False)
                    _SET_STOP_DEADLINE(self.ptr, -1)
        if rc == 2:
            self.aborted_calls += 1
            self._forget(seqs, pos)
            why = stop.reason() if stop is not None else None
            if why is None and stop is not None and stop.deadline is not None:
                why = JobTimeLimit(stop.limit_message)  # C's clock passed the deadline a hair before ours
            if why is not None:
                raise why
        if rc != 0:
            reason = {1: "no KV cache slot (context full)", 2: "aborted"}.get(rc, "error")
            detail = last_log_line()
            raise DecodeError(f"{what} returned {rc} ({reason})" + (f": {detail}" if detail else ""))

    def _forget(self, seqs: Sequence[int], pos: Sequence[int]) -> None:
        """Remove what an aborted call wrote: each of its sequences from its first position on."""
        first: dict[int, int] = {}
        for s_, p in zip(np.asarray(seqs).tolist(), np.asarray(pos).tolist()):
            if s_ not in first or p < first[s_]:
                first[s_] = p
        for s_, p in first.items():
            llama_cpp.llama_memory_seq_rm(self.mem, s_, p, -1)

    def trip_stop(self) -> None:
        """Make a running llama_decode on this context end (any thread; patch 0003)."""
        if _SET_STOP is not None and getattr(self, "ptr", None):
            _SET_STOP(self.ptr, True)

    def logits_row(self, i: int = -1) -> np.ndarray:
        """A copy of the logits of token i of the last batch decoded (-1: the last token with logits).

        The token must have been decoded with its logits flag set.
        """
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise DecodeError(f"no logits for token {i} of the last batch")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    def synchronize(self) -> None:
        """Wait until the device has finished the last decode (before reading its memory directly)."""
        llama_cpp.llama_synchronize(self.ptr)

    # -- KV cache ----------------------------------------------------------------------------------
    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> None:
        """Remove cells of seq_id with positions in [p0, p1) (p1 = -1: to the end)."""
        if not llama_cpp.llama_memory_seq_rm(self.mem, seq_id, p0, p1):
            raise DecodeError(f"could not remove positions [{p0}, {p1}) of sequence {seq_id} from the KV cache")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Copy sequence src's cells with positions in [p0, p1) to sequence dst. Between two KV streams
        (one per slot) llama.cpp copies only whole streams (p0 = p1 = -1): dst's cells become src's, and
        the buffer copy (on the device where the cache lives) runs at the next llama_decode."""
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_pos_max(self, seq_id: int = 0) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq_id))

    def close(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


# --------------------------------------------------------------------------------------------------


def _bind_set_eval_callback():
    """`llama_set_eval_callback` from our patch (patches/0002), or None on a stock build."""
    try:
        fn = llama_cpp.llama_cpp._lib.llama_set_eval_callback
    except AttributeError:
        return None
    fn.argtypes = [ctypes.c_void_p, llama_cpp.ggml_backend_sched_eval_callback, ctypes.c_void_p]
    fn.restype = None
    return fn


_SET_EVAL_CALLBACK = _bind_set_eval_callback()
_NO_CALLBACK = ctypes.cast(None, llama_cpp.ggml_backend_sched_eval_callback)


def can_toggle_eval_callback() -> bool:
    return _SET_EVAL_CALLBACK is not None


def set_eval_callback(ctx: "Context", callback: object | None) -> bool:
    """Install (or with None remove) a context's eval callback; False if this build cannot."""
    if _SET_EVAL_CALLBACK is None:
        return False
    _SET_EVAL_CALLBACK(ctx.ptr, callback if callback is not None else _NO_CALLBACK, None)
    return True


_GAPS_SUPPORTED: dict[bool, bool] = {}


def supports_position_gaps(model: Model) -> bool:
    """Probe (once per process) whether a context asking for gaps (`position_gaps=True`) accepts
    forward jumps in positions. Our patched build does; a stock wheel refuses with "positions are
    not continuous"."""
    key = _SET_POSITION_JUMPS is not None
    if key not in _GAPS_SUPPORTED:
        ctx = Context(model, n_ctx=64, n_batch=8, n_ubatch=8, n_threads=1, position_gaps=True)
        try:
            t = model.tokenize("ab") or [0, 0]
            ok = True
            try:
                ctx.decode([t[0], t[-1]], [0, 2], logits="none")  # a gap inside one batch
                ctx.decode([t[0]], [7], logits="none")  # a jump past the cache's last position
            except DecodeError:
                ok = False
            _GAPS_SUPPORTED[key] = ok and ctx.seq_pos_max(0) == 7
        finally:
            ctx.close()
    return _GAPS_SUPPORTED[key]
