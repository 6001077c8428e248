"""Random-weight Qwen2-architecture GGUF models that real llama.cpp loads and runs.

Tests and benchmarks need models with the exact layout of the Qwen2.x family (the architecture of the
Qwen2.5-Coder target/speculator pair) without downloading gigabytes: `write_qwen2_gguf` writes one
with the `gguf` package, using real Qwen2.x hyperparameters (`SHAPES`) or overrides of them.

* Weights come from a seeded numpy Generator, one stream per tensor (seeded from `seed` and the tensor
  name), so two models written with the same seed share every tensor whose name and shape agree:
  a 2-layer "speculator" is the first two layers of a 4-layer "target" with the same seed and width
  (its output projections are scaled for its own depth), which makes their greedy outputs correlated.
* Scales keep activations finite and logits spread out (std about 3), so greedy outputs depend on
  the input.
* Tensors are generated and written in chunks of at most `_CHUNK_ELEMS` elements, so writing the
  7B/14B shapes needs little memory (the file is written to `<path>.part` and renamed when complete).
* Tokenizers: `vocab="bytes"` is a tiny byte-level GPT-2/Qwen2-style BPE vocabulary (the 256 byte
  symbols of GPT-2's byte-to-unicode mapping, id == byte value, a few merges, ChatML special tokens
  and the Qwen2.5 chat template); `vocab="bytes-alt"` is a different one (other merges, other special
  ids, another size) for mismatch tests; a path copies every `tokenizer.*` key of a GGUF file such
  as llama.cpp's `models/ggml-vocab-qwen2.gguf`.

Command line: ``python -m specq.testing.synthetic --shape tiny --out model.gguf [--vocab bytes] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any, Iterator, Sequence

import numpy as np

ARCH = "qwen2"

#: largest number of elements generated at once while writing a tensor
_CHUNK_ELEMS = 1 << 24


@dataclass(frozen=True)
class Qwen2Shape:
    """Hyperparameters of a Qwen2-architecture model (names follow llama.cpp's)."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int = 32768
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    #: no separate output.weight: logits use token_embd (Qwen2.5 0.5B-3B), as llama.cpp does
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_kv(self) -> int:
        return self.head_dim * self.n_head_kv

    def validate(self) -> None:
        problems = []
        for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_ctx"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1")
        if not problems:
            if self.n_embd % self.n_head:
                problems.append(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
            elif self.head_dim % 2:
                problems.append(f"head_dim (n_embd/n_head = {self.head_dim}) must be even for RoPE")
            if self.n_head % self.n_head_kv:
                problems.append(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.rope_theta <= 0 or self.rms_eps <= 0:
            problems.append("rope_theta and rms_eps must be > 0")
        if problems:
            raise ValueError("bad Qwen2 shape: " + "; ".join(problems))


#: real Qwen2.5 hyperparameters (config.json of Qwen/Qwen2.5-*-Instruct), plus a tiny CPU test shape
SHAPES: dict[str, Qwen2Shape] = {
    "tiny": Qwen2Shape(n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=256),
    "0.5b": Qwen2Shape(n_layer=24, n_embd=896, n_head=14, n_head_kv=2, n_ff=4864),
    "1.5b": Qwen2Shape(n_layer=28, n_embd=1536, n_head=12, n_head_kv=2, n_ff=8960),
    "7b": Qwen2Shape(n_layer=28, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944, tie_embeddings=False),
    "14b": Qwen2Shape(n_layer=48, n_embd=5120, n_head=40, n_head_kv=8, n_ff=13824, tie_embeddings=False),
}

SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(Qwen2Shape))

#: the Qwen2.5-Instruct chat template (ChatML with tool calls), as shipped in tokenizer_config.json
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# ---------------------------------------------------------------------------------------------------
# tokenizers


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character mapping (used by Qwen2's tokenizer)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# token types as llama.cpp reads them (gguf.TokenType)
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3

_BYTES_MERGES = ["Ġ t", "h e", "i n", "e r", "Ġ a", "l l", "o n", "r e", "Ġt he"]
_BYTES_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_ALT_MERGES = ["e r", "Ġ s", "o u", "Ġ w", "t h"]
_ALT_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|fim_pad|>"]


@dataclass
class _KV:
    key: str
    value: Any
    vtype: Any  # gguf.GGUFValueType
    sub_type: Any = None


def _byte_vocab(merges: Sequence[str], specials: Sequence[str], *, bos: str, eos: str, eot: str, pad: str) -> list[_KV]:
    from gguf import GGUFValueType as T

    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]  # id == byte value
    for merge in merges:
        left, right = merge.split(" ")
        assert left in tokens and right in tokens, merge
        tokens.append(left + right)
    types = [TOKEN_NORMAL] * len(tokens)
    for special in specials:
        tokens.append(special)
        types.append(TOKEN_CONTROL)
    ids = {t: i for i, t in enumerate(tokens)}
    return [
        _KV("tokenizer.ggml.model", "gpt2", T.STRING),
        _KV("tokenizer.ggml.pre", "qwen2", T.STRING),
        _KV("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
        _KV("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32),
        _KV("tokenizer.ggml.merges", list(merges), T.ARRAY, T.STRING),
        _KV("tokenizer.ggml.bos_token_id", ids[bos], T.UINT32),
        _KV("tokenizer.ggml.eos_token_id", ids[eos], T.UINT32),
        _KV("tokenizer.ggml.eot_token_id", ids[eot], T.UINT32),
        _KV("tokenizer.ggml.padding_token_id", ids[pad], T.UINT32),
        _KV("tokenizer.ggml.add_bos_token", False, T.BOOL),
        _KV("tokenizer.ggml.add_eos_token", False, T.BOOL),
        _KV("tokenizer.chat_template", QWEN25_CHAT_TEMPLATE, T.STRING),
    ]


def _read_gguf_header(path: str | os.PathLike[str], prefix: str = "") -> tuple[list[_KV], dict[str, tuple[tuple[int, ...], int]]]:
    """A GGUF file's metadata pairs whose key starts with `prefix` (strings as bytes), and its tensor
    infos {name: (ggml shape ne0.., ggml type)}.

    A direct parse of the header: gguf's GGUFReader takes tens of seconds on a 150k-token vocabulary.
    """
    import mmap
    import struct

    from gguf import GGUFValueType as T

    scalar_fmt = {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I", T.INT32: "i",
                  T.FLOAT32: "f", T.UINT64: "Q", T.INT64: "q", T.FLOAT64: "d", T.BOOL: "?"}
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        magic, version = struct.unpack_from("<II", buf, 0)
        if magic != 0x46554747 or version < 2:
            raise ValueError(f"{path} is not a GGUF v2+ file")
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
        off = 24

        def read_str() -> bytes:
            nonlocal off
            (n,) = struct.unpack_from("<Q", buf, off)
            off += 8
            out = bytes(buf[off:off + n])
            off += n
            return out

        def read_scalar(vtype: T) -> Any:
            nonlocal off
            fmt = "<" + scalar_fmt[vtype]
            (v,) = struct.unpack_from(fmt, buf, off)
            off += struct.calcsize(fmt)
            return v

        kvs: list[_KV] = []
        for _ in range(n_kv):
            key = read_str().decode("utf-8")
            (raw_type,) = struct.unpack_from("<I", buf, off)
            off += 4
            vtype = T(raw_type)
            sub = None
            if vtype == T.STRING:
                value: Any = read_str()
            elif vtype == T.ARRAY:
                sub_raw, count = struct.unpack_from("<IQ", buf, off)
                off += 12
                sub = T(sub_raw)
                if sub == T.STRING:
                    value = [read_str() for _ in range(count)]
                elif sub in scalar_fmt:
                    fmt = "<" + scalar_fmt[sub] * count
                    value = list(struct.unpack_from(fmt, buf, off))
                    off += struct.calcsize(fmt)
                else:
                    raise ValueError(f"{path}: nested arrays are not supported (key {key})")
            else:
                value = read_scalar(vtype)
            if key.startswith(prefix):
                kvs.append(_KV(key, value, vtype, sub))
        tensors: dict[str, tuple[tuple[int, ...], int]] = {}
        for _ in range(n_tensors):
            tname = read_str().decode("utf-8")
            (n_dims,) = struct.unpack_from("<I", buf, off)
            off += 4
            dims = struct.unpack_from("<" + "Q" * n_dims, buf, off)
            off += 8 * n_dims
            (ttype,) = struct.unpack_from("<I", buf, off)
            off += 4 + 8  # type, offset
            tensors[tname] = (tuple(int(d) for d in dims), int(ttype))
    return kvs, tensors


def _vocab_from_gguf(path: Path) -> list[_KV]:
    """Every tokenizer.* key of a GGUF file (e.g. a llama.cpp vocab-only file), with its GGUF type."""
    from gguf import GGUFValueType as T

    kvs, _ = _read_gguf_header(path, "tokenizer.")
    keys = {kv.key for kv in kvs}
    if "tokenizer.ggml.tokens" not in keys:
        raise ValueError(f"{path} has no tokenizer.ggml.tokens: not a GGUF with a vocabulary")
    if "tokenizer.ggml.add_bos_token" not in keys and kv_value(kvs, "tokenizer.ggml.pre") in (b"qwen2", "qwen2"):
        # Qwen2 tokenizers never add BOS; older vocab-only files leave the key out
        kvs.append(_KV("tokenizer.ggml.add_bos_token", False, T.BOOL))
    return kvs


def kv_value(kvs: Sequence[_KV], key: str) -> Any:
    for kv in kvs:
        if kv.key == key:
            return kv.value
    return None


def vocab_kvs(vocab: str | os.PathLike[str]) -> list[_KV]:
    """The tokenizer key/value pairs for `vocab` ("bytes", "bytes-alt" or a GGUF path)."""
    if isinstance(vocab, str) and vocab == "bytes":
        return _byte_vocab(_BYTES_MERGES, _BYTES_SPECIALS, bos="<|endoftext|>", eos="<|im_end|>",
                           eot="<|im_end|>", pad="<|endoftext|>")
    if isinstance(vocab, str) and vocab == "bytes-alt":
        return _byte_vocab(_ALT_MERGES, _ALT_SPECIALS, bos="<|endoftext|>", eos="<|im_end|>",
                           eot="<|im_end|>", pad="<|fim_pad|>")
    path = Path(vocab)
    if not path.is_file():
        raise ValueError(f"vocab must be 'bytes', 'bytes-alt' or a path to a GGUF file, got {vocab!r}")
    return _vocab_from_gguf(path)


# ---------------------------------------------------------------------------------------------------
# weights


@dataclass
class TensorSpec:
    """One tensor of a model's plan: its values are drawn (or `const`) when the file is written."""

    name: str
    shape: tuple[int, ...]  # numpy order: (rows = ggml ne[1], cols = ggml ne[0])
    dtype: np.dtype
    std: float  # 0 with `const` set: a constant tensor
    const: float | None = None

    @property
    def n_elems(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.n_elems * self.dtype.itemsize


def _tensor_plan(shape: Qwen2Shape, n_vocab: int, wdtype: np.dtype) -> list[TensorSpec]:
    f32 = np.dtype(np.float32)
    e, kv, ff, L = shape.n_embd, shape.n_embd_kv, shape.n_ff, shape.n_layer
    # The embedding is small (std 0.02, as in trained models) next to the residual branches (whose
    # outputs are scaled by 1/sqrt(2L), GPT-2 style, so the stream stays O(1) at any depth): the final
    # state is a random function of the context, not an echo of the last token's embedding (with tied
    # embeddings that echo would make every model greedily repeat its input). Logits have std ~3:
    # through output.weight when untied, through the final norm's gain when tied.
    emb_std = 0.02
    logit_std = 3.0
    branch = 1.0 / np.sqrt(2.0 * L)
    out_norm = logit_std / (emb_std * np.sqrt(e)) if shape.tie_embeddings else 1.0
    plan = [TensorSpec("token_embd.weight", (n_vocab, e), wdtype, emb_std)]
    for i in range(L):
        p = f"blk.{i}."
        plan += [
            TensorSpec(p + "attn_norm.weight", (e,), f32, 0.0, const=1.0),
            TensorSpec(p + "attn_q.weight", (e, e), wdtype, 1.0 / np.sqrt(e)),
            TensorSpec(p + "attn_q.bias", (e,), f32, 0.1),
            TensorSpec(p + "attn_k.weight", (kv, e), wdtype, 1.0 / np.sqrt(e)),
            TensorSpec(p + "attn_k.bias", (kv,), f32, 0.1),
            TensorSpec(p + "attn_v.weight", (kv, e), wdtype, 1.0 / np.sqrt(e)),
            TensorSpec(p + "attn_v.bias", (kv,), f32, 0.1),
            TensorSpec(p + "attn_output.weight", (e, e), wdtype, branch / np.sqrt(e)),
            TensorSpec(p + "ffn_norm.weight", (e,), f32, 0.0, const=1.0),
            TensorSpec(p + "ffn_gate.weight", (ff, e), wdtype, 1.0 / np.sqrt(e)),
            TensorSpec(p + "ffn_up.weight", (ff, e), wdtype, 1.0 / np.sqrt(e)),
            TensorSpec(p + "ffn_down.weight", (e, ff), wdtype, branch / np.sqrt(ff)),
        ]
    plan.append(TensorSpec("output_norm.weight", (e,), f32, 0.0, const=float(out_norm)))
    if not shape.tie_embeddings:
        plan.append(TensorSpec("output.weight", (n_vocab, e), wdtype, logit_std / np.sqrt(e)))
    return plan


# 256 equiprobable quantiles of N(0, 1): a random byte picks one, which is several times faster than
# numpy's normal sampler (it matters for the 14B shape) and just as good for random weights
_NORMAL_LUT = np.array([NormalDist().inv_cdf((i + 0.5) / 256) for i in range(256)], dtype=np.float64)


def _tensor_chunks(t: TensorSpec, seed: int) -> Iterator[np.ndarray]:
    """The tensor's data, flattened in row-major order, in chunks of at most _CHUNK_ELEMS elements."""
    if t.const is not None:
        remaining = t.n_elems
        while remaining:
            n = min(remaining, _CHUNK_ELEMS)
            yield np.full(n, t.const, dtype=t.dtype)
            remaining -= n
        return
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(t.name.encode())])
    lut = (_NORMAL_LUT * t.std).astype(t.dtype)
    remaining = t.n_elems
    while remaining:
        n = min(remaining, _CHUNK_ELEMS)
        idx = np.frombuffer(rng.bytes(n), dtype=np.uint8)
        yield lut[idx]
        remaining -= n


# ---------------------------------------------------------------------------------------------------
# writer


def resolve_shape(shape: str | Qwen2Shape = "tiny", **overrides: Any) -> Qwen2Shape:
    """A named shape (or a Qwen2Shape) with field overrides applied and checked."""
    if isinstance(shape, Qwen2Shape):
        base = shape
    else:
        key = str(shape).lower()
        if key not in SHAPES:
            raise ValueError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
        base = SHAPES[key]
    unknown = sorted(set(overrides) - set(SHAPE_FIELDS))
    if unknown:
        raise ValueError(f"unknown shape override(s): {', '.join(unknown)} (known: {', '.join(SHAPE_FIELDS)})")
    resolved = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    resolved.validate()
    return resolved


def write_qwen2_gguf(
    path: str | os.PathLike[str],
    shape: str | Qwen2Shape = "tiny",
    *,
    vocab: str | os.PathLike[str] = "bytes",
    seed: int = 0,
    dtype: str = "f16",
    name: str | None = None,
    **overrides: Any,
) -> Path:
    """Write a random-weight Qwen2-architecture GGUF model to `path` and return the path.

    shape: a key of `SHAPES` ("tiny", "0.5b", "1.5b", "7b", "14b") or a `Qwen2Shape`.
    vocab: "bytes" (tiny byte-level BPE with ChatML specials), "bytes-alt" (a different tiny vocabulary)
        or the path of a GGUF file whose tokenizer.* keys are copied.
    seed: seeds the weights (each tensor's stream is seeded from `seed` and its name).
    dtype: "f16" or "f32" for the 2-D weights (norms and biases are always F32, as converters write them).
    overrides: any `Qwen2Shape` field: n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx, rope_theta,
        rms_eps, tie_embeddings.
    """
    spec = resolve_shape(shape, **overrides)
    if dtype not in ("f16", "f32"):
        raise ValueError(f"dtype must be 'f16' or 'f32', got {dtype!r}")
    wdtype = np.dtype(np.float16 if dtype == "f16" else np.float32)
    kvs = vocab_kvs(vocab)
    tokens = kv_value(kvs, "tokenizer.ggml.tokens")
    n_vocab = len(tokens)
    vocab_label = vocab if isinstance(vocab, str) and vocab in ("bytes", "bytes-alt") else Path(vocab).name
    shape_label = shape if isinstance(shape, str) else "custom"

    def metadata(writer: Any) -> None:
        writer.add_context_length(int(spec.n_ctx))
        writer.add_embedding_length(int(spec.n_embd))
        writer.add_block_count(int(spec.n_layer))
        writer.add_feed_forward_length(int(spec.n_ff))
        writer.add_head_count(int(spec.n_head))
        writer.add_head_count_kv(int(spec.n_head_kv))
        writer.add_rope_freq_base(float(spec.rope_theta))
        writer.add_layer_norm_rms_eps(float(spec.rms_eps))

    return write_gguf(
        path, ARCH, _tensor_plan(spec, n_vocab, wdtype), kvs, metadata, seed=seed, dtype=dtype,
        name=name or f"specq-synthetic-qwen2-{shape_label}", shape_label=shape_label, vocab_label=vocab_label,
    )


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    plan: Sequence["TensorSpec"],
    kvs: Sequence[_KV],
    metadata: Any,
    *,
    seed: int,
    dtype: str,
    name: str,
    shape_label: str,
    vocab_label: str,
) -> Path:
    """Write a GGUF of architecture `arch`: `metadata(writer)` adds the `{arch}.*` hyperparameters,
    `kvs` the vocabulary, `plan` the tensors (streamed in chunks from their seeded generators).

    The file is written to `<path>.part` and renamed when complete; nothing is left on failure.
    """
    import gguf

    n_vocab = len(kv_value(kvs, "tokenizer.ggml.tokens"))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")

    writer = gguf.GGUFWriter(part, arch)
    try:
        writer.add_type("model")
        writer.add_name(name)
        writer.add_description(
            f"random-weight {arch} model written by specq.testing.synthetic (shape={shape_label}, "
            f"vocab={vocab_label}, seed={seed}, dtype={dtype}); not a trained model"
        )
        metadata(writer)
        writer.add_vocab_size(n_vocab)
        writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32))
        writer.add_string("specq.synthetic.shape", str(shape_label))
        writer.add_string("specq.synthetic.vocab", str(vocab_label))
        writer.add_uint64("specq.synthetic.seed", int(seed) & 0xFFFFFFFFFFFFFFFF)
        for kv in kvs:
            writer.add_key_value(kv.key, kv.value, kv.vtype, kv.sub_type)

        for t in plan:
            writer.add_tensor_info(t.name, t.shape, t.dtype, t.nbytes)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None and len(writer.fout) == 1
        fout = writer.fout[0]
        # same layout as GGUFWriter.write_tensor_data, but each tensor is streamed in chunks
        for t in plan:
            writer.write_padding(fout, fout.tell())
            written = 0
            for chunk in _tensor_chunks(t, seed):
                chunk.tofile(fout)
                written += chunk.nbytes
            assert written == t.nbytes, (t.name, written, t.nbytes)
            writer.write_padding(fout, t.nbytes)
        writer.flush()
    except BaseException:
        writer.close()
        part.unlink(missing_ok=True)
        raise
    writer.close()
    os.replace(part, path)
    return path


