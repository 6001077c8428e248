"""Reading llama.cpp graph tensors while the speculator runs (the eval callback).

SpecPrefill needs the speculator's post-RoPE queries of the lookahead steps (`Qcur-{il}`, the ROPE
node of that name) and its K cache (`cache_k_l{il} (view)`). Both exist with flash attention on, so
attention scores are recomputed from them (scoring.py) and flash attention stays on.

llama-cpp-python has no bindings for ggml tensors, so the struct and the few functions needed are
declared here with ctypes against ggml.h of the vendored llama.cpp (0.3.36). `probe_layout()` checks
that copy against the loaded libggml once per process before the first capture (a name, data pointer
and byte size read through the struct must equal ggml_get_name / ggml_get_data / ggml_nbytes, for a
tensor and a view of it), and fails loudly otherwise: a llama.cpp upgrade that moves a field would
else make scoring read garbage. An exception inside the callback (which must not cross into C) is
kept, and the first one is re-raised after the decode (`QKCapture.raise_error`).
"""

from __future__ import annotations

import llama_cpp  # isort: skip  (before numpy)

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...contracts import EngineError, ModelError

GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1


class GgmlTensor(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def _load_ggml_base() -> ctypes.CDLL:
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (lib_dir / name).exists():
            lib = ctypes.CDLL(str(lib_dir / name))
            break
    else:  # pragma: no cover - unusual layouts
        raise OSError(f"libggml-base not found in {lib_dir}")
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_op_name.argtypes = [ctypes.c_int]
    lib.ggml_op_name.restype = ctypes.c_char_p
    lib.ggml_backend_buffer_is_host.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_buffer_is_host.restype = ctypes.c_bool
    # for probe_layout
    lib.ggml_init.argtypes = [GgmlInitParams]
    lib.ggml_init.restype = ctypes.c_void_p
    lib.ggml_free.argtypes = [ctypes.c_void_p]
    lib.ggml_free.restype = None
    lib.ggml_new_tensor_4d.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_int64] * 4
    lib.ggml_new_tensor_4d.restype = ctypes.c_void_p
    lib.ggml_view_2d.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_size_t,
                                 ctypes.c_size_t]
    lib.ggml_view_2d.restype = ctypes.c_void_p
    lib.ggml_set_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_set_name.restype = ctypes.c_void_p
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_get_data.argtypes = [ctypes.c_void_p]
    lib.ggml_get_data.restype = ctypes.c_void_p
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    return lib


class GgmlInitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


_GGML = _load_ggml_base()


def _op_id(name: bytes) -> int:
    for i in range(256):
        got = _GGML.ggml_op_name(i)
        if got == name:
            return i
    raise OSError(f"ggml op {name!r} not found")


GGML_OP_ROPE = _op_id(b"ROPE")
GGML_OP_VIEW = _op_id(b"VIEW")


class CaptureLayoutError(ModelError):
    """capture.py's copy of struct ggml_tensor does not match the loaded libggml."""


def _nbytes(t) -> int:
    """ggml_nbytes of an F32/F16 tensor, from the struct's own ne/nb."""
    item = {GGML_TYPE_F32: 4, GGML_TYPE_F16: 2}.get(t.type, 0)
    return sum((int(t.ne[i]) - 1) * int(t.nb[i]) for i in range(GGML_MAX_DIMS)) + item


