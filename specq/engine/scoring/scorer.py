"""SpecPrefill scoring: how much the speculator's lookahead queries attend to each prompt token.

For one window of tokens the speculator prefills all but the last token (no capture), then decodes
`lookahead` steps one token at a time — the last prompt token, then its own greedy continuation —
capturing each layer's post-RoPE query; on the first step it also captures each layer's K cache.
Scores are recomputed from those (flash attention stays on):

    softmax(q·Kᵀ/√d) over the window's prompt keys, in float32, per (layer, head, lookahead row)
    → average-pool along the sequence (kernel `pool`, same padding)
    → max over layers × heads → mean over lookahead rows.

GQA: the query heads that share a KV head are grouped, and all lookahead rows are batched, so each
(layer, kv-head) is one matrix product.

Windows. `windowed` (default): window = [template head][document slice][question + template tail],
slices of equal size tile the document without overlap, so every window's lookahead asks the
question; only slice tokens are scored. Unless the job sets `window`, a document of up to
ONE_PASS_TOKENS is one slice (one pass), a longer one is cut into DEFAULT_WINDOW slices. `full`: one window holding the whole document. `sliding`:
the seed tool's scheme, kept for comparison — windows of the bare prompt with 50% overlap, each token
taking its score from the window in which it lies most central.

Where the math runs (`score_math`): `numpy` copies each layer's K cache to the host on the first
lookahead step; `torch` (score_torch.py) reads it in place on the speculator's device and only the
scores come back — the GPU default when PyTorch with CUDA is importable.

Between calls (`score(between_calls=...)`): a window's prefill is llama_decode calls of at most
`call_tokens` tokens (the context's); after each of them the caller's `between_calls(ctx)` runs, `ctx`
being the speculator context that holds the window's partial KV. The serving loop decodes other jobs
on the target's context there (engine/serving/loop.py); the capture is not armed then (the eval callback
is off, or installed but disarmed, until the lookahead), and the calls, so the KV bytes saved to and
restored from the speculator cache, are the same with or without it. The hook's time is not counted
in `speculator_prefill`.

Resident windows (parallel scoring with the speculator cache). A cached parallel call leaves each
stream holding its window's head + document slice (cells 0..len-1, then the question's tail and
lookahead). When the next cached call scores the same windows of the same document for the same
tenant (same cache key), each stream drops only the cells from the tail on (`seq_rm`) and nothing is
restored: the cells hold exactly the bytes a restore would write, so the scores are identical
(tests/test_doc_cache.py). That is the common case of a group's questions, scored one after another:
on the H200 a further question's restore of 8 windows of a 32K document took 283-367 ms
(bench/results/h200-serve-2026-12-04d/m1-*-docs-32768.json, `timings_ms.cache_restore`). Any
other call (another document or tenant, an uncached call, an error) forgets them; only one parallel
call's windows stay (a document of more windows than `n_parallel` restores as before).
`WindowCacheUse.resident` counts these hits.

Speculator implementation (EngineOptions.speculator_impl; `auto`, the default, is `torch` where the models are
on a GPU and the forward can run there, `llama` otherwise): `llama` runs the windows above through
llama.cpp; `torch` (a TorchSpeculator given to the scorer) runs them through torch_speculator.py's PyTorch
forward of the same GGUF (dequantized) with the same positions, lookahead steps and score formula. With
`torch` a document's windows are scored together on a GPU (one at a time on the CPU): prefilled in one padded
batch, each look-ahead step one forward of all of them (a CUDA graph); a prefill call is a group of layers
over every token, as many as hold `call_tokens` tokens' worth of work; the speculator cache is not used (it
holds llama.cpp KV bytes), and between_calls still runs after each prefill call. Measured against `llama`
on the real 0.5B (CPU): bench/results/cpu-torch-speculator-2026-12-07.json. On an H100 (random 0.5B, 32K
tokens in 8 windows, bench/results/h100-2026-12-07b/): kept sets equal llama.cpp's (Jaccard 1.0, Pearson
>= 0.99997); the look-ahead takes 27 ms and a prefill in one call 106 ms (llama.cpp: 48 and 225 ms), but
in token chunks of 2,048 (as the calls were then) the prefill took 277-331 ms, and the 7B's TTFT ratio was
2.65x against llama's 2.92x. With layer-group calls (bench/results/h100-2026-12-07c/, one machine start):
speculator prefill 112 ms against llama.cpp's 266 (34% of the card's F16 peak against 14%), 7B TTFT at 32K
3.54x against 2.66x; 14B at 32K 5.08x, 7B at 128K 6.67x. Hence `auto`.

Normalisation: a window's scores are multiplied by the number of keys its softmax ran over, so that
uniform attention scores 1.0 in every window; a short window (whose softmax mass is spread over
fewer keys) then does not outweigh the others.
"""