def read_hparams(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Hyperparameters, vocabulary facts and tensor infos of a Qwen2 GGUF file, read from its header.

    "tensors" maps each name to (ggml shape, ne0 first; ggml type name).
    """
    from gguf import GGMLQuantizationType

    kvs, tensors = _read_gguf_header(path)
    values = {kv.key: kv.value for kv in kvs}

    def get(key: str) -> Any:
        v = values.get(key)
        return v.decode("utf-8") if isinstance(v, bytes) else v

    arch = get("general.architecture")
    tokens = values.get("tokenizer.ggml.tokens")
    return {
        "architecture": arch,
        "name": get("general.name"),
        "n_layer": get(f"{arch}.block_count"),
        "n_embd": get(f"{arch}.embedding_length"),
        "n_ff": get(f"{arch}.feed_forward_length"),
        "n_head": get(f"{arch}.attention.head_count"),
        "n_head_kv": get(f"{arch}.attention.head_count_kv"),
        "n_ctx": get(f"{arch}.context_length"),
        "rope_theta": get(f"{arch}.rope.freq_base"),
        "rms_eps": get(f"{arch}.attention.layer_norm_rms_epsilon"),
        "n_vocab": len(tokens) if tokens is not None else None,
        "tokenizer_model": get("tokenizer.ggml.model"),
        "tokenizer_pre": get("tokenizer.ggml.pre"),
        "bos_token_id": get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": get("tokenizer.ggml.eos_token_id"),
        "eot_token_id": get("tokenizer.ggml.eot_token_id"),
        "add_bos_token": get("tokenizer.ggml.add_bos_token"),
        "chat_template": get("tokenizer.chat_template"),
        "synthetic": {k.split(".")[-1]: get(k) for k in values if k.startswith("specq.synthetic.")},
        "tie_embeddings": "output.weight" not in tensors,
        "tensors": {n: (shape, GGMLQuantizationType(t).name) for n, (shape, t) in tensors.items()},
    }


def estimate_bytes(shape: str | Qwen2Shape = "tiny", *, n_vocab: int = 256 + len(_BYTES_MERGES) + 3,
                   dtype: str = "f16", **overrides: Any) -> int:
    """Bytes of tensor data `write_qwen2_gguf` would write (the file adds metadata and padding)."""
    spec = resolve_shape(shape, **overrides)
    wdtype = np.dtype(np.float16 if dtype == "f16" else np.float32)
    return sum(t.nbytes for t in _tensor_plan(spec, n_vocab, wdtype))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specq.testing.synthetic",
        description="Write a random-weight Qwen2-architecture GGUF model (for tests and benchmarks).",
    )
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES), help="Qwen2.5 shape (default tiny)")
    parser.add_argument("--out", required=True, help="output GGUF path")
    parser.add_argument("--vocab", default="bytes", help="bytes, bytes-alt or the path of a GGUF with a vocabulary")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="f16", choices=["f16", "f32"])
    parser.add_argument("--name", default=None, help="general.name (default derived from the shape)")
    for fname in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_ctx"):
        parser.add_argument("--" + fname.replace("_", "-"), dest=fname, type=int, default=None)
    parser.add_argument("--rope-theta", dest="rope_theta", type=float, default=None)
    parser.add_argument("--rms-eps", dest="rms_eps", type=float, default=None)
    tie = parser.add_mutually_exclusive_group()
    tie.add_argument("--tie-embeddings", dest="tie_embeddings", action="store_true", default=None)
    tie.add_argument("--no-tie-embeddings", dest="tie_embeddings", action="store_false")
    args = parser.parse_args(argv)
    overrides = {f: getattr(args, f) for f in SHAPE_FIELDS if getattr(args, f) is not None}
    try:
        started = time.perf_counter()
        out = write_qwen2_gguf(args.out, args.shape, vocab=args.vocab, seed=args.seed, dtype=args.dtype,
                               name=args.name, **overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    size = out.stat().st_size
    print(f"wrote {out} ({size / 2**20:.1f} MiB) in {time.perf_counter() - started:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