def probe_layout(struct: type = None) -> None:
    """Read a real tensor and a view of it through `struct` (default GgmlTensor) and compare with
    libggml's own accessors; raise CaptureLayoutError naming every field that differs."""
    struct = struct or GgmlTensor
    lib = _GGML
    ctx = lib.ggml_init(GgmlInitParams(1 << 16, None, False))
    if not ctx:
        raise CaptureLayoutError("ggml_init failed while probing struct ggml_tensor")
    bad: list[str] = []
    try:
        ne = (3, 5, 7, 2)
        base = lib.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, *ne)
        lib.ggml_set_name(base, b"specq-probe")
        row = 3 * 4
        view = lib.ggml_view_2d(ctx, base, 3, 4, row, row)  # rows 1..4 of the first matrix
        lib.ggml_set_name(view, b"specq-probe-view")
        for label, ptr in (("tensor", base), ("view", view)):
            t = struct.from_address(ptr)
            got = {"name": bytes(t.name), "data": int(t.data or 0), "nbytes": _nbytes(t), "type": int(t.type)}
            want = {"name": lib.ggml_get_name(ptr), "data": int(lib.ggml_get_data(ptr) or 0),
                    "nbytes": int(lib.ggml_nbytes(ptr)), "type": GGML_TYPE_F32}
            bad += [f"{label} {k}: struct reads {got[k]!r}, libggml says {want[k]!r}" for k in want if got[k] != want[k]]
        v = struct.from_address(view)
        if int(v.op) != GGML_OP_VIEW:
            bad.append(f"view op: struct reads {int(v.op)}, expected GGML_OP_VIEW ({GGML_OP_VIEW})")
        if int(v.view_src or 0) != int(base):
            bad.append("view view_src: struct does not read the viewed tensor's address")
        if int(v.view_offs) != row:
            bad.append(f"view view_offs: struct reads {int(v.view_offs)}, expected {row}")
    except (ValueError, TypeError, AttributeError) as e:  # e.g. a struct without a field read here
        bad.append(f"{type(e).__name__}: {e}")
    finally:
        lib.ggml_free(ctx)
    if bad:
        raise CaptureLayoutError(
            "capture.py's struct ggml_tensor does not match this libggml (llama-cpp-python "
            f"{getattr(llama_cpp, '__version__', '?')}): " + "; ".join(bad) + " — update GgmlTensor from ggml.h")


_LAYOUT_CHECKED = False


def check_layout() -> None:
    """probe_layout() once per process (before the first capture)."""
    global _LAYOUT_CHECKED
    if not _LAYOUT_CHECKED:
        probe_layout()
        _LAYOUT_CHECKED = True


def _dtype(t: GgmlTensor) -> type:
    """The numpy type of an F32/F16 tensor (the only types scoring reads)."""
    dtype = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}.get(t.type)
    if dtype is None:
        raise TypeError(f"cannot read ggml tensor {t.name!r} of type {t.type}")
    return dtype


def read_tensor(t: GgmlTensor) -> np.ndarray:
    """Copy a (possibly device-resident) F32/F16 tensor into numpy, shape (ne[3], ne[2], ne[1], ne[0])."""
    dtype = _dtype(t)
    ne = [int(x) for x in t.ne]
    nb = [int(x) for x in t.nb]
    size = sum((ne[i] - 1) * nb[i] for i in range(4)) + np.dtype(dtype).itemsize  # ggml_nbytes
    raw = np.empty(size, dtype=np.uint8)
    _GGML.ggml_backend_tensor_get(ctypes.addressof(t), raw.ctypes.data, 0, size)
    view = np.ndarray(shape=(ne[3], ne[2], ne[1], ne[0]), dtype=dtype, buffer=raw, strides=(nb[3], nb[2], nb[1], nb[0]))
    return np.array(view, dtype=np.float32)


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor's data lies (no copy): valid as long as its buffer is not overwritten.

    For the K cache that is until the cells are removed or the context is used again, so scoring can
    read the window's keys in place after the lookahead (score_torch.py)."""

    data: int  # address in host or device memory
    shape: tuple[int, ...]  # numpy order: (ne[3], ne[2], ne[1], ne[0])
    strides: tuple[int, ...]  # bytes, numpy order
    dtype: str  # "float16" | "float32"
    host: bool  # True: host memory (CPU backend); False: device memory (e.g. CUDA)

    def numpy(self) -> np.ndarray:
        """A numpy view of host memory (no copy)."""
        if not self.host:
            raise TypeError("tensor lies in device memory")
        dt = np.dtype(self.dtype)
        span = sum((n - 1) * st for n, st in zip(self.shape, self.strides)) + dt.itemsize
        raw = (ctypes.c_uint8 * span).from_address(self.data)
        return np.ndarray(shape=self.shape, dtype=dt, buffer=raw, strides=self.strides)


