"""Random-weight GGUFs for the MTP and EAGLE3 drafters: a GLM-4.5-style target with a multi-token-
prediction block, a Qwen3 target and an EAGLE3 head for it — layouts this repo's llama.cpp loads.

No trained MTP or EAGLE3 weights are reachable here, so correctness and cost are tested on random
weights of the real layouts (acceptance rates of real weights are not measured):

* `glm4moe` (llama.cpp's GLM-4.5 architecture, `src/models/glm4-moe.cpp`): an attention-only trunk
  (no recurrent layers, so a rejected draft rolls back with seq_rm) whose first
  `n_layer_dense_lead` layers are dense and the rest mixture-of-experts, followed by one NextN/MTP
  block (`blk.{n_layer}.nextn.*` + attention + a small MoE with one shared expert), which llama.cpp
  loads only with `load_mtp` and runs in a context of type `LLAMA_CONTEXT_TYPE_MTP`. `GLM_SHAPES`:
  `tiny` (dense trunk, 4 small experts in the MTP block) for tests, `small` (12 layers, 8 experts) for
  CPU cost runs; `glm45-air-8e` for the GPU cost
  benchmark — GLM-4.5-Air's hyperparameters (46 layers, 4096 wide, 96/8 heads of 128, partial RoPE,
  8 of 1,408-wide routed experts + 1 shared per token, 1 MTP block) with 8 routed experts in the file
  instead of 128, so every token's active path has the real size (≈12B active parameters, a 27 GB
  F16 file instead of 212 GB). A verification batch then reads the same 8 experts for all its tokens;
  in the real model its tokens may route to up to 8 × k different experts, so verification there
  costs more than measured here.
* `qwen3` (`src/models/qwen3.cpp`, which extracts the layer inputs EAGLE3 reads; qwen2.cpp does not):
  `QWEN3_SHAPES` `tiny`, `small` (CPU cost runs) and `8b` (Qwen3-8B's hyperparameters).
* `eagle3` (`src/models/eagle3.cpp`): one decoder layer over [token embedding, fused target
  features], `fc` fusing the inputs of 3 target layers (`eagle3.target_layers`). Written without its
  own token embedding, as converted EAGLE3 heads for Llama-3.1-8B are, so it borrows the target's
  through `ctx_other`. `EAGLE3_SHAPES` `tiny`, `small` and `8b` (a Qwen3-8B head), one per qwen3 shape.

Weights follow synthetic.py's scheme (seeded per tensor name, branch outputs scaled 1/sqrt(2L),
logits std ~3). Command line: ``python -m specq.testing.synthetic_archs --arch glm4moe --shape tiny
--out t.gguf``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .synthetic import TensorSpec, kv_value, vocab_kvs, write_gguf

#: llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (GLM-4.5's router)
_GATING_SIGMOID = 2


@dataclass(frozen=True)
class Glm4MoeShape:
    """A GLM-4.5-style target: `n_layer` trunk layers + `n_nextn` MTP blocks (llama.cpp's names)."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    #: rotary dimensions per head (GLM-4.5: half the head)
    n_rot: int
    #: the dense layers' FFN width
    n_ff: int
    #: the first this many trunk layers are dense, the rest (and the MTP block) mixture-of-experts
    n_layer_dense_lead: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_expert_shared: int = 1
    n_nextn: int = 1
    n_ctx: int = 32768
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-5

    def validate(self) -> None:
        problems = []
        if min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.head_dim, self.n_ff, self.n_expert,
               self.n_expert_used, self.n_ff_exp, self.n_ctx) < 1:
            problems.append("sizes must be >= 1")
        if self.n_head % max(1, self.n_head_kv):
            problems.append("n_head must be a multiple of n_head_kv")
        if self.n_rot > self.head_dim or self.n_rot % 2:
            problems.append("n_rot must be even and <= head_dim")
        if self.n_expert_used > self.n_expert:
            problems.append("n_expert_used must be <= n_expert")
        if not 0 <= self.n_layer_dense_lead <= self.n_layer:
            problems.append("n_layer_dense_lead must be in [0, n_layer]")
        if self.n_nextn != 1 or self.n_expert_shared < 1:
            problems.append("llama.cpp's glm4moe MTP graph needs exactly 1 MTP block with a shared expert")
        if problems:
            raise ValueError("bad glm4moe shape: " + "; ".join(problems))


