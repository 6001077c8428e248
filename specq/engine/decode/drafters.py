"""Drafters for speculative decoding: one class per method, built by `make_drafter`.

Every drafter implements the `Drafter` protocol of speculative.py: `propose(history, n)` returns up to
n tokens likely to follow `history` (the whole prompt + everything emitted so far) and
`accept(history, n_accepted)` is told what the target kept. Drafts only change speed: the target
verifies every drafted token (speculative.verify), so the output is the same whatever a drafter
proposes.

* `none`  — no drafter (`make_drafter` returns None): one target decode per token.
* `ngram` — prompt lookup (`NgramDrafter`): find an earlier occurrence, in prompt + output, of the
  last `ngram` tokens and propose the tokens that followed it. Match policy: among the occurrences
  the one whose preceding tokens also match the longest (up to `max_extend` more tokens) wins, ties
  go to the most recent; only the `max_candidates` most recent occurrences are looked at. What
  followed is copied LZ77-style: when it runs into the current suffix (an occurrence that overlaps
  the end of the history) it repeats with the match's period, so a repeating run proposes n tokens.
  A one-hot proposal (q = 1 on the drafted token), so it is exact under sampling too.
* `model` — the speculator drafts (`ModelDrafter`) on its own llama context. After a specprefill run
  that context already holds the last scored window's tokens (the scorer removes its lookahead
  cells); the drafter continues from that KV state instead of prefilling the prompt again — in
  windowed mode with several windows that state is [template head][last document slice][question +
  template tail], so the speculator drafts from that view of the prompt. Without scoring (baseline
  mode) it prefills the prompt itself on the first proposal (counted in decode time). Its cache is
  kept in step with what the target accepted: each `propose` compares the tokens it holds with the
  history, removes the divergent suffix (seq_rm) and decodes the missing tokens; drafted tokens are
  decoded as they are drafted, so an accepted run is already cached. With several serving slots
  each slot drafts on a speculator context of its own (`DraftCache`, Engine.draft_cache), so two
  jobs never draft on each other's KV; a scored job's drafter gets a copy of the window scoring left
  (measured: a drafter that is a copy of the target accepted 1.0 of its drafts alone and 0.04 beside
  another job when all drafted on one context; tests/test_serving.py::
  test_model_drafting_jobs_together_accept_as_alone).
  Greedy target: the speculator drafts its argmax (one-hot q). Sampling target: it draws from the
  same temperature/top-k/top-p transform of its own logits (q known, with its own seeded generator).
  `p_min` (> 0) stops a draft once the speculator's top probability falls below it (greedy: the
  plain softmax at temperature 1; sampling: the transformed q).
* `mtp` — the target's own multi-token-prediction block drafts (`MtpDrafter`, drafters_hidden.py),
  on the target's hidden states; only for a target with MTP layers (`mtp_unsupported` says why not).
* `eagle3` — an EAGLE3 head (`EngineOptions.drafter`, `--drafter PATH`) drafts on features of three
  target layers (`Eagle3Drafter`); only for llama/qwen3/qwen3moe targets.
* `auto` — a fixed rule, `resolve_auto` / `AUTO_RULE` / `AUTO_NGRAM` below: `mtp` where the target
  has MTP layers, else `eagle3` where the engine has an EAGLE3 head, else n-gram lookup with n-gram
  size max(--ngram, 3) (chosen from measurements, docs/speculative-decoding.md).

Sampling with speculation keeps the output distribution exact only for memoryless samplers
(temperature, top-k, top-p — the only ones RunParams offers); a sampler with state (repetition
penalties, mirostat, grammars) would need the speculator and verifier to replay that state per draft
position and is refused by design (there is no such option to pass).
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from ...contracts import InputError
from ..llama.binding import Context
from ..prompt.build import Prompt
from .sampling import Sampler
from .speculative import Draft, Drafter, draft_tokens

#: `--draft auto`: what it means. Measured on the 2-core CPU with the real pair (1.5B target, 0.5B
#: speculator, docs/speculative-decoding.md): n-gram lookup gave the largest decode speed-up on
#: copy-heavy jobs and costs ~nothing when it finds no match, while model drafting was slower than no
#: drafting at all on CPU (0.40-0.73x: the 0.5B speculator's per-token cost is too close to the 1.5B
#: target's). 3-grams beat 2-grams on every job measured (rename 1.93x vs 1.63x, quote 1.68x vs
#: 1.51x, free-form 1.08x vs 0.77x: spurious 2-gram matches in free text waste verification batches).
#: So `auto` = the ngram drafter with n-gram size max(--ngram, AUTO_NGRAM), on every backend; on GPU
#: model drafting is unmeasured here, ask for it explicitly. A drafter the models themselves offer
#: (an MTP block, a paired EAGLE3 head) comes first: it is what such a model was trained to draft with
#: (with real weights its acceptance rate is not measured here).
AUTO_RULE = "ngram"
AUTO_NGRAM = 3
#: `auto` picks the first of these the engine's models support
AUTO_PREFERRED = ("mtp", "eagle3")


def resolve_auto(method: str, backend: str = "cpu", available: Sequence[str] = ()) -> str:
    """The concrete drafter for `method` ("auto" → the first of AUTO_PREFERRED in `available`, else
    AUTO_RULE; others unchanged)."""
    if method != "auto":
        return method
    for m in AUTO_PREFERRED:
        if m in available:
            return m
    return AUTO_RULE


# --------------------------------------------------------------------------------------------------


class NgramDrafter:
    """Prompt lookup over prompt + output (see the module docstring for the match policy)."""

    name = "ngram"

    def __init__(self, ngram: int = 2, *, max_candidates: int = 64, max_extend: int = 32) -> None:
        if ngram < 1:
            raise InputError("ngram must be >= 1")
        self.ngram = int(ngram)
        self.max_candidates = int(max_candidates)
        self.max_extend = int(max_extend)
        self._hist: list[int] = []
        self._next_start = 0  # the next n-gram start to index
        self._index: dict[tuple[int, ...], list[int]] = {}

    def _sync(self, history: Sequence[int]) -> None:
        """Index every n-gram of history that has at least one token after it (append-only updates)."""
        h = self._hist
        if len(history) < len(h) or (h and history[len(h) - 1] != h[-1]):
            self._hist, self._index, self._next_start = [], {}, 0  # not an extension: start over
            h = self._hist
        h.extend(history[len(h) :])
        g = self.ngram
        last = len(h) - g  # starts < last have a continuation token
        for i in range(self._next_start, last):
            self._index.setdefault(tuple(h[i : i + g]), []).append(i)
        self._next_start = max(self._next_start, last)

    def propose(self, history: Sequence[int], n: int) -> Draft:
        self._sync(history)
        h, g = self._hist, self.ngram
        L = len(h)
        if n <= 0 or L <= g:
            return Draft([])
        cands = self._index.get(tuple(h[L - g :]))
        if not cands:
            return Draft([])
        best, best_ext = -1, -1
        for i in reversed(cands[-self.max_candidates :]):  # most recent first: ties keep it
            ext = 0
            while ext < self.max_extend and i - ext - 1 >= 0 and h[i - ext - 1] == h[L - g - ext - 1]:
                ext += 1
            if ext > best_ext:
                best, best_ext = i, ext
                if ext == self.max_extend:
                    break
        # copy what followed, LZ77 style: a continuation that runs into the current suffix repeats
        # with the match's period (so a repeating run proposes n tokens, not just the one cached)
        shift = L - g - best
        out: list[int] = []
        for j in range(n):
            src = L + j - shift
            out.append(h[src] if src < L else out[src - L])
        return Draft(out)

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        pass


# --------------------------------------------------------------------------------------------------


class SpeculatorCache(Protocol):
    """A speculator context and the tokens its sequence 0 holds at positions 0..len-1.

    `SpecPrefillScorer` is one (its `cached_tokens` after scoring); `DraftCache` is a plain one. A
    ModelDrafter sets `draft_owner` on it when it synchronises, so that a drafter whose job shares
    the cache with another's knows its own count of matching tokens is stale.
    """

    ctx: Context
    cached_tokens: list[int]


class DraftCache:
    """A speculator context of its own for one serving slot's model drafter (Engine.draft_cache): with
    several slots each job drafts on its slot's, never on another job's KV."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cached_tokens: list[int] = []
        #: the ModelDrafter that last synchronised the context (ModelDrafter._sync)
        self.draft_owner = None

    def close(self) -> None:
        self.ctx.close()