def tensor_ref(t: GgmlTensor) -> TensorRef:
    dtype = _dtype(t).__name__
    buffer = t.buffer
    if not buffer and t.view_src:
        buffer = GgmlTensor.from_address(t.view_src).buffer
    host = bool(_GGML.ggml_backend_buffer_is_host(buffer)) if buffer else True
    ne = [int(x) for x in t.ne]
    nb = [int(x) for x in t.nb]
    return TensorRef(int(t.data), tuple(reversed(ne)), tuple(reversed(nb)), dtype, host)


class QKCapture:
    """The eval callback. Arm it, run a decode, read `q[il]` / `k[il]`.

    - `arm(q=True)`: keep each layer's post-RoPE query of the decoded tokens: q[il] has shape
      (n_tokens, n_head, head_dim).
    - `arm(k=True)`: keep each layer's K cache view: k[il] has shape (n_stream, n_kv, n_head_kv, head_dim)
      (n_stream = 1 for a unified cache; else one per sequence of the batch, cell i = position i).
    - `arm(k="ref")`: keep where each layer's K cache view lies instead (a TensorRef, no copy).
    Disarmed, the callback declines every node at once (its cost is then one Python call per node).
    """

    def __init__(self) -> None:
        self.want_q = False
        self.want_k = False
        self.k_ref = False
        self.also: tuple[bytes, ...] = ()
        self.q: dict[int, np.ndarray] = {}
        self.k: dict[int, np.ndarray] = {}
        self.extra: dict[str, np.ndarray] = {}
        self.calls = 0
        #: the first exception raised inside the callback since the last arm() (raise_error re-raises it)
        self.error: BaseException | None = None
        check_layout()
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)

    def arm(self, *, q: bool = False, k: bool | str = False, also: tuple[bytes, ...] = ()) -> None:
        """Capture queries and/or keys on the next decode; `also`: other node-name prefixes to keep
        (e.g. b"kq_soft_max-" with flash attention off, for tests), into `extra[name]`."""
        self.want_q, self.want_k, self.also = q, bool(k), tuple(also)
        self.k_ref = k == "ref"
        self.q, self.k, self.extra = {}, {}, {}
        self.error = None

    def raise_error(self) -> None:
        """Re-raise the first exception the callback kept during the last decode, if any."""
        if self.error is not None:
            e, self.error = self.error, None
            raise EngineError(f"the capture callback failed: {type(e).__name__}: {e}") from e

    def disarm(self) -> None:
        self.want_q = self.want_k = False
        self.also = ()

    def _on_node(self, tensor_ptr: int, ask: bool, _user: int) -> bool:
        self.calls += 1
        if not (self.want_q or self.want_k or self.also):
            return not ask
        t = GgmlTensor.from_address(tensor_ptr)
        name = t.name
        is_q = self.want_q and name.startswith(b"Qcur-") and t.op == GGML_OP_ROPE
        is_k = self.want_k and name.startswith(b"cache_k_l") and t.op == GGML_OP_VIEW
        is_extra = any(name.startswith(p) for p in self.also)
        if ask:
            return bool(is_q or is_k or is_extra)
        try:
            if is_extra:
                self.extra[name.decode()] = read_tensor(t)
            if is_q:
                il = int(name[5:].split(b" ")[0])
                a = read_tensor(t)  # (1, n_tokens, n_head, head_dim)
                self.q[il] = a[0]
            elif is_k:
                il = int(name[len(b"cache_k_l"):].split(b" ")[0])
                if self.k_ref:
                    self.k[il] = tensor_ref(t)  # shape (n_stream, n_kv, n_head_kv, head_dim)
                else:
                    self.k[il] = read_tensor(t)  # (n_stream, n_kv, n_head_kv, head_dim)
        except Exception as e:  # never let an exception cross into C: kept, re-raised after the decode
            if self.error is None:
                self.error = e
        return True
