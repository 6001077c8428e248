"""FLOPs of a prefill for a model's shape, and the card's measured F16 matmul peak (issue 50, item 2).

What a prefill of T tokens costs (the LM head is not run: a prefill asks for no logits):

    matmuls   2 × (weights of the blocks' matrices) × T
    attention 4 × n_layer × n_head × head_dim × Σ context(t)   (QKᵀ and AV, 2 FLOPs a multiply-add each)

where context(t) is the number of keys token t attends to: position + 1 in its own sequence (causal,
each window its own sequence from position 0). A prefill is given as spans [start, end) of positions:
a window's tokens, or the part of one a cache did not restore (its tokens still attend to the restored
ones). Norms, biases, RoPE and softmax are left out (under 1% at these shapes).

The shape is read from the GGUF file itself (metadata and tensor shapes, no model loaded), so the same
numbers serve `specq bench ttft` (specq/bench/ttft.py) and bench/gpu/speculator_throughput.py.
`measured_peak` times a dense F16 GEMM with torch on CUDA: what the card does at best on a matmul, the
denominator of `fraction_of_peak`; None where there is no CUDA torch (a CPU host: no fraction).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

#: the peak's GEMM: M = N = K (an 8192³ F16 matmul), timed over REPS after WARMUP
PEAK_SIZE, PEAK_WARMUP, PEAK_REPS = 8192, 3, 20


@dataclass(frozen=True)
class ModelShape:
    n_layer: int
    n_head: int
    head_dim: int
    #: weights of the transformer blocks' matrices (2-D tensors under blk.*): the token embedding is a
    #: lookup and the output head is not run in a prefill
    matmul_params: int

    @property
    def attn_width(self) -> int:
        return self.n_head * self.head_dim


def read_shape(path: str | Path) -> ModelShape:
    """The shape of the GGUF model at `path` (its metadata and tensor sizes; nothing is loaded)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def meta(key: str) -> Any:
        f = r.fields.get(key)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        return v.tobytes().decode() if f.types and f.types[0].name == "STRING" else int(v[0])

    arch = meta("general.architecture")
    n_layer, n_embd, n_head = (meta(f"{arch}.{k}") for k in ("block_count", "embedding_length", "attention.head_count"))
    head_dim = meta(f"{arch}.attention.key_length") or n_embd // n_head
    params = sum(int(t.n_elements) for t in r.tensors
                 if t.name.startswith("blk.") and sum(1 for d in t.shape if d > 1) >= 2)
    return ModelShape(n_layer=n_layer, n_head=n_head, head_dim=head_dim, matmul_params=params)


def prefill_flops(shape: ModelShape, spans: Sequence[tuple[int, int]]) -> float:
    """FLOPs of prefilling positions [start, end) of each span, each in its own causal sequence."""
    tokens = sum(e - s for s, e in spans)
    # Σ over positions p in [s, e) of (p + 1) keys
    keys = sum((e * (e + 1) - s * (s + 1)) // 2 for s, e in spans)
    return 2.0 * shape.matmul_params * tokens + 4.0 * shape.n_layer * shape.attn_width * keys


def measured_peak() -> dict[str, Any] | None:
    """The card's F16 matmul throughput, measured now with torch on CUDA device 0; None without one."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    n = PEAK_SIZE
    a = torch.randn(n, n, dtype=torch.float16, device="cuda")
    b = torch.randn(n, n, dtype=torch.float16, device="cuda")
    for _ in range(PEAK_WARMUP):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(PEAK_REPS):
        a @ b
    torch.cuda.synchronize()
    s = time.perf_counter() - t0
    del a, b
    torch.cuda.empty_cache()
    return {"tflops": PEAK_REPS * 2 * n ** 3 / s / 1e12, "dtype": "float16", "device": torch.cuda.get_device_name(0),
            "method": f"torch {n}x{n} @ {n}x{n} matmul, {PEAK_REPS} timed after {PEAK_WARMUP} warm-ups"}
