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
    """Per layer K and V of `batch` sequences, (batch, n_cells, n_head_kv, head_dim): row b, cell i = sequence
    b's position i (like cleared llama.cpp sequences, one per window)."""

    def __init__(self, cfg: SpeculatorConfig, n_cells: int, dtype, device, batch: int = 1) -> None:
        import torch

        shape = (batch, n_cells, cfg.n_head_kv, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layer)]
        self.n_cells = n_cells
        self.batch = batch


def _sdpa_has_gqa() -> bool:
    """Whether this torch's scaled_dot_product_attention takes enable_gqa (2.5 on): then K/V are not repeated."""
    import torch

    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 5)


#: look-ahead graphs kept per speculator (one per window count × cell count; each holds its own KV cache)
GRAPHS_KEPT = 4
#: on CUDA a batch's cells are rounded up to this, so questions of other lengths reuse one captured graph
CELL_ROUND = 256


class _LookaheadGraph:
    """One CUDA graph of a look-ahead step for `batch` windows of up to `n_cells` cells (why: a step of a 0.5B
    model is ~500 small kernels, and launching them from Python took ~18 ms per step on an H100; replayed, a
    step costs its kernels' time). The graph owns its static inputs (token, position per window), its KV
    cache and its outputs (the step's queries of every layer, the next greedy token)."""

    def __init__(self, spec: "TorchSpeculator", batch: int, n_cells: int) -> None:
        import torch

        self.cache = spec.new_cache(n_cells, batch=batch)
        dev = spec.device
        self.tok = torch.zeros(batch, dtype=torch.long, device=dev)
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)
        self.q = torch.zeros((spec.cfg.n_layer, batch, spec.cfg.n_head, spec.cfg.head_dim), dtype=spec.dtype, device=dev)
        self.spec = spec
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up (allocations happen outside the capture); its writes are overwritten
            self._step()
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self._step()

    def _step(self) -> None:
        logits, q = self.spec._step_all(self.tok, self.pos, self.cache)
        self.q.copy_(q)
        self.tok.copy_(logits.argmax(dim=-1))
        self.pos.add_(1)

    def replay(self) -> None:
        self.graph.replay()


def unsupported(path: str | Path) -> str | None:
    """None if this forward implements the GGUF at `path` (its metadata read, no weights loaded), else why not."""
    try:
        import gguf

        read_config(gguf.GGUFReader(str(path)))
    except UnsupportedSpeculator as e:
        return str(e)
    except (ImportError, OSError, ValueError, StopIteration) as e:
        return f"could not read {Path(path).name} for the torch forward ({type(e).__name__}: {e})"
    return None