@dataclass(frozen=True)
class Qwen3Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx: int = 32768
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6


@dataclass(frozen=True)
class Eagle3Shape:
    """An EAGLE3 head: one decoder layer of width n_embd reading 3 layers of a target n_embd_tgt wide."""

    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_embd_tgt: int
    target_layers: tuple[int, int, int]
    n_ctx: int = 32768
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6


GLM_SHAPES: dict[str, Glm4MoeShape] = {
    "tiny": Glm4MoeShape(n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head_dim=32, n_rot=16, n_ff=256,
                         n_layer_dense_lead=4, n_expert=4, n_expert_used=2, n_ff_exp=64),
    # for CPU cost runs: 12 layers, the MTP block ~1/12 of the trunk as in GLM-4.5-Air (1 of 46 + the head)
    "small": Glm4MoeShape(n_layer=12, n_embd=512, n_head=8, n_head_kv=2, head_dim=64, n_rot=32, n_ff=1536,
                          n_layer_dense_lead=1, n_expert=8, n_expert_used=2, n_ff_exp=384),
    # GLM-4.5-Air (zai-org/GLM-4.5-Air config.json) with 8 instead of 128 routed experts in the file
    "glm45-air-8e": Glm4MoeShape(n_layer=46, n_embd=4096, n_head=96, n_head_kv=8, head_dim=128, n_rot=64,
                                 n_ff=10944, n_layer_dense_lead=1, n_expert=8, n_expert_used=8, n_ff_exp=1408,
                                 n_ctx=131072),
}

QWEN3_SHAPES: dict[str, Qwen3Shape] = {
    "tiny": Qwen3Shape(n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head_dim=32, n_ff=256),
    "small": Qwen3Shape(n_layer=12, n_embd=512, n_head=8, n_head_kv=2, head_dim=64, n_ff=1536),
    "8b": Qwen3Shape(n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=12288, n_ctx=40960),
}

EAGLE3_SHAPES: dict[str, Eagle3Shape] = {
    "tiny": Eagle3Shape(n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_embd_tgt=128, target_layers=(1, 2, 3)),
    "small": Eagle3Shape(n_embd=512, n_head=8, n_head_kv=2, n_ff=1536, n_embd_tgt=512, target_layers=(2, 6, 9)),
    # the EAGLE3 recipe's low/mid/high layers (2, L/2, L-3) of Qwen3-8B
    "8b": Eagle3Shape(n_embd=4096, n_head=32, n_head_kv=8, n_ff=12288, n_embd_tgt=4096, target_layers=(2, 18, 33),
                      n_ctx=40960),
}

_EMB_STD = 0.02
_LOGIT_STD = 3.0


def _w(name: str, rows: int, cols: int, wdtype: np.dtype, std: float) -> TensorSpec:
    return TensorSpec(name, (rows, cols), wdtype, std)


def _ones(name: str, n: int, value: float = 1.0) -> TensorSpec:
    return TensorSpec(name, (n,), np.dtype(np.float32), 0.0, const=value)


def _attn(p: str, e: int, n_q: int, n_kv: int, wdtype: np.dtype, branch: float, *, bias: bool) -> list[TensorSpec]:
    f32 = np.dtype(np.float32)
    out = [
        _w(p + "attn_q.weight", n_q, e, wdtype, 1.0 / np.sqrt(e)),
        _w(p + "attn_k.weight", n_kv, e, wdtype, 1.0 / np.sqrt(e)),
        _w(p + "attn_v.weight", n_kv, e, wdtype, 1.0 / np.sqrt(e)),
        _w(p + "attn_output.weight", e, n_q, wdtype, branch / np.sqrt(n_q)),
    ]
    if bias:
        out += [TensorSpec(p + "attn_q.bias", (n_q,), f32, 0.1), TensorSpec(p + "attn_k.bias", (n_kv,), f32, 0.1),
                TensorSpec(p + "attn_v.bias", (n_kv,), f32, 0.1)]
    return out


