"""Drafters that read the target's hidden states: MTP (the target's own next-token-prediction block)
and EAGLE3 (a one-layer head over features of three target layers).

Both draft on a context of their own (the MTP block: a `LLAMA_CONTEXT_TYPE_MTP` context of the target
model; EAGLE3: the head's context), one sequence per job (`seq`), fed with what the target computed
for every token that entered its KV cache. The decode loop and the prefill call `observe(ctx, rows,
tokens, positions)` after each target `llama_decode` with the tokens that stay in the target's cache
(a verification batch: the last token + the accepted drafts), read as rows `rows` of that batch.
Like every drafter they only change speed: the target verifies each drafted token
(speculative.verify), greedy output is `--draft none`'s and sampling stays exact with the drafter's
distribution as q.

Input conventions (those of llama.cpp's common/speculative.cpp; the code here is our own):

* MTP: at target position p the block reads the pair (token x_p, target hidden h_prev) where h_prev
  is the target's final hidden state at the token before p in the target's cache, and predicts
  the token after p. The first token of the sequence has no previous hidden state and is skipped.
  Drafting from the pending token x_P (sampled, not yet in the target's cache) at P: the seed pair
  (x_P, h_{P-1}) gives d1; each next step feeds (d_i, the block's own hidden output) at P+i.
* EAGLE3: at position p the decoder reads (the token after p, g_p) with g_p = fc(the inputs of the
  head's three target layers at p), so a position's pair is written once the next token is known;
  the last one waits for the pending token, which is the seed: (x_P, g_last) at the last position
  gives d1, then (d_i, the decoder's own hidden output) at last + i.

State kept in step with the target: the drafter's cells after the last position whose pair is final
(`fed_upto`) are draft cells; they are removed (seq_rm) before the next real pairs are written, so
after any number of rejections the drafter's cache holds exactly one pair per accepted target token.
Pairs of verified tokens are written lazily, in the same batch as the next seed (one drafter call
per draft step); a prefill's thousands of pairs are written as its chunks arrive.

Sparse prefill (`--mode specprefill`): only kept tokens have hidden states. `fill="kept"` (default)
writes the kept tokens' pairs at their original positions — each pairs a token with the hidden state
of the previous kept token, the one the target itself computed before it — so the drafter attends to
exactly the tokens, at exactly the positions, the target attends to. `fill="decoded"` skips the
prompt and starts at the first decoded token (tests/test_drafters_hidden.py compares the two).
"""

from __future__ import annotations

import llama_cpp  # isort: skip  (before numpy, see llama.py)

import time
from typing import Sequence

import numpy as np

from ...contracts import DecodeError, ModelError
from ..llama.binding import Context, Model
from ..llama.ext import (
    EAGLE3_NEEDS, MTP_NEEDS, EmbdBatch, enable_layer_inputs, encoder_output, hidden_rows, layer_input_rows, missing,
    n_embd_out, set_hidden_output, target_layer_ids,
)
from .sampling import Sampler
from .speculative import Draft, draft_tokens

#: target architectures whose MTP block `--draft mtp` runs (tested here on random weights of this
#: layout). llama.cpp's `load_mtp` is honoured by more (deepseek2/3, mimo2, step35, …) but each has its
#: own MTP graph and KV layout, untested here; qwen35/qwen3next/nemotron-h are hybrid-recurrent and
#: cannot roll a rejected draft back with seq_rm (is_hybrid/is_recurrent refuses them first)
MTP_ARCHS = ("glm4moe",)
#: target architectures whose llama.cpp graph extracts the layer inputs an EAGLE3 head reads
#: (`t_layer_inp` is set in src/models/llama.cpp, qwen3.cpp, qwen3moe.cpp; qwen2.cpp never sets it, so
#: a Qwen2 target would abort in llama.cpp with "layer input tensor is null")
EAGLE3_TARGET_ARCHS = ("llama", "qwen3", "qwen3moe")

#: verified tokens' pairs wait for the next seed up to this many; more (a prefill chunk) are written at once
_LAZY_MAX = 32
FILLS = ("kept", "decoded")


