"""The speculator's forward in PyTorch: the same GGUF, dequantized, scoring a window like llama.cpp does.

Why (issue 50, item 2): on an H100 the speculator's llama.cpp prefill reached ~14% of the card's F16
throughput; a compact Qwen2 forward with scaled_dot_product_attention may do better, llama.cpp keeping
the target. This module is that forward and the scorer's window procedure on top of it.

Loading: `gguf.GGUFReader` reads the file; every tensor (Q4_K, Q6_K, Q8_0, F16, F32, ...) goes through
`gguf.quants.dequantize` to float32, then to the compute dtype (float32 on the CPU; float16 or bfloat16
on CUDA). The hyper-parameters come from the GGUF metadata (`{arch}.block_count`, head counts, rope freq
base, rms eps; no `output.weight` = tied embeddings). Only the `qwen2` architecture is supported (q/k/v
biases, NEOX RoPE over the whole head): anything else raises UnsupportedSpeculator.

The forward is llama.cpp's qwen2 graph: token embedding; per layer RMSNorm → q/k/v (+bias) → RoPE
(NEOX: dimension i rotates with i + d/2, angle pos·base^(-2i/d)) → causal attention over the KV cache
(GQA: query head j reads KV head j // (n_head / n_head_kv)) → output projection → residual; RMSNorm →
SwiGLU MLP → residual; final RMSNorm and the LM head only where logits are asked for. The KV cache holds
float16 by default, as llama.cpp's (type_k/type_v f16), so the captured keys are rounded alike.

`score_window` is scorer.SpecPrefillScorer._score_window's procedure: prefill all but the window's last
token at positions 0..n-2, then `lookahead` greedy one-token steps (the last prompt token at n-1, then
its own argmax continuation at n, n+1, ... until an end-of-generation token), keeping each step's
post-RoPE queries of every layer and, after the first step, the n prompt keys; the scores are the
scorer's formula (scorer.attention_scores on the CPU, score_torch.tensor_scores on a GPU) × n.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...contracts import ModelError

#: the architectures this forward implements
SUPPORTED_ARCHS = ("qwen2",)


class UnsupportedSpeculator(ModelError):
    """The GGUF is not a model this forward implements (architecture, rope scaling, missing tensors)."""


@dataclass(frozen=True)
class SpeculatorConfig:
    """Hyper-parameters read from a GGUF's metadata."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int  # dimensions RoPE rotates (the whole head for qwen2)
    n_ff: int
    n_vocab: int
    rope_base: float
    rms_eps: float
    tied: bool  # no output.weight: the LM head is token_embd

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.n_head // self.n_head_kv


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v.decode() if isinstance(v, bytes) else v


def read_config(reader) -> SpeculatorConfig:
    """The SpeculatorConfig of an open GGUFReader; UnsupportedSpeculator for what this forward lacks."""
    arch = _field(reader, "general.architecture", "")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedSpeculator(f"the torch speculator implements {', '.join(SUPPORTED_ARCHS)} GGUFs; "
                                    f"this one's architecture is {arch or 'not named'!r} (use speculator_impl llama)")
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None, ""):
        raise UnsupportedSpeculator(f"the torch speculator has no rope scaling ({arch}.rope.scaling.type = {scaling!r})")

    def need(key: str):
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise UnsupportedSpeculator(f"GGUF metadata {arch}.{key} is missing")
        return v

    n_embd, n_head = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head))
    names = {t.name for t in reader.tensors}
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return SpeculatorConfig(
        arch=arch, n_layer=int(need("block_count")), n_embd=n_embd, n_head=n_head,
        n_head_kv=int(_field(reader, f"{arch}.attention.head_count_kv", n_head)), head_dim=head_dim,
        n_rot=int(_field(reader, f"{arch}.rope.dimension_count", head_dim)), n_ff=int(need("feed_forward_length")),
        n_vocab=int(emb.shape[1]), rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(need("attention.layer_norm_rms_epsilon")), tied="output.weight" not in names)


def dequantized(tensor) -> np.ndarray:
    """A GGUF tensor as float32 in numpy order (ggml's ne reversed: a weight is (out, in))."""
    from gguf.quants import dequantize

    shape = tuple(int(x) for x in reversed(tensor.shape))
    return np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)  # a copy: not the mmap


class KVCache:
    """Per layer K and V of one sequence, cell i = position i (like a cleared llama.cpp sequence)."""

    def __init__(self, cfg: SpeculatorConfig, n_cells: int, dtype, device) -> None:
        import torch

        shape = (n_cells, cfg.n_head_kv, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layer)]
        self.n_cells = n_cells