def is_window_view(cached: Sequence[int], prompt: Prompt) -> bool:
    """Whether `cached` is [head][a contiguous slice of the document][tail] of this prompt."""
    head, tail, doc = prompt.head, prompt.tail, prompt.document
    nh, nt = len(head), len(tail)
    if len(cached) < nh + nt or list(cached[:nh]) != head or (nt and list(cached[len(cached) - nt :]) != tail):
        return False
    middle = np.asarray(cached[nh : len(cached) - nt], dtype=np.int64)
    m = middle.size
    if m == 0:
        return len(doc) == 0
    d = np.asarray(doc, dtype=np.int64)
    if m > d.size:
        return False
    for s in np.flatnonzero(d[: d.size - m + 1] == middle[0]):
        if np.array_equal(d[s : s + m], middle):
            return True
    return False


class ModelDrafter:
    """The speculator drafts on its own context (see the module docstring)."""

    name = "model"

    def __init__(
        self,
        cache: SpeculatorCache,
        prompt_view: Sequence[int],
        n_prompt: int,
        *,
        sampler: Sampler | None = None,
        p_min: float = 0.0,
    ) -> None:
        """prompt_view: the tokens standing for the prompt in the speculator's cache (the whole prompt,
        or the scored window); n_prompt: the prompt's real length (history[n_prompt:] is output)."""
        self.cache = cache
        self.ctx = cache.ctx
        self.model = cache.ctx.model
        self.prompt_view = list(prompt_view)
        self.n_prompt = int(n_prompt)
        self.sampler = sampler if sampler is not None and not sampler.greedy else None
        self.p_min = float(p_min)
        self._synced = 0  # leading tokens of the view known to match the cache ...
        self._synced_on: list[int] | None = None  # ... as this list held them after this drafter's last sync
        #: wall-clock spent decoding the prompt view (baseline runs: the drafter's own prompt prefill,
        #: inside the run's `decode` phase); the run result reports it as timings_ms["draft_prefill"]
        self.prefill_ms = 0.0
        self.prefilled_tokens = 0

    def _view(self, history: Sequence[int]) -> list[int]:
        return self.prompt_view + list(history[self.n_prompt :])

    def _sync(self, view: list[int]) -> np.ndarray | None:
        """Make the cache hold view[:-1] + view[-1] and return the logits after view[-1] (None: full)."""
        ctx, cached = self.ctx, self.cache.cached_tokens
        if ctx.seq_pos_max(0) != len(cached) - 1:  # someone else used the context: trust nothing
            ctx.clear()
            cached.clear()
            self._synced = 0
        if self._synced_on is not cached or getattr(self.cache, "draft_owner", None) is not self:
            # another drafter (a job sharing this cache) or the scorer (a new list) wrote it since this
            # drafter's last sync: the counter says nothing about what it holds now, compare from 0
            self._synced = 0
        if len(view) > ctx.n_ctx:
            return None
        start = min(self._synced, len(cached), len(view))
        c = start
        limit = min(len(cached), len(view) - 1)
        if c < limit:
            a = np.asarray(cached[c:limit], dtype=np.int64)
            b = np.asarray(view[c:limit], dtype=np.int64)
            diff = np.flatnonzero(a != b)
            c = c + (int(diff[0]) if diff.size else a.size)
        c = min(c, len(view) - 1)  # always decode the last token: its logits are needed
        if c < len(cached):
            ctx.seq_rm(0, c, -1)
            del cached[c:]
        todo = view[c:]
        t0 = time.perf_counter()
        ctx.decode(todo, range(c, c + len(todo)), logits="last")
        cached.extend(todo)
        if len(todo) > 1 and c < len(self.prompt_view):
            self.prefill_ms += (time.perf_counter() - t0) * 1000.0
            self.prefilled_tokens += len(todo)
        self._synced = len(view)
        self._synced_on = cached
        self.cache.draft_owner = self
        return ctx.logits_row(-1)

    def propose(self, history: Sequence[int], n: int) -> Draft:
        if n <= 0:
            return Draft([])
        view = self._view(history)
        logits = self._sync(view)
        if logits is None:
            return Draft([])
        ctx, cached = self.ctx, self.cache.cached_tokens

        def step(d: int) -> np.ndarray | None:
            if len(cached) + 1 > ctx.n_ctx:
                return None
            ctx.decode([d], [len(cached)], logits="last")
            cached.append(d)
            return ctx.logits_row(-1)

        return draft_tokens(logits, n, self.sampler, self.p_min, self.model.is_eog, step)

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        pass  # the next propose() re-synchronises the cache with the history