class HiddenStateDrafter:
    """What MTP and EAGLE3 share: the pending pairs, the seed + draft loop, rollback of draft cells."""

    name = "hidden"
    #: logits of the batch that ends with the seed: only its last row is read
    _seed_logits = "last"

    def __init__(self, dctx: Context, in_width: int, *, seq: int = 0, sampler: Sampler | None = None,
                 p_min: float = 0.0, fill: str = "kept") -> None:
        if fill not in FILLS:
            raise ValueError(f"fill must be one of {FILLS}, not {fill!r}")
        self.ctx = dctx
        self.model = dctx.model
        self.seq = int(seq)
        self.sampler = sampler if sampler is not None and not sampler.greedy else None
        self.p_min = float(p_min)
        self.fill = fill
        self._batch = EmbdBatch(dctx.n_batch, in_width)
        self._out_width = n_embd_out(dctx.model)
        #: pairs ready to be written: positions, tokens, input rows
        self._pos: list[int] = []
        self._tok: list[int] = []
        self._rows: list[np.ndarray] = []
        #: the last target position whose final pair is in the drafter's cache (-1: none)
        self.fed_upto = -1
        #: the last target position observed (-1: none)
        self.last_pos = -1
        self._proposed = False
        #: what was written, for tests and benchmarks
        self.pairs_written = 0
        self.feed_ms = 0.0
        self.draft_ms = 0.0
        dctx.seq_rm(self.seq, 0, -1)

    # -- feeding ------------------------------------------------------------------------------------
    def _queue(self, pos: int, tok: int, row: np.ndarray) -> None:
        if pos <= self.fed_upto:  # written by a seed already (the pending token)
            return
        self._pos.append(int(pos))
        self._tok.append(int(tok))
        self._rows.append(row)

    def _write(self, seed: tuple[int, int, np.ndarray] | None = None) -> None:
        """Write the pending pairs (and the seed, with logits) after dropping the draft cells."""
        pos, tok, rows = self._pos, self._tok, self._rows
        if seed is not None:
            pos, tok, rows = pos + [seed[0]], tok + [seed[1]], rows + [seed[2]]
        if not pos:
            return
        t0 = time.perf_counter()
        # draft cells go; so does an earlier seed at this seed's position (propose called again)
        self.ctx.seq_rm(self.seq, min(self.fed_upto + 1, pos[0]), -1)
        step = min(self._batch.n_max, self.ctx.call_tokens)  # bounded calls, as the target's prefill
        for start in range(0, len(pos), step):
            end = min(start + step, len(pos))
            last = seed is not None and end == len(pos)
            self._batch.decode(self.ctx, tok[start:end], pos[start:end], np.stack(rows[start:end]), seq=self.seq,
                               logits=self._seed_logits if last else "none")
        self.pairs_written += len(pos)
        self.fed_upto = pos[-1]
        self._pos, self._tok, self._rows = [], [], []
        self.feed_ms += (time.perf_counter() - t0) * 1000.0

    def _after_observe(self) -> None:
        if not self._proposed and self.fill == "decoded":
            # start at the first decoded token: forget the prompt's pairs (the state for the seed stays)
            self._pos, self._tok, self._rows = [], [], []
        elif len(self._pos) > _LAZY_MAX:
            self._write()

    # -- drafting ------------------------------------------------------------------------------------
    def _seed(self, pending: int) -> tuple[int, int, np.ndarray] | None:
        raise NotImplementedError

    def propose(self, history: Sequence[int], n: int) -> Draft:
        t0 = time.perf_counter()
        try:
            return self._propose(int(history[-1]), n)
        finally:
            self.draft_ms += (time.perf_counter() - t0) * 1000.0

    def _propose(self, pending: int, n: int) -> Draft:
        self._proposed = True
        seed = self._seed(pending) if n > 0 else None
        if seed is None:
            return Draft([])
        ctx = self.ctx
        self._write(seed)
        pos = seed[0]

        def step(d: int) -> np.ndarray | None:
            nonlocal pos
            if pos + 1 >= ctx.n_ctx:
                return None
            h = hidden_rows(ctx, [-1])  # the drafter's own hidden output at the last step
            pos += 1
            self._batch.decode(ctx, [d], [pos], h, seq=self.seq, logits="last")
            return ctx.logits_row(-1)

        return draft_tokens(ctx.logits_row(-1), n, self.sampler, self.p_min, self.model.is_eog, step)

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        pass  # observe() brings the accepted tokens' hidden states; the next propose writes them

    def close(self) -> None:
        self.ctx.seq_rm(self.seq, 0, -1)


