"""Score math on the speculator's own device, through PyTorch, reading the K cache in place.

Why: on the H200 the host-side score math (copy every layer's K cache to the host, f16 → f32,
softmax, pooling in numpy) took 1.4 s at 32K tokens — 2.4× the speculator's own forward passes.
Here the capture keeps each layer's K-cache view as a TensorRef (address, shape, strides) and
PyTorch wraps that memory where it lies (CUDA array interface on a GPU, a numpy view on the host):
only the lookahead queries (a few KB) travel to the device and one float per token comes back.

The formula is scoring.attention_scores' (tests compare the two): softmax(q·Kᵀ/√d) in float32 per
(layer, head, lookahead row) → average pool (zero 'same' padding) → max over layers × heads → mean
over rows. Layers are batched in chunks bounded in memory (a 4K-token window: all layers in one go).
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ...contracts import EngineError

if TYPE_CHECKING:  # only a type here: the torch speculator's forward runs where llama_cpp is not installed
    from ..llama.capture import TensorRef


_PROBE = """
import llama_cpp, sys
import torch
sys.exit(0 if (not GPU or torch.cuda.is_available()) else 3)
"""


@functools.lru_cache(maxsize=None)
def available(gpu: bool) -> str | None:
    """None if the torch path can run (on a GPU when `gpu`), else why not.

    Probed in a subprocess first, in this process's import order (llama_cpp, then torch): on one
    machine PyTorch brought an older libstdc++ and importing it after llama.cpp crashed the process
    with a segmentation fault, which no try/except here could catch.
    """
    try:
        probe = subprocess.run([sys.executable, "-c", f"GPU = {bool(gpu)}" + _PROBE], capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return f"could not probe PyTorch ({e})"
    if probe.returncode == 3:
        return "PyTorch has no CUDA device"
    if probe.returncode != 0:
        tail = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        if probe.returncode < 0:
            return (f"importing PyTorch after llama_cpp crashed a test process (signal {-probe.returncode}); a library "
                    "conflict, e.g. an older libstdc++ brought by PyTorch: LD_PRELOAD the system's libstdc++.so.6")
        return f"PyTorch not importable: {tail[0][:200]}"
    return None


class _CudaArray:
    """Just enough of the CUDA array interface for torch.as_tensor to wrap device memory."""

    def __init__(self, ref: TensorRef) -> None:
        self.__cuda_array_interface__ = {
            "shape": ref.shape,
            "typestr": np.dtype(ref.dtype).str,
            "data": (ref.data, False),
            "strides": ref.strides,
            "version": 3,
        }


def as_tensor(ref: TensorRef, device: int = 0):
    """A torch view of the referenced memory (no copy); `device`: the CUDA device holding it."""
    import torch

    if ref.host:
        return torch.from_numpy(ref.numpy())
    return torch.as_tensor(_CudaArray(ref), device=f"cuda:{device}")


def avg_pool(x, kernel: int):
    """scoring.avg_pool in torch: stride 1, zero 'same' padding, divided by `kernel`."""
    import torch

    if kernel <= 1:
        return x
    pad = kernel // 2
    c = torch.cumsum(torch.nn.functional.pad(x, (pad + 1, pad)), dim=-1)
    return (c[..., kernel:] - c[..., :-kernel]) / kernel


def attention_scores(
    q_rows: Sequence[dict[int, np.ndarray]], k: dict[int, TensorRef], n_keys: int, pool: int, stream: int = 0,
    device: int = 0,
) -> np.ndarray:
    """Token importance over n_keys keys, like scoring.attention_scores.

    q_rows[s][il]: (n_head, head_dim) query of lookahead row s in layer il (host arrays).
    k[il]: TensorRef of layer il's K-cache view, shape (n_stream, n_kv, n_head_kv, head_dim).
    stream: the KV stream holding the keys, at cells 0..n_keys-1.
    device: the CUDA device the K cache lies on (the speculator's, EngineOptions.speculator_gpu).
    """
    import torch

    layers = sorted(k)
    if not layers or not q_rows:
        raise EngineError("scoring captured no attention tensors from the speculator")
    K0 = as_tensor(k[layers[0]], device)
    if K0.device.type == "cpu" and torch.get_num_threads() > 1:
        # on the host, torch's spinning OpenMP workers would steal the cores llama.cpp's threads use
        torch.set_num_threads(1)
    Q = torch.from_numpy(np.stack([np.stack([row[il] for row in q_rows]) for il in layers])).to(K0.device, torch.float32)
    keys = [lambda: K0] + [functools.partial(as_tensor, k[il], device) for il in layers[1:]]
    return tensor_scores(Q, [(lambda f=f: f()[stream, :n_keys]) for f in keys], pool)


def tensor_scores(Q, keys: Sequence, pool: int) -> np.ndarray:
    """The score formula on torch tensors already on one device (attention_scores' core; also the
    torch speculator's, torch_speculator.py, whose queries and keys never leave the device).

    Q: (L, S, n_head, d) lookahead queries of L layers; keys[i](): layer i's prompt keys (n, n_head_kv, d),
    any float dtype (a callable, so a chunk of layers is read only when it is scored)."""
    import torch

    L, S, h, d = Q.shape
    Q = Q.to(torch.float32)
    best = None
    with torch.no_grad():
        K0 = keys[0]()
        n, g = K0.shape[0], K0.shape[1]
        r = h // g
        # layers in chunks, so one chunk's probabilities stay under ~256 MB (a 4K window: all 24 at once)
        per_chunk = max(1, (64 << 20) // max(1, g * S * r * (n + pool)))
        for c0 in range(0, L, per_chunk):
            c1 = min(L, c0 + per_chunk)
            Ks = [K0 if i == 0 else keys[i]() for i in range(c0, c1)]  # (n, g, d) each
            Kc = torch.stack(Ks).to(torch.float32).permute(0, 2, 3, 1)  # (l, g, d, n)
            Qc = Q[c0:c1].reshape(-1, S, g, r, d).permute(0, 2, 1, 3, 4).reshape(-1, g, S * r, d)
            probs = torch.softmax(torch.matmul(Qc, Kc) * (1.0 / math.sqrt(d)), dim=-1)  # (l, g, S*r, n)
            per_row = avg_pool(probs, pool).reshape(-1, g, S, r, n).amax(dim=(0, 1, 3))  # (S, n)
            best = per_row if best is None else torch.maximum(best, per_row)
        return best.mean(dim=0).cpu().numpy().astype(np.float32)