# --------------------------------------------------------------------------------------------------


def draft_sampler(temperature: float, top_k: int, top_p: float, seed: int) -> Sampler:
    """The speculator's sampler: the target's transform with its own generator (seeded from `seed`)."""
    return Sampler(temperature, top_k, top_p, (seed + 0x5EED) % (2**32) if seed >= 0 else -1)


def make_drafter(
    method: str,
    prompt: Prompt,
    *,
    ngram: int = 2,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = -1,
    p_min: float = 0.0,
    backend: str = "cpu",
    speculator_cache: Callable[[], SpeculatorCache] | None = None,
    scored: bool = False,
    hidden_drafters: Mapping[str, Callable[[], tuple[Context, dict]]] | None = None,
    unavailable: Mapping[str, str] | None = None,
    seq: int = 0,
) -> Drafter | None:
    """The drafter for `method` (none/ngram/model/mtp/eagle3/auto), or None for none.

    speculator_cache: returns the speculator context to draft on (called only for `model`).
    scored: the run scored this prompt, so the cache may hold a scored window to continue from.
    hidden_drafters: for `mtp` / `eagle3`, a function per method the engine's models support,
        returning its drafting context and the drafter's extra arguments (pipeline.py).
    unavailable: why a method is not supported (quoted when it is asked for).
    seq: the drafter's sequence in its context (one per job being decoded).
    """
    hidden = dict(hidden_drafters or {})
    if method == "auto":
        method = resolve_auto(method, backend, [m for m in AUTO_PREFERRED if m in hidden])
        if method == AUTO_RULE:
            ngram = max(ngram, AUTO_NGRAM)
    if method == "none":
        return None
    if method == "ngram":
        return NgramDrafter(ngram)
    if method == "model":
        if speculator_cache is None:
            raise InputError("draft model needs a speculator")
        cache = speculator_cache()
        view = prompt.tokens
        if scored and is_window_view(cache.cached_tokens, prompt):
            view = list(cache.cached_tokens)
        sampler = draft_sampler(temperature, top_k, top_p, seed) if temperature > 0 else None
        return ModelDrafter(cache, view, prompt.n, sampler=sampler, p_min=p_min)
    if method in ("mtp", "eagle3"):
        from .drafters_hidden import Eagle3Drafter, MtpDrafter

        if method not in hidden:
            why = (unavailable or {}).get(method) or "the engine has no model for it"
            raise InputError(f"draft {method} is not available: {why}")
        ctx, extra = hidden[method]()
        sampler = draft_sampler(temperature, top_k, top_p, seed) if temperature > 0 else None
        cls = MtpDrafter if method == "mtp" else Eagle3Drafter
        return cls(ctx, seq=seq, sampler=sampler, p_min=p_min, **extra)
    raise InputError(f"unknown draft method {method!r} (none, ngram, model, mtp, eagle3 or auto)")


__all__ = [
    "AUTO_NGRAM", "AUTO_PREFERRED", "AUTO_RULE", "DraftCache", "ModelDrafter", "NgramDrafter", "SpeculatorCache", "is_window_view",
    "make_drafter", "resolve_auto",
]