class TorchSpeculator:
    """A GGUF speculator as torch tensors, with the forward and the scorer's window procedure (module doc)."""

    def __init__(self, path: str | Path, *, device: str = "cpu", dtype=None, kv_dtype=None,
                 rope_base: float | None = None, graphs: bool | None = None) -> None:
        """dtype: compute dtype (float32 on the CPU, float16 on CUDA by default); kv_dtype: the KV cache's
        (float16, as llama.cpp's). rope_base overrides the GGUF's (tests: a wrong base must fail them).
        graphs: replay the look-ahead steps as CUDA graphs (default: on CUDA; a capture that fails turns
        them off for this speculator and the steps run eagerly)."""
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
        self.graphs = (self.device.type == "cuda") if graphs is None else bool(graphs and self.device.type == "cuda")
        #: why graphs were turned off (a failed capture), else ""
        self.graphs_off = ""
        self._graphs: dict[tuple[int, int], _LookaheadGraph] = {}
        self._gqa = _sdpa_has_gqa()
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
        self.inv_freq = torch.tensor([cfg.rope_base ** (-2.0 * i / cfg.n_rot) for i in range(half)], dtype=torch.float64,
                                     device=self.device)
        del reader

    # -- the forward ---------------------------------------------------------------------------------
    def _rms(self, x, weight):
        import torch

        x32 = x.to(torch.float32)
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps) * weight).to(self.dtype)

    def _rope(self, x, cos, sin):
        """NEOX rotation of the first n_rot dims of x (B, T, heads, d): dim i pairs with i + n_rot/2."""
        import torch

        half = self.cfg.n_rot // 2
        x32 = x.to(torch.float32)
        a, b, rest = x32[..., :half], x32[..., half:2 * half], x32[..., 2 * half:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos, rest], dim=-1).to(x.dtype)

    def _attend(self, q, K, V, mask, causal: bool):
        """q (B, h, T, d) over K/V (B, h_kv, S, d): SDPA, grouped-query natively where torch has it."""
        import torch.nn.functional as F

        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        if self._gqa:
            return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
        g = self.cfg.group
        return F.scaled_dot_product_attention(q, K.repeat_interleave(g, dim=1), V.repeat_interleave(g, dim=1),
                                              attn_mask=mask, is_causal=causal, scale=scale)

    def _blocks(self, x, cos, sin, cache: KVCache, rows: slice, write, keys: int, mask, causal: bool,
                keep_q: bool, layers: range | None = None):
        """`layers` (default all) over hidden states x (B, T, n_embd) of cache rows `rows`: write(il, k, v)
        stores the new K/V, attention reads cells [0, keys) under mask/causal. Returns the hidden states
        after them and the queries {layer: (B, T, n_head, d)} when keep_q."""
        import torch.nn.functional as F

        cfg = self.cfg
        B, T = x.shape[:2]
        q_out = {}
        for il in layers if layers is not None else range(cfg.n_layer):
            L = self.layers[il]
            h = self._rms(x, L["attn_norm"])
            q = F.linear(h, L["wq"], L["bq"]).view(B, T, cfg.n_head, cfg.head_dim)
            k = F.linear(h, L["wk"], L["bk"]).view(B, T, cfg.n_head_kv, cfg.head_dim)
            v = F.linear(h, L["wv"], L["bv"]).view(B, T, cfg.n_head_kv, cfg.head_dim)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            write(il, k.to(self.kv_dtype), v.to(self.kv_dtype))
            if keep_q:
                q_out[il] = q
            K = cache.k[il][rows, :keys].to(self.dtype).transpose(1, 2)
            V = cache.v[il][rows, :keys].to(self.dtype).transpose(1, 2)
            o = self._attend(q.transpose(1, 2), K, V, mask, causal)  # (B, h, T, d)
            x = x + F.linear(o.transpose(1, 2).reshape(B, T, cfg.n_head * cfg.head_dim), L["wo"])
            h = self._rms(x, L["ffn_norm"])
            x = x + F.linear(F.silu(F.linear(h, L["wg"])) * F.linear(h, L["wu"]), L["wd"])
        return x, q_out

    def _angles(self, pos):
        """cos, sin of RoPE angles for positions `pos` (any shape, long): shape pos.shape + (1, n_rot/2)."""
        import torch

        ang = (pos.to(torch.float64)[..., None] * self.inv_freq).to(torch.float32)
        return ang.cos()[..., None, :], ang.sin()[..., None, :]

    def _logits(self, x):
        import torch
        import torch.nn.functional as F

        return F.linear(self._rms(x, self.out_norm), self.lm_head).to(torch.float32)

    def forward_rows(self, ids, start: int, cache: KVCache, rows: slice, *, logits: str = "last", keep_q: bool = False):
        """Decode ids (B, T) at positions start..start+T-1 into cache rows `rows` (B of them; cells [0, start)
        already filled). Returns (logits, q): logits (B, n_vocab) of the last token for "last", (B, T, n_vocab)
        for "all", None for "none"; q {layer: (B, T, n_head, head_dim) post-RoPE queries} when keep_q, else {}."""
        import torch

        B, T = ids.shape
        end = start + T
        if end > cache.n_cells:
            raise ModelError(f"the torch speculator's cache holds {cache.n_cells} cells, not {end}")
        with torch.no_grad():
            cos, sin = self._angles(torch.arange(start, end, device=self.device))
            if T == 1 or start == 0:
                mask, causal = None, T > 1
            else:  # a later chunk: its queries see every earlier cell and the chunk's own up to themselves
                qpos = torch.arange(start, end, device=self.device)
                mask, causal = torch.arange(end, device=self.device)[None, :] <= qpos[:, None], False

            def write(il, k, v):
                cache.k[il][rows, start:end] = k
                cache.v[il][rows, start:end] = v

            x, q_out = self._blocks(self.embd[ids], cos, sin, cache, rows, write, end, mask, causal, keep_q)
            if logits == "none":
                return None, q_out
            return self._logits(x[:, -1] if logits == "last" else x), q_out

    def forward(self, tokens: Sequence[int], start: int, cache: KVCache, *, logits: str = "last",
                keep_q: bool = False):
        """forward_rows for one sequence (cache row 0): logits (n_vocab,) for "last", (T, n_vocab) for "all";
        q {layer: (T, n_head, head_dim)}."""
        import torch

        ids = torch.as_tensor(list(tokens), dtype=torch.long, device=self.device)[None]
        out, q = self.forward_rows(ids, start, cache, slice(0, 1), logits=logits, keep_q=keep_q)
        return (None if out is None else out[0]), {il: qq[0] for il, qq in q.items()}

    def _step_all(self, tok, pos, cache: KVCache):
        """One look-ahead step of every row of `cache`: token tok[b] at position pos[b] (tensors (B,)).
        Returns the logits (B, n_vocab) and the queries stacked (n_layer, B, n_head, head_dim). Nothing here
        reads a tensor back to the host, so a CUDA graph can hold it."""
        import torch

        B = tok.shape[0]
        cells = cache.n_cells
        cos, sin = self._angles(pos[:, None])  # (B, 1, 1, half)
        mask = (torch.arange(cells, device=self.device)[None, :] <= pos[:, None])[:, None, None, :]  # (B,1,1,cells)
        rows = torch.arange(B, device=self.device)

        def write(il, k, v):
            cache.k[il][rows, pos] = k[:, 0]
            cache.v[il][rows, pos] = v[:, 0]

        with torch.no_grad():
            x, q = self._blocks(self.embd[tok[:, None]], cos, sin, cache, slice(None), write, cells, mask, False, True)
            return self._logits(x[:, -1]), torch.stack([q[il][:, 0] for il in range(self.cfg.n_layer)])

    def new_cache(self, n_cells: int, batch: int = 1) -> KVCache:
        return KVCache(self.cfg, n_cells, self.kv_dtype, self.device, batch)

    def prefill(self, tokens: Sequence[int], cache: KVCache, *, call_tokens: int = 0,
                after_call: Callable[[], None] | None = None) -> None:
        """tokens at positions 0..len-1, in calls of at most `call_tokens` (0: one call), after_call() after each."""
        self.prefill_rows([list(tokens)], cache, slice(0, 1), call_tokens=call_tokens, after_call=after_call)

    def prefill_rows(self, seqs: Sequence[Sequence[int]], cache: KVCache, rows: slice, *, call_tokens: int = 0,
                     after_call: Callable[[], None] | None = None) -> None:
        """Sequences seqs[i] into cache row rows.start + i at positions 0..len-1, together: the shorter ones
        padded at their end (padding sits in cells after a sequence's own, which later steps overwrite or the
        look-ahead's mask hides). after_call() after each call.

        A call is a group of layers over every token of the batch, as many as hold `call_tokens` tokens'
        worth of work (n_layer × call_tokens / tokens of them, at least one; 0: all layers in one call). Why
        layers, not token chunks as llama.cpp's calls: a later token chunk attends through an explicit mask
        (no FlashAttention) and pays every layer's Python and launch overhead again; on an H100 the prefill
        of 32K tokens in 8 windows took 277-331 ms in chunks of 2,048 tokens against 106 ms in one call
        (bench/results/h100-2026-12-07b/). A layer group does the arithmetic of one call, cut between layers."""
        import torch

        longest = max(len(s) for s in seqs)
        if longest == 0:
            return
        ids = torch.zeros((len(seqs), longest), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        ids = ids.to(self.device)
        n_layer, tokens = self.cfg.n_layer, len(seqs) * longest
        per = n_layer if call_tokens <= 0 or tokens <= call_tokens else max(1, n_layer * call_tokens // tokens)
        if longest > cache.n_cells:
            raise ModelError(f"the torch speculator's cache holds {cache.n_cells} cells, not {longest}")

        def write(il, k, v):
            cache.k[il][rows, :longest] = k
            cache.v[il][rows, :longest] = v

        with torch.no_grad():
            cos, sin = self._angles(torch.arange(longest, device=self.device))
            x = self.embd[ids]
            for a in range(0, n_layer, per):
                x, _ = self._blocks(x, cos, sin, cache, rows, write, longest, None, longest > 1, False,
                                    layers=range(a, min(n_layer, a + per)))
                if after_call is not None:
                    after_call()

    # -- the scorer's window procedure -----------------------------------------------------------------
    def score_window(self, tokens: Sequence[int], lookahead: int, pool: int, **kw) -> np.ndarray:
        """score_windows for one window."""
        return self.score_windows([tokens], lookahead, pool, **kw)[0]

    def _batch(self, batch: int, n_cells: int):
        """(cache, graph or None) for `batch` windows of up to n_cells cells: a kept graph of that shape, a new
        one (the oldest dropped past GRAPHS_KEPT), or, without graphs, a fresh cache."""
        if not self.graphs:
            return self.new_cache(n_cells, batch=batch), None
        n_cells = -(-n_cells // CELL_ROUND) * CELL_ROUND
        key = (batch, n_cells)
        g = self._graphs.pop(key, None)
        if g is None:
            while len(self._graphs) >= GRAPHS_KEPT:
                self._graphs.pop(next(iter(self._graphs)))
            try:
                g = _LookaheadGraph(self, batch, n_cells)
            except Exception as e:  # noqa: BLE001 - a capture this torch/driver refuses: eager steps from now on
                self.graphs, self.graphs_off = False, f"{type(e).__name__}: {e}"
                self._graphs.clear()
                return self.new_cache(n_cells, batch=batch), None
        self._graphs[key] = g  # most recent last
        return g.cache, g

    def score_windows(self, windows: Sequence[Sequence[int]], lookahead: int, pool: int, *,
                      is_eog: Callable[[int], bool] | None = None, call_tokens: int = 0,
                      after_call: Callable[[], None] | None = None, capture: bool = True,
                      timings: dict[str, float] | None = None, batch: int = 0) -> list[np.ndarray]:
        """Scores (× number of keys) of every token of each window (module doc). The windows are prefilled
        and stepped together, `batch` at a time (0: all on CUDA, one at a time on the CPU, where batching
        gains nothing); each look-ahead step is one forward of all of them, the greedy tokens stay on the
        device, and a window whose continuation reaches an end-of-generation token keeps only its steps up to
        that one (as one window alone stops there). capture=False runs the same forward passes and returns
        ones (the benchmark's overhead baseline). `timings` (ms) gains speculator_prefill, lookahead and
        score_math; after_call's own time is not in speculator_prefill."""
        per = batch if batch > 0 else self.windows_per_batch(len(windows))
        out: list[np.ndarray] = []
        for g in range(0, len(windows), per):
            out.extend(self._score_group(windows[g:g + per], lookahead, pool, is_eog, call_tokens, after_call,
                                         capture, timings))
        return out

    def windows_per_batch(self, n_windows: int) -> int:
        """How many windows score_windows runs together by default: all on CUDA, one on the CPU."""
        return max(1, n_windows) if self.device.type == "cuda" else 1

    def _score_group(self, windows, lookahead, pool, is_eog, call_tokens, after_call, capture, timings):
        import torch

        ns = [len(w) for w in windows]
        steps = max(1, lookahead)
        cache, graph = self._batch(len(windows), max(ns) + steps)
        spent = [0.0]

        def after() -> None:
            t = time.perf_counter()
            try:
                after_call()
            finally:
                spent[0] += time.perf_counter() - t

        sync = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        t0 = time.perf_counter()
        self.prefill_rows([w[:-1] for w in windows], cache, slice(0, len(windows)), call_tokens=call_tokens,
                          after_call=after if after_call else None)
        sync()
        t1 = time.perf_counter()
        last = torch.as_tensor([int(w[-1]) for w in windows], dtype=torch.long, device=self.device)
        start = torch.as_tensor([n - 1 for n in ns], dtype=torch.long, device=self.device)
        Qs, toks = [], []  # per step: (n_layer, B, n_head, d); the step's greedy tokens (B,)
        if graph is not None:
            graph.tok.copy_(last)
            graph.pos.copy_(start)
            for _ in range(steps):
                graph.replay()
                Qs.append(graph.q.clone())
                toks.append(graph.tok.clone())
        else:
            tok, pos = last, start
            for _ in range(steps):
                logits, q = self._step_all(tok, pos, cache)
                Qs.append(q)
                tok, pos = logits.argmax(dim=-1), pos + 1
                toks.append(tok)
        greedy = torch.stack(toks).cpu().tolist()  # (steps, B): the one read-back of the look-ahead
        sync()
        t2 = time.perf_counter()
        out = []
        for b, n in enumerate(ns):
            used = steps
            if is_eog is not None:  # rows up to the step whose greedy token ends generation
                for s in range(steps - 1):
                    if is_eog(int(greedy[s][b])):
                        used = s + 1
                        break
            if capture:
                Q = torch.stack([Qs[s][:, b] for s in range(used)], dim=1)  # (L, S, h, d)
                out.append(self._window_scores(Q, cache, b, n, pool) * np.float32(n))
            else:
                out.append(np.ones(n, dtype=np.float32))
        t3 = time.perf_counter()
        if timings is not None:
            for name, ms in (("speculator_prefill", (t1 - t0 - spent[0]) * 1000.0), ("lookahead", (t2 - t1) * 1000.0),
                             ("score_math", (t3 - t2) * 1000.0 if capture else 0.0)):
                timings[name] = timings.get(name, 0.0) + ms
        return out

    def _window_scores(self, Q, cache: KVCache, row: int, n_keys: int, pool: int) -> np.ndarray:
        """The scorer's formula for cache row `row`'s keys [0, n_keys) and its queries Q (L, S, h, d): numpy's
        attention_scores on the CPU (as score_math numpy there), score_torch.tensor_scores on the device
        otherwise (nothing but scores leaves it)."""
        import torch

        layers = range(self.cfg.n_layer)
        if self.device.type == "cpu":
            from .scorer import attention_scores  # (here: the forward itself needs no llama_cpp)

            q_rows = [{il: Q[il, s].to(torch.float32).numpy() for il in layers} for s in range(Q.shape[1])]
            k = {il: cache.k[il][row, :n_keys].to(torch.float32).numpy() for il in layers}
            return attention_scores(q_rows, k, n_keys, pool)
        from .score_torch import tensor_scores

        return tensor_scores(Q, [(lambda il=il: cache.k[il][row, :n_keys]) for il in layers], pool)

    def scores(self, rows: Sequence[dict], cache: KVCache, n_keys: int, pool: int) -> np.ndarray:
        """The formula over cache row 0's keys [0, n_keys) for rows[s][layer] (n_head, d) queries."""
        import torch

        Q = torch.stack([torch.stack([row[il] for row in rows]) for il in range(self.cfg.n_layer)])  # (L, S, h, d)
        return self._window_scores(Q, cache, 0, n_keys, pool)


__all__ = ["TorchSpeculator", "SpeculatorConfig", "KVCache", "UnsupportedSpeculator", "read_config", "dequantized",
           "SUPPORTED_ARCHS"]