class TorchSpeculator:
    """A GGUF speculator as torch tensors, with the forward and the scorer's window procedure (module doc)."""

    def __init__(self, path: str | Path, *, device: str = "cpu", dtype=None, kv_dtype=None,
                 rope_base: float | None = None) -> None:
        """dtype: compute dtype (float32 on the CPU, float16 on CUDA by default); kv_dtype: the KV cache's
        (float16, as llama.cpp's). rope_base overrides the GGUF's (tests: a wrong base must fail them)."""
        import gguf
        import torch

        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}")
        reader = gguf.GGUFReader(str(self.path))
        cfg = read_config(reader)
        if rope_base is not None:
            cfg = SpeculatorConfig(**{**vars(cfg), "rope_base": float(rope_base)})
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = dtype or (torch.float32 if self.device.type == "cpu" else torch.float16)
        self.kv_dtype = kv_dtype or torch.float16
        tensors = {t.name: t for t in reader.tensors}

        def w(name: str, *, optional: bool = False):
            t = tensors.get(name)
            if t is None:
                if optional:
                    return None
                raise UnsupportedSpeculator(f"{self.path.name} has no tensor {name} (not a {cfg.arch} layout this forward reads)")
            # norms stay float32 (llama.cpp keeps them F32 and normalises in F32)
            dt = torch.float32 if name.endswith("norm.weight") else self.dtype
            return torch.from_numpy(dequantized(t)).to(self.device, dt)

        self.embd = w("token_embd.weight")  # (n_vocab, n_embd)
        self.layers = []
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            self.layers.append({
                "attn_norm": w(p + "attn_norm.weight"), "ffn_norm": w(p + "ffn_norm.weight"),
                "wq": w(p + "attn_q.weight"), "bq": w(p + "attn_q.bias", optional=True),
                "wk": w(p + "attn_k.weight"), "bk": w(p + "attn_k.bias", optional=True),
                "wv": w(p + "attn_v.weight"), "bv": w(p + "attn_v.bias", optional=True),
                "wo": w(p + "attn_output.weight"),
                "wg": w(p + "ffn_gate.weight"), "wu": w(p + "ffn_up.weight"), "wd": w(p + "ffn_down.weight"),
            })
        self.out_norm = w("output_norm.weight")
        self.lm_head = self.embd if cfg.tied else w("output.weight")
        half = cfg.n_rot // 2
        #: RoPE inverse frequencies base^(-2i/n_rot), i < n_rot/2 (float64, then the angles are cast)
        self.inv_freq = torch.tensor([cfg.rope_base ** (-2.0 * i / cfg.n_rot) for i in range(half)], dtype=torch.float64)
        del reader

    # -- the forward ---------------------------------------------------------------------------------
    def _rms(self, x, weight):
        import torch

        x32 = x.to(torch.float32)
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps) * weight).to(self.dtype)

    def _rope(self, x, cos, sin):
        """NEOX rotation of the first n_rot dims of x (T, heads, d): dim i pairs with i + n_rot/2."""
        import torch

        half = self.cfg.n_rot // 2
        x32 = x.to(torch.float32)
        a, b, rest = x32[..., :half], x32[..., half:2 * half], x32[..., 2 * half:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos, rest], dim=-1).to(x.dtype)

    def forward(self, tokens: Sequence[int], start: int, cache: KVCache, *, logits: str = "last",
                keep_q: bool = False):
        """Decode `tokens` at positions start, start+1, ... into `cache` (cells [0, start) already filled).

        Returns (logits, q): logits (n_vocab,) of the last token for "last", (T, n_vocab) for "all", None for
        "none"; q {layer: (T, n_head, head_dim) post-RoPE queries} when keep_q, else {}."""
        import torch
        import torch.nn.functional as F

        cfg = self.cfg
        T = len(tokens)
        end = start + T
        if end > cache.n_cells:
            raise ModelError(f"the torch speculator's cache holds {cache.n_cells} cells, not {end}")
        q_out = {}
        with torch.no_grad():
            ids = torch.as_tensor(list(tokens), dtype=torch.long, device=self.device)
            x = self.embd[ids]  # (T, e)
            pos = torch.arange(start, end, dtype=torch.float64)
            ang = (pos[:, None] * self.inv_freq[None, :]).to(torch.float32)
            cos, sin = ang.cos().to(self.device)[:, None, :], ang.sin().to(self.device)[:, None, :]
            if T == 1 or start == 0:
                mask, causal = None, T > 1
            else:  # a later chunk: its queries see every earlier cell and the chunk's own up to themselves
                qpos = torch.arange(start, end, device=self.device)
                mask, causal = torch.arange(end, device=self.device)[None, :] <= qpos[:, None], False
            for il, L in enumerate(self.layers):
                h = self._rms(x, L["attn_norm"])
                q = F.linear(h, L["wq"], L["bq"]).view(T, cfg.n_head, cfg.head_dim)
                k = F.linear(h, L["wk"], L["bk"]).view(T, cfg.n_head_kv, cfg.head_dim)
                v = F.linear(h, L["wv"], L["bv"]).view(T, cfg.n_head_kv, cfg.head_dim)
                q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
                cache.k[il][start:end] = k.to(self.kv_dtype)
                cache.v[il][start:end] = v.to(self.kv_dtype)
                if keep_q:
                    q_out[il] = q
                K = cache.k[il][:end].to(self.dtype).transpose(0, 1).repeat_interleave(cfg.group, dim=0)
                V = cache.v[il][:end].to(self.dtype).transpose(0, 1).repeat_interleave(cfg.group, dim=0)
                o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], K[None], V[None], attn_mask=mask,
                                                   is_causal=causal, scale=1.0 / math.sqrt(cfg.head_dim))
                x = x + F.linear(o[0].transpose(0, 1).reshape(T, cfg.n_head * cfg.head_dim), L["wo"])
                h = self._rms(x, L["ffn_norm"])
                x = x + F.linear(F.silu(F.linear(h, L["wg"])) * F.linear(h, L["wu"]), L["wd"])
            if logits == "none":
                return None, q_out
            xs = x[-1:] if logits == "last" else x
            out = F.linear(self._rms(xs, self.out_norm), self.lm_head).to(torch.float32)
            return (out[0] if logits == "last" else out), q_out

    def new_cache(self, n_cells: int) -> KVCache:
        return KVCache(self.cfg, n_cells, self.kv_dtype, self.device)

    def prefill(self, tokens: Sequence[int], cache: KVCache, *, call_tokens: int = 0,
                after_call: Callable[[], None] | None = None) -> None:
        """tokens at positions 0..len-1, in calls of at most `call_tokens` (0: one call), after_call() after each."""
        step = call_tokens if call_tokens > 0 else max(1, len(tokens))
        for a in range(0, len(tokens), step):
            self.forward(tokens[a:a + step], a, cache, logits="none")
            if after_call is not None:
                after_call()

    # -- the scorer's window procedure -----------------------------------------------------------------
    def score_window(self, tokens: Sequence[int], lookahead: int, pool: int, *,
                     is_eog: Callable[[int], bool] | None = None, call_tokens: int = 0,
                     after_call: Callable[[], None] | None = None, capture: bool = True,
                     timings: dict[str, float] | None = None) -> np.ndarray:
        """Scores (× number of keys) of every token of one window (module doc). capture=False runs the same
        forward passes and returns ones (the benchmark's overhead baseline). `timings` (ms) gains
        speculator_prefill, lookahead and score_math; after_call's own time is not in speculator_prefill."""
        import torch

        n = len(tokens)
        cache = self.new_cache(n + max(1, lookahead))
        spent = [0.0]

        def after() -> None:
            t = time.perf_counter()
            try:
                after_call()
            finally:
                spent[0] += time.perf_counter() - t

        t0 = time.perf_counter()
        self.prefill(tokens[:-1], cache, call_tokens=call_tokens, after_call=after if after_call else None)
        t1 = time.perf_counter()
        rows: list = []  # per step: {layer: (n_head, d)}
        tok, pos = int(tokens[-1]), n - 1
        for step in range(lookahead):
            logits, q = self.forward([tok], pos, cache, logits="last", keep_q=capture)
            rows.append({il: qq[0] for il, qq in q.items()})
            if step + 1 == lookahead:
                break
            tok, pos = int(torch.argmax(logits)), pos + 1
            if is_eog is not None and is_eog(tok):
                break
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t2 = time.perf_counter()
        if capture:
            scores = self.scores(rows, cache, n, pool) * np.float32(n)
        else:
            scores = np.ones(n, dtype=np.float32)
        t3 = time.perf_counter()
        if timings is not None:
            for name, ms in (("speculator_prefill", (t1 - t0 - spent[0]) * 1000.0), ("lookahead", (t2 - t1) * 1000.0),
                             ("score_math", (t3 - t2) * 1000.0 if capture else 0.0)):
                timings[name] = timings.get(name, 0.0) + ms
        return scores

    def scores(self, rows: Sequence[dict], cache: KVCache, n_keys: int, pool: int) -> np.ndarray:
        """The scorer's formula over keys [0, n_keys): numpy's attention_scores on the CPU (as score_math
        numpy there), score_torch.tensor_scores on the device otherwise (nothing but scores leaves it)."""
        import torch

        layers = range(self.cfg.n_layer)
        if self.device.type == "cpu":
            from .scorer import attention_scores  # (here: the forward itself needs no llama_cpp)

            q_rows = [{il: row[il].to(torch.float32).numpy() for il in layers} for row in rows]
            k = {il: cache.k[il][:n_keys].to(torch.float32).numpy() for il in layers}
            return attention_scores(q_rows, k, n_keys, pool)
        from .score_torch import tensor_scores

        Q = torch.stack([torch.stack([row[il] for row in rows]) for il in layers])  # (L, S, h, d)
        return tensor_scores(Q, [(lambda il=il: cache.k[il][:n_keys]) for il in layers], pool)


__all__ = ["TorchSpeculator", "SpeculatorConfig", "KVCache", "UnsupportedSpeculator", "read_config", "dequantized",
           "SUPPORTED_ARCHS"]