class MtpDrafter(HiddenStateDrafter):
    """The target's MTP block drafts (see the module docstring for the pairs it reads)."""

    name = "mtp"

    def __init__(self, mtp_ctx: Context, **kw) -> None:
        super().__init__(mtp_ctx, n_embd_out(mtp_ctx.model), **kw)
        self._h_last: np.ndarray | None = None  # the target's hidden state at last_pos

    def observe(self, ctx: Context, rows: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> None:
        if not len(tokens):
            return
        h = hidden_rows(ctx, rows)
        for i, (p, t) in enumerate(zip(positions, tokens)):
            if p <= self.last_pos:
                raise DecodeError(f"MTP drafter: position {p} observed after {self.last_pos}")
            if self._h_last is not None:
                self._queue(p, t, self._h_last)
            self._h_last = h[i]
            self.last_pos = int(p)
        self._after_observe()

    def _seed(self, pending: int) -> tuple[int, int, np.ndarray] | None:
        if self._h_last is None or self.last_pos + 1 >= self.ctx.n_ctx:
            return None
        return self.last_pos + 1, pending, self._h_last


class Eagle3Drafter(HiddenStateDrafter):
    """An EAGLE3 head drafts (see the module docstring for the pairs it reads)."""

    name = "eagle3"
    #: llama.cpp's EAGLE3 decoder graph (src/models/eagle3.cpp) has no `inp_out_ids` crop: its logits
    #: rows are in batch order, so with logits on the last entry only, llama.cpp hands back the first
    #: entry's row. Every row of the seed's batch is asked for (a few dozen at most), the last one read.
    _seed_logits = "all"

    def __init__(self, head_ctx: Context, layers: Sequence[int], n_embd_target: int, **kw) -> None:
        """layers: the target layers whose inputs the head fuses; n_embd_target: the target's width."""
        self.layers = [int(x) for x in layers]
        super().__init__(head_ctx, n_embd_out(head_ctx.model), **kw)
        self._enc = EmbdBatch(max(1, head_ctx.n_ubatch), len(self.layers) * int(n_embd_target))
        self._anchor: tuple[int, np.ndarray] | None = None  # (position, g) awaiting its next token

    def _encode(self, ctx: Context, rows: Sequence[int]) -> np.ndarray:
        """g = fc(inputs of the head's target layers) for these rows of the target's last batch."""
        rows = list(rows)
        first, n = rows[0], len(rows)
        if rows != list(range(first, first + n)):
            raise DecodeError("EAGLE3 drafter: observed rows must be contiguous")
        feats = np.concatenate([layer_input_rows(ctx, lid, first, n) for lid in self.layers], axis=1)
        out = np.empty((n, self._out_width), dtype=np.float32)
        step = self._enc.n_max
        for s in range(0, n, step):
            e = min(s + step, n)
            self._enc.encode(self.ctx, feats[s:e], seq=self.seq)
            out[s:e] = encoder_output(self.ctx, e - s, self._out_width)
        return out

    def observe(self, ctx: Context, rows: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> None:
        if not len(tokens):
            return
        t0 = time.perf_counter()
        g = self._encode(ctx, rows)
        self.feed_ms += (time.perf_counter() - t0) * 1000.0
        for i, (p, t) in enumerate(zip(positions, tokens)):
            if p <= self.last_pos:
                raise DecodeError(f"EAGLE3 drafter: position {p} observed after {self.last_pos}")
            if self._anchor is not None:
                self._queue(self._anchor[0], t, self._anchor[1])
            self._anchor = (int(p), g[i])
            self.last_pos = int(p)
        self._after_observe()

    def _seed(self, pending: int) -> tuple[int, int, np.ndarray] | None:
        if self._anchor is None or self._anchor[0] + 1 >= self.ctx.n_ctx:
            return None
        return self._anchor[0], pending, self._anchor[1]


# -------------------------------------------------------------------------------------------------- setup


def mtp_unsupported(target: Model) -> str:
    """Why `--draft mtp` cannot run on this target ("" = it can)."""
    name = target.path.name
    if target.n_layer_nextn <= 0:
        return f"target {name} has no MTP (NextN) layers"
    if not target.load_mtp:
        return f"target {name} was loaded without its MTP layers (load_mtp)"
    if llama_cpp.llama_model_is_recurrent(target.ptr) or llama_cpp.llama_model_is_hybrid(target.ptr):
        return (f"target {name} ({target.arch}) is hybrid-recurrent: a rejected draft cannot be rolled back with "
                "seq_rm without state snapshots")
    if target.arch not in MTP_ARCHS:
        return f"MTP drafting runs on {', '.join(MTP_ARCHS)} targets, not {target.arch} ({name})"
    lacking = missing(MTP_NEEDS)
    if lacking:
        return "this llama.cpp build does not export " + ", ".join(lacking)
    return ""


def open_mtp_context(target_ctx: Context, *, n_threads: int, n_seq: int = 1) -> Context:
    """The MTP block's own context on the target model (its KV holds the MTP layer only), for n_seq
    drafting sequences (one per job decoded at once)."""
    why = mtp_unsupported(target_ctx.model)
    if why:
        raise ModelError(why)
    ctx = Context(target_ctx.model, n_ctx=target_ctx.n_ctx, n_batch=target_ctx.n_batch,
                  n_ubatch=target_ctx.n_ubatch, n_threads=n_threads, flash_attn=target_ctx.flash_attn,
                  n_seq_max=n_seq, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP,
                  position_gaps=target_ctx.position_gaps,  # it is fed the target's (sparse) positions
                  call_tokens=target_ctx.call_tokens)
    set_hidden_output(ctx, True, masked=True)
    return ctx


def eagle3_unsupported(head: Model, target: Model) -> str:
    """Why this EAGLE3 head cannot draft for this target ("" = it can)."""
    lacking = missing(EAGLE3_NEEDS)
    if lacking:
        return "this llama.cpp build does not export " + ", ".join(lacking)
    if head.arch != "eagle3":
        return f"drafter {head.path.name} is a {head.arch or 'unknown'} model, not an EAGLE3 head"
    if target.arch not in EAGLE3_TARGET_ARCHS:
        return (f"EAGLE3 needs the target's layer inputs, which llama.cpp's {target.arch} graph does not extract "
                f"(supported targets: {', '.join(EAGLE3_TARGET_ARCHS)})")
    layers = target_layer_ids(head)
    if len(layers) != 3 or not all(0 <= x < target.n_layer for x in layers):
        return f"EAGLE3 head {head.path.name} reads target layers {layers}; target {target.path.name} has {target.n_layer}"
    if head.n_vocab != target.n_vocab or head.vocab_signature() != target.vocab_signature():
        return f"EAGLE3 head {head.path.name} has a different vocabulary from target {target.path.name}"
    return ""


def open_eagle3_context(head: Model, target_ctx: Context, *, n_threads: int, n_seq: int = 1) -> tuple[Context, list[int]]:
    """The head's context (borrowing the target's token embedding through ctx_other) and its layers;
    switches on the extraction of those layers' inputs in the target's context."""
    why = eagle3_unsupported(head, target_ctx.model)
    if why:
        raise ModelError(why)
    layers = target_layer_ids(head)
    ctx = Context(head, n_ctx=target_ctx.n_ctx, n_batch=target_ctx.n_batch, n_ubatch=target_ctx.n_ubatch,
                  n_threads=n_threads, flash_attn=target_ctx.flash_attn, n_seq_max=n_seq, ctx_other=target_ctx,
                  position_gaps=target_ctx.position_gaps, call_tokens=target_ctx.call_tokens)
    set_hidden_output(ctx, True, masked=True)
    enable_layer_inputs(target_ctx, layers)
    return ctx, layers


__all__ = [
    "EAGLE3_TARGET_ARCHS", "FILLS", "MTP_ARCHS", "Eagle3Drafter", "HiddenStateDrafter", "MtpDrafter",
    "eagle3_unsupported", "mtp_unsupported", "open_eagle3_context", "open_mtp_context",
]