from __future__ import annotations

from ..llama.capture import QKCapture  # isort: skip  (llama_cpp before numpy)

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ...contracts import EngineError
from ..llama.binding import Context, Model, set_eval_callback
from ..options import DEFAULT_WINDOW, ONE_PASS_TOKENS  # noqa: F401  (re-exported: the scorer's sizes)
from ..prompt.build import Prompt

#: window length of the `sliding` scorer (the seed's ~2,000 tokens)
SLIDING_WINDOW = 2048


@dataclass
class ScoreResult:
    scores: np.ndarray  # one score per document token
    windows: int
    timings_ms: dict[str, float] = field(default_factory=dict)
    #: the document slices [a, b) scored as windows (windowed/full; sliding: the whole document)
    plan: list[tuple[int, int]] = field(default_factory=list)


def avg_pool(x: np.ndarray, kernel: int) -> np.ndarray:
    """Average-pool the last axis with stride 1 and zero 'same' padding (divides by `kernel`)."""
    if kernel <= 1:
        return x
    pad = kernel // 2
    c = np.cumsum(np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad + 1, pad)]), axis=-1, dtype=np.float32)
    return (c[..., kernel:] - c[..., :-kernel]) / np.float32(kernel)


def grouped_probs(Q: np.ndarray, K: np.ndarray) -> np.ndarray:
    """softmax(q·Kᵀ/√d) over all n keys, float32, one matrix product per KV head.

    Q: (S, n_head, d) lookahead queries; K: (n, n_head_kv, d). Returns (n_head_kv, S * r, n) where the
    r = n_head / n_head_kv query heads sharing a KV head are rows s * r + j of group g (head g * r + j).
    """
    n_kv_heads, d = K.shape[1], K.shape[2]
    S, h = Q.shape[0], Q.shape[1]
    r = h // n_kv_heads
    Qg = Q.reshape(S, n_kv_heads, r, d).transpose(1, 0, 2, 3).reshape(n_kv_heads, S * r, d)
    logits = np.matmul(Qg, K.transpose(1, 2, 0)) * np.float32(1.0 / math.sqrt(d))
    logits -= logits.max(axis=-1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=-1, keepdims=True)
    return logits