def _dense_ffn(p: str, e: int, ff: int, wdtype: np.dtype, branch: float, suffix: str = "") -> list[TensorSpec]:
    return [
        _w(p + f"ffn_gate{suffix}.weight", ff, e, wdtype, 1.0 / np.sqrt(e)),
        _w(p + f"ffn_up{suffix}.weight", ff, e, wdtype, 1.0 / np.sqrt(e)),
        _w(p + f"ffn_down{suffix}.weight", e, ff, wdtype, branch / np.sqrt(ff)),
    ]


def _moe_ffn(p: str, s: Glm4MoeShape, wdtype: np.dtype, branch: float) -> list[TensorSpec]:
    e, x, ffx = s.n_embd, s.n_expert, s.n_ff_exp
    f32 = np.dtype(np.float32)
    return [
        _w(p + "ffn_gate_inp.weight", x, e, f32, 1.0 / np.sqrt(e)),
        TensorSpec(p + "exp_probs_b.bias", (x,), f32, 0.0, const=0.0),
        TensorSpec(p + "ffn_gate_exps.weight", (x, ffx, e), wdtype, 1.0 / np.sqrt(e)),
        TensorSpec(p + "ffn_up_exps.weight", (x, ffx, e), wdtype, 1.0 / np.sqrt(e)),
        TensorSpec(p + "ffn_down_exps.weight", (x, e, ffx), wdtype, branch / np.sqrt(ffx)),
    ] + _dense_ffn(p, e, ffx * s.n_expert_shared, wdtype, branch, "_shexp")


def glm4moe_plan(s: Glm4MoeShape, n_vocab: int, wdtype: np.dtype) -> list[TensorSpec]:
    e, L = s.n_embd, s.n_layer
    n_q, n_kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    branch = 1.0 / np.sqrt(2.0 * L)
    plan = [_w("token_embd.weight", n_vocab, e, wdtype, _EMB_STD)]
    for i in range(L + s.n_nextn):
        p = f"blk.{i}."
        plan += [_ones(p + "attn_norm.weight", e), _ones(p + "post_attention_norm.weight", e)]
        plan += _attn(p, e, n_q, n_kv, wdtype, branch, bias=True)
        if i < s.n_layer_dense_lead:
            plan += _dense_ffn(p, e, s.n_ff, wdtype, branch)
        else:
            plan += _moe_ffn(p, s, wdtype, branch)
        if i >= L:  # the NextN/MTP block: [enorm(token embedding), hnorm(target hidden)] -> eh_proj
            plan += [_ones(p + "nextn.enorm.weight", e), _ones(p + "nextn.hnorm.weight", e),
                     _w(p + "nextn.eh_proj.weight", e, 2 * e, wdtype, 1.0 / np.sqrt(2 * e))]
    plan += [_ones("output_norm.weight", e), _w("output.weight", n_vocab, e, wdtype, _LOGIT_STD / np.sqrt(e))]
    return plan


def qwen3_plan(s: Qwen3Shape, n_vocab: int, wdtype: np.dtype) -> list[TensorSpec]:
    e, L = s.n_embd, s.n_layer
    n_q, n_kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    branch = 1.0 / np.sqrt(2.0 * L)
    plan = [_w("token_embd.weight", n_vocab, e, wdtype, _EMB_STD)]
    for i in range(L):
        p = f"blk.{i}."
        plan += [_ones(p + "attn_norm.weight", e), _ones(p + "ffn_norm.weight", e),
                 _ones(p + "attn_q_norm.weight", s.head_dim), _ones(p + "attn_k_norm.weight", s.head_dim)]
        plan += _attn(p, e, n_q, n_kv, wdtype, branch, bias=False)
        plan += _dense_ffn(p, e, s.n_ff, wdtype, branch)
    plan += [_ones("output_norm.weight", e), _w("output.weight", n_vocab, e, wdtype, _LOGIT_STD / np.sqrt(e))]
    return plan