def head_probs(Q: np.ndarray, K: np.ndarray) -> np.ndarray:
    """grouped_probs rearranged to (S, n_head, n): what llama.cpp's kq_soft_max holds per step."""
    g = K.shape[1]
    S, h = Q.shape[0], Q.shape[1]
    p = grouped_probs(Q, K)  # (g, S*r, n)
    return p.reshape(g, S, h // g, -1).transpose(1, 0, 2, 3).reshape(S, h, -1)


def attention_scores(q_rows: Sequence[dict[int, np.ndarray]], k: dict[int, np.ndarray], n_keys: int, pool: int) -> np.ndarray:
    """Token importance over keys [0, n_keys) from lookahead queries.

    q_rows[s][il]: (n_head, head_dim) post-RoPE query of lookahead row s in layer il.
    k[il]: (n_kv, n_head_kv, head_dim) K cache of layer il (cell i = position i).
    """
    layers = sorted(k)
    if not layers or not q_rows:
        raise EngineError("scoring captured no attention tensors from the speculator")
    S = len(q_rows)

    def layer(il: int) -> np.ndarray:
        K = k[il][:n_keys]
        Q = np.stack([row[il] for row in q_rows])  # (S, h, d)
        probs = grouped_probs(Q, K)  # (g, S*r, n)
        pooled = avg_pool(probs, pool)
        return pooled.reshape(K.shape[1], S, -1, n_keys).max(axis=(0, 2))  # (S, n)

    # layers are independent and numpy releases the GIL in matmul/exp/cumsum: one thread per core
    best: np.ndarray | None = None
    for per_row in math_pool().map(layer, layers):
        best = per_row if best is None else np.maximum(best, per_row)
    return best.mean(axis=0)


#: the score math's per-layer worker threads, named apart from the serving loop's `specq-score` thread
#: (score_thread.py) so that a thread dump or a test tells the two apart
MATH_THREAD_PREFIX = "specq-score-math"
_EXECUTOR = None
_EXECUTOR_LOCK = threading.Lock()


def math_pool():
    """The score math's thread pool, started on first use; the lock makes two threads scoring at once
    (the loop's and the score thread's) start one pool, not two."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            import os
            from concurrent.futures import ThreadPoolExecutor

            _EXECUTOR = ThreadPoolExecutor(max_workers=max(1, min(16, os.cpu_count() or 1)),
                                           thread_name_prefix=MATH_THREAD_PREFIX)
        return _EXECUTOR


def plan_windows(n_doc: int, size: int) -> list[tuple[int, int]]:
    """Equal slices of at most `size` tokens tiling [0, n_doc) without overlap (no tiny last slice)."""
    if n_doc <= 0:
        return [(0, 0)]
    k = max(1, math.ceil(n_doc / max(1, size)))
    cuts = [(i * n_doc) // k for i in range(k + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def sliding_starts(n: int, size: int) -> list[int]:
    """Window starts of the sliding scorer: stride size/2, the last window flush with the end."""
    stride = max(1, size // 2)
    starts = list(range(0, max(1, n - size) + 1, stride))
    if starts[-1] + size < n:
        starts.append(n - size)
    return starts


def merge_central(n: int, windows: Sequence[tuple[int, np.ndarray]]) -> np.ndarray:
    """Keep-the-middle merge: each token takes its score from the window in which it lies most central."""
    full = np.zeros(n, dtype=np.float32)
    best = np.full(n, np.inf)
    for start, s in windows:
        end = start + len(s)
        dist = np.abs(np.arange(start, end) - (start + end - 1) / 2.0)
        better = dist < best[start:end]
        full[start:end][better] = s[better]
        best[start:end][better] = dist[better]
    return full


def interleaved(spans: Sequence[tuple[Sequence[int], int, int]], call_tokens: int) -> tuple[list[int], list[int], list[int]]:
    """(tokens, positions, seq ids) of several streams' prefills, ordered so that each decode call of
    `call_tokens` tokens holds an equal chunk of every stream still being filled. `spans`: per stream, its
    (tokens, first position, seq id); each stream's tokens stay in position order.

    Why: on an H100 the speculator's 8 x 4,096-token prefill took 381 ms with each call holding one window
    (window-major) and 254 ms with every call holding a chunk of each window (bench/gpu/speculator_throughput.py,
    bench/results/h100-2026-12-07-perdoc/speculator-throughput.json). The cells written are the same either way.
    """
    live = [(list(t), p0, s) for t, p0, s in spans if len(t)]
    toks: list[int] = []
    pos: list[int] = []
    seqs: list[int] = []
    done = [0] * len(live)
    while any(done[i] < len(t) for i, (t, _, _) in enumerate(live)):
        active = [i for i, (t, _, _) in enumerate(live) if done[i] < len(t)]
        chunk = max(1, call_tokens // len(active))
        for i in active:
            t, p0, s = live[i]
            take = t[done[i]:done[i] + chunk]
            toks += take
            pos += range(p0 + done[i], p0 + done[i] + len(take))
            seqs += [s] * len(take)
            done[i] += len(take)
    return toks, pos, seqs


class SpecPrefillScorer:
    """Owns the speculator context with the capture callback; `score()` per prompt."""

    def __init__(
        self, model: Model, *, n_ctx: int, n_batch: int, n_ubatch: int, n_threads: int, flash_attn: bool, n_parallel: int = 1,
        score_math: str = "numpy", device: int = 0, call_tokens: int = 0, torch_speculator=None,
    ) -> None:
        """torch_speculator: a torch_speculator.TorchSpeculator of `model`'s GGUF, which then runs the windows
        instead of llama.cpp (module doc "Speculator implementation"); passed in, not built here, so that
        this module does not import that one (which imports attention_scores from here)."""
        if score_math not in ("numpy", "torch"):
            raise EngineError(f"unknown score_math {score_math!r} (numpy or torch)")
        self.torch_speculator = torch_speculator
        #: llama: llama.cpp runs the speculator's windows; torch: the PyTorch forward of the same GGUF
        self.speculator_impl = "llama" if torch_speculator is None else "torch"
        self.model = model
        #: numpy: K copied to the host at lookahead step 0; torch: K read in place (score_torch.py)
        self.score_math = score_math
        #: the speculator's GPU (an index among the visible devices): where torch score math runs
        self.device = int(device)
        self.capture = QKCapture()
        #: windows scored together as parallel sequences (one KV stream each, see _score_parallel)
        self.n_parallel = max(1, int(n_parallel))
        self._ctx_args = dict(n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads, flash_attn=flash_attn,
                              cb_eval=self.capture.callback, call_tokens=call_tokens)
        self.ctx = Context(model, n_ctx=n_ctx, **self._ctx_args)
        self.n_ctx = n_ctx  # the longest single window
        #: cells per stream of the parallel context: a default window with a long template and question
        self.stream_cells = min(n_ctx, DEFAULT_WINDOW + 1024)
        self._streams: Context | None = None  # built on first use (only when n_parallel > 1)
        #: stream -> the speculator-cache key of the window prefix (head + document slice) its cells
        #: 0..len-1 still hold after the last cached parallel call; empty after any other call
        self._resident: dict[int, tuple] = {}
        # With our patch the callback is installed only for the lookahead steps: during the window's
        # prefill llama.cpp then makes no Python call per graph node (10–30% of the prefill otherwise).
        self.toggles_callback = set_eval_callback(self.ctx, None)
        self._capture_on = True
        #: score()'s between_calls while it runs (None otherwise), and the seconds spent in it
        self._between: Callable[[Context], None] | None = None
        self._between_s = 0.0
        #: the tokens the speculator's cache holds after the last scoring window (lookahead removed)
        self.cached_tokens: list[int] = []
        #: speculator tokens prefilled so far (tests: a speculator-cache hit prefills only question tails)
        self.prefilled_tokens = 0
        #: positions [start, end) of each sequence the last score() call prefilled (restored cells not
        #: included; the lookahead decodes not either): what `speculator_prefill` timed, for the benchmark's
        #: throughput and FLOP count (specq/bench/flops.py)
        self.prefill_spans: list[tuple[int, int]] = []

    def streams(self) -> Context:
        """The parallel-window context: n_parallel KV streams of `stream_cells` cells."""
        if self._streams is None:
            self._streams = Context(
                self.model, n_ctx=self.n_parallel * self.stream_cells, n_seq_max=self.n_parallel, kv_unified=False, **self._ctx_args
            )
            if self.toggles_callback:
                set_eval_callback(self._streams, None)
        return self._streams

    def window_tokens(self, prompt: Prompt, lookahead: int, window: int = 0) -> int:
        """Document tokens per window for the windowed scorer: `window`, or when it is 0 the whole
        document up to ONE_PASS_TOKENS (one pass), else DEFAULT_WINDOW; never more than the context holds."""
        room = self.n_ctx - len(prompt.head) - len(prompt.tail) - lookahead - 1
        if room < 64:
            raise EngineError(f"the speculator's context ({self.n_ctx}) is too small for this prompt's template and question")
        if not window:
            n_doc = len(prompt.document)
            window = n_doc if DEFAULT_WINDOW < n_doc <= min(ONE_PASS_TOKENS, room) else DEFAULT_WINDOW
        return max(64, min(window, room))

    def score(
        self,
        prompt: Prompt,
        *,
        scorer: str = "windowed",
        lookahead: int = 8,
        pool: int = 13,
        window: int = 0,
        progress: Callable[[int, int], None] | None = None,
        capture: bool = True,
        cache=None,
        scope: str = "",
        on_window: Callable[[int, int, np.ndarray], None] | None = None,
        between_calls: Callable[[Context], None] | None = None,
    ) -> ScoreResult:
        """Score the document tokens of `prompt`. capture=False runs the same speculator forward passes
        without capture or score math (scores are then meaningless): the benchmark's overhead baseline.

        cache: a spec_cache.SpeculatorCache: the windowed/full scorers then restore each window's head +
        document slice saved by an earlier prompt of the same `scope` (tenant) instead of prefilling it,
        or prefill it by its own decode call and save it (the `cache_restore` timing: restores).
        on_window(a, b, scores) (windowed and full scorers) is called as soon as the window holding
        document slice [a, b) is scored, in document order (a group of parallel windows together),
        with that slice's final scores: the pipelined prefill starts on them (pipelined.py).
        between_calls(ctx) runs after each llama_decode call of a window's prefill (module doc: "Between
        calls"); `ctx` is the context being prefilled (the caller must leave its cells alone); an
        exception from it ends the scoring."""
        self._between, self._between_s = between_calls, 0.0
        self.prefill_spans = []
        try:
            return self._score(prompt, scorer, lookahead, pool, window, progress, capture, cache, scope, on_window)
        finally:
            self._between = None

    def _score(self, prompt: Prompt, scorer: str, lookahead: int, pool: int, window: int, progress, capture: bool,
               cache, scope: str, on_window) -> ScoreResult:
        self._capture_on = capture
        if self.torch_speculator is not None:
            cache = None  # the speculator cache holds llama.cpp KV bytes: the torch forward prefills every window
        timings = {"speculator_prefill": 0.0, "lookahead": 0.0, "score_math": 0.0}
        if cache is not None:
            timings["cache_restore"] = 0.0
        doc = prompt.document
        n_doc = len(doc)
        if scorer in ("windowed", "full"):
            if scorer == "full":
                size = n_doc
                if len(prompt.tokens) + lookahead > self.n_ctx:
                    raise EngineError(
                        f"scorer full needs {len(prompt.tokens) + lookahead} tokens of speculator context "
                        f"(has {self.n_ctx}): use the windowed scorer"
                    )
            else:
                size = self.window_tokens(prompt, lookahead, window)
            plan = plan_windows(n_doc, size)
            n_windows = len(plan)
            scores = np.zeros(n_doc, dtype=np.float32)
            h = len(prompt.head)
            longest = max(b - a for a, b in plan) + len(prompt.head) + len(prompt.tail) + lookahead + 1
            parallel = (self.n_parallel > 1 and len(plan) > 1 and longest <= self.stream_cells
                        and self.torch_speculator is None)  # the torch forward batches windows itself
            step = self.n_parallel if parallel else 1
            if self.torch_speculator is not None:
                step = self.torch_speculator.windows_per_batch(n_windows)
            for g in range(0, n_windows, step):
                if progress:
                    progress(g, n_windows)
                group = plan[g : g + step]
                windows = [prompt.head + doc[a:b] + prompt.tail for a, b in group]
                prefixes = [h + (b - a) for a, b in group] if cache is not None else None
                if self.torch_speculator is not None:
                    got = self._score_windows_torch(windows, lookahead, pool, timings)
                elif len(windows) == 1:
                    got = [self._score_window(windows[0], lookahead, pool, timings,
                                              prefix=prefixes[0] if prefixes else 0, cache=cache, scope=scope)]
                else:
                    got = self._score_parallel(windows, lookahead, pool, timings, prefixes=prefixes, cache=cache,
                                               scope=scope)
                for (a, b), s in zip(group, got):
                    scores[a:b] = s[h : h + (b - a)]
                if on_window:
                    for a, b in group:
                        on_window(a, b, scores[a:b])
            if progress:
                progress(n_windows, n_windows)
            return ScoreResult(scores, n_windows, timings, plan=plan)
        if scorer == "sliding":
            tokens = prompt.tokens
            n = len(tokens)
            size = max(64, min(window or SLIDING_WINDOW, self.n_ctx - lookahead - 1))
            starts = sliding_starts(n, size)
            per_window = []
            for w, start in enumerate(starts):
                if progress:
                    progress(w, len(starts))
                end = min(n, start + size)
                per_window.append((start, self._score_window(tokens[start:end], lookahead, pool, timings)))
            full = merge_central(n, per_window)
            if progress:
                progress(len(starts), len(starts))
            return ScoreResult(full[prompt.doc_start : prompt.doc_end].copy(), len(starts), timings, plan=[(0, n_doc)])
        raise EngineError(f"unknown scorer {scorer!r}")

    def _after_call(self, ctx: Context) -> Callable[[], None] | None:
        """Context.decode's after_call for a prefill on `ctx`: score()'s between_calls(ctx), timed."""
        between = self._between
        if between is None:
            return None

        def after() -> None:
            t = time.perf_counter()
            try:
                between(ctx)
            finally:
                self._between_s += time.perf_counter() - t

        return after

    def _prefill_window(self, ctx: Context, tokens: Sequence[int], prefix: int, cache, scope: str,
                        timings: dict[str, float]) -> None:
        """Prefill tokens[:-1] into sequence 0 of a cleared `ctx`; with a cache, tokens[:prefix] (head +
        document slice) are restored when saved before, else prefilled alone and saved. between_calls
        runs after each llama_decode call."""
        n = len(tokens)
        start = 0
        after = self._after_call(ctx)
        if cache is not None and 0 < prefix < n:
            restored0 = cache.use.restore_ms
            if not cache.restore_into(ctx, scope, tokens[:prefix]):
                ctx.decode(tokens[:prefix], range(prefix), logits="none", after_call=after)
                self.prefilled_tokens += prefix
                self.prefill_spans.append((0, prefix))
                cache.use.prefilled_tokens += prefix
                cache.save_from(ctx, scope, tokens[:prefix])
            timings["cache_restore"] = timings.get("cache_restore", 0.0) + cache.use.restore_ms - restored0
            start = prefix
        if n - 1 > start:
            ctx.decode(tokens[start:-1], range(start, n - 1), logits="none", after_call=after)
            self.prefilled_tokens += n - 1 - start
            self.prefill_spans.append((start, n - 1))
            if cache is not None:
                cache.use.prefilled_tokens += n - 1 - start

    def _score_window(self, tokens: Sequence[int], lookahead: int, pool: int, timings: dict[str, float], *,
                      prefix: int = 0, cache=None, scope: str = "") -> np.ndarray:
        """Scores (× number of keys) for every token of one window."""
        if self.torch_speculator is not None:
            return self._score_window_torch(tokens, lookahead, pool, timings)
        n = len(tokens)
        ctx, cap = self.ctx, self.capture
        cap.disarm()
        ctx.clear()
        if self.toggles_callback:
            set_eval_callback(ctx, None)  # also after a window that ended in an exception
        t0 = time.perf_counter()
        restore0, between0 = timings.get("cache_restore", 0.0), self._between_s
        self._prefill_window(ctx, tokens, prefix, cache, scope, timings)
        t1 = time.perf_counter()
        t0 += (timings.get("cache_restore", 0.0) - restore0) / 1000.0  # restores are their own phase
        t0 += self._between_s - between0  # other jobs' work between the calls is not the speculator's
        if not self._capture_on:
            return self._forward_only(tokens, lookahead, timings, t0, t1)
        if self.toggles_callback:
            set_eval_callback(ctx, cap.callback)
        rows: list[dict[int, np.ndarray]] = []
        k: dict[int, np.ndarray] = {}
        tok, pos = tokens[-1], n - 1
        for step in range(lookahead):
            cap.arm(q=True, k=self._k_mode if step == 0 else False)
            ctx.decode([tok], [pos], logits="last")
            cap.disarm()
            cap.raise_error()
            if step == 0:
                k = cap.k
            self._check_capture(k)
            rows.append({il: q[0] for il, q in cap.q.items()})
            if step + 1 == lookahead:
                break
            tok = int(np.argmax(ctx.logits_row(-1)))
            pos += 1
            if self.model.is_eog(tok):
                break
        if self.toggles_callback:
            set_eval_callback(ctx, None)
        t2 = time.perf_counter()
        scores = self._scores(rows, k, n, pool) * np.float32(n)
        t3 = time.perf_counter()
        # leave the cache holding exactly the window (a model drafter may continue from it)
        ctx.seq_rm(0, n, -1)
        self.cached_tokens = list(tokens)
        timings["speculator_prefill"] += (t1 - t0) * 1000.0
        timings["lookahead"] += (t2 - t1) * 1000.0
        timings["score_math"] += (t3 - t2) * 1000.0
        return scores

    def _score_window_torch(self, tokens: Sequence[int], lookahead: int, pool: int,
                            timings: dict[str, float]) -> np.ndarray:
        return self._score_windows_torch([tokens], lookahead, pool, timings)[0]

    def _score_windows_torch(self, windows: Sequence[Sequence[int]], lookahead: int, pool: int,
                             timings: dict[str, float]) -> list[np.ndarray]:
        """_score_window by the torch forward, several windows in one batch: the same positions, steps and
        formula (torch_speculator.py); a prefill call holds at most the context's call_tokens tokens in all."""
        self.ctx.clear()  # the llama.cpp context holds no window: a model drafter rebuilds
        self.cached_tokens = []
        after = self._after_call(self.ctx)
        out = self.torch_speculator.score_windows(
            windows, lookahead, pool, is_eog=self.model.is_eog, call_tokens=self.ctx.call_tokens, after_call=after,
            capture=self._capture_on, timings=timings, batch=len(windows))
        for w in windows:
            if len(w) > 1:
                self.prefilled_tokens += len(w) - 1
                self.prefill_spans.append((0, len(w) - 1))
        return out

    def _score_parallel(self, windows: list[list[int]], lookahead: int, pool: int, timings: dict[str, float], *,
                        prefixes: list[int] | None = None, cache=None, scope: str = "") -> list[np.ndarray]:
        """Score several windows at once, window w as sequence w in KV stream w of `streams()`.

        Each stream is filled from cell 0, so window w's key at position i lies in cell i of stream w,
        and a window's prefill attends over its own cells only (no masked pass over the others').
        Each lookahead step is one batch of P tokens, so the lookahead costs `lookahead` decode calls,
        not P × lookahead.
        """
        ctx, cap = self.streams(), self.capture
        P = len(windows)
        lens = [len(w) for w in windows]
        cap.disarm()
        # window prefixes still resident from the last cached call; forgotten until this one ends
        resident, self._resident = self._resident, {}
        keep_resident = cache is not None and bool(prefixes)
        # each window's cache key (scope, numerics, prefix tokens), hashed once for the call
        keys = {w: cache.key(scope, win[:prefixes[w]], "streams") for w, win in enumerate(windows)
                if 0 < prefixes[w] < len(win)} if keep_resident else {}
        if not keep_resident:
            ctx.clear()
        if self.toggles_callback:
            set_eval_callback(ctx, None)
        t0 = time.perf_counter()
        between0 = self._between_s
        after = self._after_call(ctx)
        starts = [0] * P
        if cache is not None and prefixes:
            # saved prefixes restored into their streams; the others prefilled together, then saved
            restored0 = cache.use.restore_ms
            missed: list[int] = []
            for w, win in enumerate(windows):
                pre = prefixes[w]
                if not 0 < pre < len(win):
                    ctx.seq_rm(w, 0, -1)
                    continue
                starts[w] = pre
                if resident.get(w) == keys[w]:
                    # the stream still holds this prefix (the last call scored another question about
                    # the same document): drop that question's tail and lookahead, restore nothing
                    ctx.seq_rm(w, pre, -1)
                    cache.use.hits += 1
                    cache.use.resident += 1
                    continue
                ctx.seq_rm(w, 0, -1)
                if not cache.restore_into(ctx, scope, win[:pre], seq_id=w, layout="streams"):
                    missed.append(w)
            miss_t, miss_p, miss_s = interleaved([(windows[w][:prefixes[w]], 0, w) for w in missed], ctx.call_tokens)
            if miss_t:
                ctx.decode(miss_t, miss_p, seq_ids=miss_s, logits="none", after_call=after)
                self.prefilled_tokens += len(miss_t)
                cache.use.prefilled_tokens += len(miss_t)
                self.prefill_spans += [(0, prefixes[w]) for w in missed]
                for w in missed:
                    cache.save_from(ctx, scope, windows[w][: prefixes[w]], seq_id=w, layout="streams")
            restored = cache.use.restore_ms - restored0
            timings["cache_restore"] = timings.get("cache_restore", 0.0) + restored
            t0 += restored / 1000.0
        toks, pos, seqs = interleaved([(win[starts[w]:-1], starts[w], w) for w, win in enumerate(windows)],
                                      ctx.call_tokens)
        if toks:
            ctx.decode(toks, pos, seq_ids=seqs, logits="none", after_call=after)
            self.prefilled_tokens += len(toks)
            self.prefill_spans += [(starts[w], n - 1) for w, n in enumerate(lens) if n - 1 > starts[w]]
            if cache is not None:
                cache.use.prefilled_tokens += len(toks)
        t1 = time.perf_counter()
        t0 += self._between_s - between0
        capture = self._capture_on  # False: the same forward passes alone (the benchmark's baseline)
        if self.toggles_callback and capture:
            set_eval_callback(ctx, cap.callback)
        rows: list[dict[int, np.ndarray]] = []  # per step: il -> (P, n_head, d)
        active = np.ones((lookahead, P), dtype=bool)
        k: dict[int, np.ndarray] = {}
        cur = [win[-1] for win in windows]
        cur_pos = [n - 1 for n in lens]
        try:
            for step in range(lookahead):
                if capture:
                    cap.arm(q=True, k=self._k_mode if step == 0 else False)
                ctx.decode(cur, cur_pos, seq_ids=list(range(P)), logits="all")
                cap.disarm()
                cap.raise_error()
                if capture:
                    if step == 0:
                        k = cap.k
                    self._check_capture(k)
                    rows.append(dict(cap.q))
                if step + 1 == lookahead:
                    break
                nxt = [int(np.argmax(ctx.logits_row(i))) for i in range(P)]
                for i, t in enumerate(nxt):
                    if self.model.is_eog(t) or not active[step, i]:
                        active[step + 1 :, i] = False  # a window whose lookahead ended has fewer rows
                cur, cur_pos = nxt, [p + 1 for p in cur_pos]
        finally:
            if self.toggles_callback:
                set_eval_callback(ctx, None)
        if capture and next(iter(k.values())).shape[0] != P:
            raise EngineError("the lookahead batch did not span one KV stream per window")
        t2 = time.perf_counter()
        out = [np.ones(n, dtype=np.float32) for n in lens] if not capture else []
        for w in range(P if capture else 0):
            qw = [{il: q[w] for il, q in rows[s].items()} for s in range(len(rows)) if active[s, w]]
            out.append(self._scores(qw, k, lens[w], pool, stream=w, ctx=ctx) * np.float32(lens[w]))
        t3 = time.perf_counter()
        if keep_resident:  # each stream keeps its window's prefix for a next question (module doc)
            self._resident = keys
        else:
            ctx.clear()
        # the single-sequence context no longer matches cached_tokens' story: a model drafter rebuilds
        self.ctx.clear()
        self.cached_tokens = []
        timings["speculator_prefill"] += (t1 - t0) * 1000.0
        timings["lookahead"] += (t2 - t1) * 1000.0
        timings["score_math"] += (t3 - t2) * 1000.0
        return out

    @property
    def _k_mode(self) -> bool | str:
        return "ref" if self.score_math == "torch" else True

    def _scores(self, rows, k: dict, n_keys: int, pool: int, stream: int = 0, ctx: Context | None = None) -> np.ndarray:
        """attention_scores over the window's keys: cells 0..n_keys-1 of KV stream `stream`."""
        if self.score_math == "torch":
            from . import score_torch

            (ctx or self.ctx).synchronize()  # the K cache is read where llama.cpp wrote it
            return score_torch.attention_scores(rows, k, n_keys, pool, stream, device=self.device)
        return attention_scores(rows, {il: kk[stream] for il, kk in k.items()}, n_keys, pool)

    def _check_capture(self, k: dict) -> None:
        """Every layer's query (and, once, key) tensor must have been seen by the callback."""
        n = self.model.n_layer
        if len(self.capture.q) != n or len(k) != n:
            raise EngineError(
                f"capture saw {len(self.capture.q)} query and {len(k)} key tensors for {n} layers: "
                "this llama.cpp build names its graph tensors differently"
            )

    def _forward_only(self, tokens: Sequence[int], lookahead: int, timings: dict[str, float], t0: float, t1: float) -> np.ndarray:
        """The lookahead decodes alone (no capture, no score math)."""
        ctx, n = self.ctx, len(tokens)
        tok, pos = tokens[-1], n - 1
        for step in range(lookahead):
            ctx.decode([tok], [pos], logits="last")
            if step + 1 == lookahead:
                break
            tok, pos = int(np.argmax(ctx.logits_row(-1))), pos + 1
            if self.model.is_eog(tok):
                break
        t2 = time.perf_counter()
        ctx.seq_rm(0, n, -1)
        self.cached_tokens = list(tokens)
        timings["speculator_prefill"] += (t1 - t0) * 1000.0
        timings["lookahead"] += (t2 - t1) * 1000.0
        return np.ones(n, dtype=np.float32)

    def close(self) -> None:
        self.ctx.close()
        if self._streams is not None:
            self._streams.close()