def eagle3_plan(s: Eagle3Shape, n_vocab: int, wdtype: np.dtype) -> list[TensorSpec]:
    e = s.n_embd
    hd = e // s.n_head
    n_q, n_kv = s.n_head * hd, s.n_head_kv * hd
    n_in = 3 * s.n_embd_tgt
    branch = 1.0 / np.sqrt(2.0)
    p = "blk.0."
    return [
        _w("fc.weight", e, n_in, wdtype, 1.0 / np.sqrt(n_in)),
        _ones(p + "attn_norm.weight", e), _ones(p + "attn_norm_2.weight", e), _ones(p + "ffn_norm.weight", e),
        _w(p + "attn_q.weight", n_q, 2 * e, wdtype, 1.0 / np.sqrt(2 * e)),
        _w(p + "attn_k.weight", n_kv, 2 * e, wdtype, 1.0 / np.sqrt(2 * e)),
        _w(p + "attn_v.weight", n_kv, 2 * e, wdtype, 1.0 / np.sqrt(2 * e)),
        _w(p + "attn_output.weight", e, n_q, wdtype, branch / np.sqrt(n_q)),
        *_dense_ffn(p, e, s.n_ff, wdtype, branch),
        _ones("output_norm.weight", e),
        _w("output.weight", n_vocab, e, wdtype, _LOGIT_STD / np.sqrt(e)),
    ]


def _common(w: Any, arch: str, *, n_ctx: int, n_embd: int, n_block: int, n_ff: int, n_head: int, n_head_kv: int,
            rope_theta: float, rms_eps: float) -> None:
    w.add_uint32(f"{arch}.context_length", int(n_ctx))
    w.add_uint32(f"{arch}.embedding_length", int(n_embd))
    w.add_uint32(f"{arch}.block_count", int(n_block))
    w.add_uint32(f"{arch}.feed_forward_length", int(n_ff))
    w.add_uint32(f"{arch}.attention.head_count", int(n_head))
    w.add_uint32(f"{arch}.attention.head_count_kv", int(n_head_kv))
    w.add_float32(f"{arch}.rope.freq_base", float(rope_theta))
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(rms_eps))


ARCHS = ("glm4moe", "qwen3", "eagle3")
SHAPE_TABLES = {"glm4moe": GLM_SHAPES, "qwen3": QWEN3_SHAPES, "eagle3": EAGLE3_SHAPES}


def write_arch_gguf(
    path: str | os.PathLike[str],
    arch: str,
    shape: str | Any = "tiny",
    *,
    vocab: str | os.PathLike[str] = "bytes",
    seed: int = 0,
    dtype: str = "f16",
    name: str | None = None,
    **overrides: Any,
) -> Path:
    """Write a random-weight `arch` model ("glm4moe", "qwen3" or "eagle3") of a named shape (or a
    shape object) with field overrides; returns the path."""
    if arch not in SHAPE_TABLES:
        raise ValueError(f"unknown architecture {arch!r} (known: {', '.join(ARCHS)})")
    table = SHAPE_TABLES[arch]
    if isinstance(shape, str):
        if shape not in table:
            raise ValueError(f"unknown {arch} shape {shape!r} (known: {', '.join(table)})")
        spec = table[shape]
    else:
        spec = shape
    fields = {f.name for f in dataclasses.fields(spec)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown shape override(s): {', '.join(unknown)} (known: {', '.join(sorted(fields))})")
    spec = dataclasses.replace(spec, **{k: v for k, v in overrides.items() if v is not None})
    if isinstance(spec, Glm4MoeShape):
        spec.validate()
    if dtype not in ("f16", "f32"):
        raise ValueError(f"dtype must be 'f16' or 'f32', got {dtype!r}")
    wdtype = np.dtype(np.float16 if dtype == "f16" else np.float32)
    kvs = vocab_kvs(vocab)
    n_vocab = len(kv_value(kvs, "tokenizer.ggml.tokens"))

    def metadata(w: Any) -> None:
        s = spec
        if arch == "glm4moe":
            _common(w, arch, n_ctx=s.n_ctx, n_embd=s.n_embd, n_block=s.n_layer + s.n_nextn, n_ff=s.n_ff,
                    n_head=s.n_head, n_head_kv=s.n_head_kv, rope_theta=s.rope_theta, rms_eps=s.rms_eps)
            w.add_uint32(f"{arch}.attention.key_length", s.head_dim)
            w.add_uint32(f"{arch}.attention.value_length", s.head_dim)
            w.add_uint32(f"{arch}.rope.dimension_count", s.n_rot)
            w.add_uint32(f"{arch}.expert_count", s.n_expert)
            w.add_uint32(f"{arch}.expert_used_count", s.n_expert_used)
            w.add_uint32(f"{arch}.expert_shared_count", s.n_expert_shared)
            w.add_uint32(f"{arch}.expert_feed_forward_length", s.n_ff_exp)
            w.add_uint32(f"{arch}.leading_dense_block_count", s.n_layer_dense_lead)
            w.add_float32(f"{arch}.expert_weights_scale", 1.0)
            w.add_bool(f"{arch}.expert_weights_norm", True)
            w.add_uint32(f"{arch}.expert_gating_func", _GATING_SIGMOID)
            w.add_uint32(f"{arch}.nextn_predict_layers", s.n_nextn)
        elif arch == "qwen3":
            _common(w, arch, n_ctx=s.n_ctx, n_embd=s.n_embd, n_block=s.n_layer, n_ff=s.n_ff, n_head=s.n_head,
                    n_head_kv=s.n_head_kv, rope_theta=s.rope_theta, rms_eps=s.rms_eps)
            w.add_uint32(f"{arch}.attention.key_length", s.head_dim)
            w.add_uint32(f"{arch}.attention.value_length", s.head_dim)
        else:
            _common(w, arch, n_ctx=s.n_ctx, n_embd=s.n_embd, n_block=1, n_ff=s.n_ff, n_head=s.n_head,
                    n_head_kv=s.n_head_kv, rope_theta=s.rope_theta, rms_eps=s.rms_eps)
            w.add_array(f"{arch}.target_layers", [int(x) for x in s.target_layers])
            w.add_uint32(f"{arch}.target_hidden_size", s.n_embd_tgt)

    plan = {"glm4moe": glm4moe_plan, "qwen3": qwen3_plan, "eagle3": eagle3_plan}[arch](spec, n_vocab, wdtype)
    shape_label = shape if isinstance(shape, str) else "custom"
    vocab_label = vocab if isinstance(vocab, str) and vocab in ("bytes", "bytes-alt") else Path(vocab).name
    return write_gguf(path, arch, plan, kvs, metadata, seed=seed, dtype=dtype,
                      name=name or f"specq-synthetic-{arch}-{shape_label}", shape_label=str(shape_label),
                      vocab_label=str(vocab_label))


def estimate_arch_bytes(arch: str, shape: str, *, n_vocab: int, dtype: str = "f16") -> int:
    """Bytes of tensor data `write_arch_gguf` would write for a named shape."""
    spec = SHAPE_TABLES[arch][shape]
    wdtype = np.dtype(np.float16 if dtype == "f16" else np.float32)
    plan = {"glm4moe": glm4moe_plan, "qwen3": qwen3_plan, "eagle3": eagle3_plan}[arch](spec, n_vocab, wdtype)
    return sum(t.nbytes for t in plan)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specq.testing.synthetic_archs",
                                     description="Write a random-weight glm4moe (MTP), qwen3 or eagle3 GGUF.")
    parser.add_argument("--arch", required=True, choices=ARCHS)
    parser.add_argument("--shape", default="tiny")
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocab", default="bytes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="f16", choices=["f16", "f32"])
    parser.add_argument("--n-ctx", dest="n_ctx", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        out = write_arch_gguf(args.out, args.arch, args.shape, vocab=args.vocab, seed=args.seed, dtype=args.dtype,
                              n_ctx=args.n_ctx)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
