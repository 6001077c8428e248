"""Every knob of the engine, documented in one place.

`EngineOptions` are fixed when models are loaded (one per worker process); `RunParams` are chosen per
job. The CLI's long options and the API's `params` keys are these field names (`--max-tokens` is
`max_tokens`), so one validation serves both.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from ..contracts import InputError
from . import json_schema

Mode = Literal["auto", "baseline", "specprefill"]
Positions = Literal["original", "compressed"]
Scorer = Literal["windowed", "sliding", "full"]
Draft = Literal["none", "ngram", "model", "mtp", "eagle3", "auto"]
Selection = Literal["global", "per-window"]
ChunkRule = Literal["border", "mean", "scope", "block"]
#: a job's task kind (RunParams.task); "" = not declared
TaskKind = Literal["", "lookup", "two-place", "aggregation", "review", "summary"]
SpeculatorImpl = Literal["auto", "llama", "torch"]
#: the chunk rules (selection.rank_scores) and the default one: named here once
CHUNK_RULES: tuple[str, ...] = typing.get_args(ChunkRule)
DEFAULT_CHUNK_RULE: ChunkRule = "border"

#: document tokens per window when the caller leaves it to us; overridable per job (`window`). Kept
#: after the recall benchmark compared sizes on the real pair (docs/history.md, "Window size", `mean` rule): at
#: 8K tokens, 200 questions, keep 0.3, windows of 2,048 / 4,096 / one 8K window kept every evidence
#: chunk for 0.845 / 0.860 / 0.840 of the questions (paired differences within noise), and fewer
#: windows cost fewer lookahead passes. Answer accuracy per size was not measured.
DEFAULT_WINDOW = 4096
#: a document of at most this many tokens is scored in ONE window when the job leaves the window to us
#: (`window` 0) and it fits the speculator's context; longer ones in DEFAULT_WINDOW slices. Under the
#: `border` chunk rule one pass kept the evidence of more 8K questions than two 4,096-token windows
#: (docs/history.md, "One pass against windows": recall 0.965 vs 0.935 at keep 0.3, 6 / 0 discordant,
#: all `raises` questions whose two evidence lines the windows split) and answered as well (8K answer
#: ratio 1.129, lower bound 0.996, "One pass up to 8,192 tokens"). Cost: on the H200 one pass took 500 vs
#: 494 ms at 16K and 1,070 vs 1,176 ms at 32K (8K not measured); on the CPU 15-35% more scoring for a cold
#: 8K document. Not raised further: at 16K neither two windows of 8,192 nor one pass (104 questions)
#: kept more than four of 4,096, and a cold 16K pass cost ~4.5x the windows' scoring on the CPU.
ONE_PASS_TOKENS = 2 * DEFAULT_WINDOW


@dataclass
class EngineOptions:
    """How models are loaded and their contexts built (defaults are for GPU use)."""

    #: target model: a registry name (pulled on first use) or a path to a GGUF file
    target: str = "qwen2.5-coder-1.5b-instruct-q4_k_m"
    #: speculator/drafter model (same tokenizer as the target): registry name or path
    speculator: str = "qwen2.5-coder-0.5b-instruct-q4_k_m"
    #: an EAGLE3 head paired with the target (GGUF path or registry name) for `--draft eagle3`;
    #: "" = none. Loaded on first use; needs a llama/qwen3/qwen3moe target (drafters_hidden.py)
    drafter: str = ""
    #: layers offloaded to the GPU; -1 = all (ignored by a CPU-only build)
    n_gpu_layers: int = -1
    #: flash attention; scores are recomputed from Q and K, so it can stay on while scoring (the
    #: target's is always on in batch-invariant mode, see batch_invariant)
    flash_attn: bool = True
    #: context size in tokens for the target (per job: each serving slot may hold this much); 0 = the
    #: model's training context capped at 32768; a larger value is served up to the model's training
    #: context (128K: SPECQ_N_CTX=131072 with a model trained for it)
    n_ctx: int = 0
    #: jobs the target decodes together (serving slots, engine/serving/loop.py): its context holds one
    #: sequence per slot, each in a KV stream of its own of n_ctx cells. 1 = one job at a time
    slots: int = 1
    #: with slots > 1: one unified KV cache of slots x n_ctx cells instead of one stream per slot
    #: (every decode row then attends over all slots' cells, masked; greedy output is no longer the
    #: same as alone on the CPU, see engine/serving/loop.py). For measuring the layouts against each other
    kv_unified: bool = False
    #: largest batch handed to llama_decode; prefills are split into batches of at most this size
    n_batch: int = 4096
    #: physical micro-batch; 0 = 2048 on a GPU build, 512 on CPU
    n_ubatch: int = 0
    #: most tokens per llama_decode call of a prefill (the target's and the speculator's windows):
    #: a job's cancel and time limit are checked between calls (engine/llama/stop.py), so this bounds how
    #: long a cancel waits where llama.cpp cannot abort a call (GPU); 0 = per backend (512 on the CPU,
    #: 2,048 on a GPU: 0.74 s at most for the 7B shape at 128K on an H200; docs/engine.md, "Cancel and
    #: the time limit")
    call_tokens: int = 0
    #: CPU threads; 0 = all cores
    n_threads: int = 0
    #: let llama.cpp repack the target's weights into CPU-specific layouts. Their kernels switch from
    #: gemv to gemm with the batch size (a token verified in a batch of drafts gets logits up to ~0.5
    #: apart from the same token decoded alone). Only used when batch_invariant resolves to off.
    repack: bool = True
    #: batch-invariant target numerics (specq/engine/llama/invariance.py): no repacking, flash attention on,
    #: q8_0 K cache, verification batches <= 7 tokens, so a token's logits do not depend on how many
    #: tokens were decoded with it and greedy speculative decoding gives exactly --draft none's tokens
    #: (at any thread count and context length; CPU kernels only). auto (default) = off everywhere:
    #: measured on the 2-core CPU vs off, decode ~15% slower at 400 tokens, ~2% at 2K+, prefill +10%
    #: at 2K, -19% at 4.4K, -33% at 7.8K (docs/speculative-decoding.md) — a cost every job would pay
    #: for a guarantee only drafting jobs use; on = the mode (a worker whose drafting jobs must match
    #: --draft none); off = repack/flash_attn as given, f16 K cache.
    batch_invariant: Literal["auto", "on", "off"] = "auto"
    #: scoring windows run together as parallel sequences of the speculator, each in its own KV
    #: stream (one batch per lookahead step for all of them); 1 = one window at a time; 0 = 8 on a
    #: GPU build, 1 on CPU (where batching the lookahead saves little). Costs a second speculator
    #: context of n_parallel × 5,120 cells.
    n_parallel: int = 0
    #: where the scoring math runs: numpy (host; K cache copied there), torch (PyTorch on the
    #: speculator's own device, K cache read in place: 1.4 s → milliseconds at 32K on the H200),
    #: auto = torch when the models are on a GPU and PyTorch with CUDA is importable, else numpy
    score_math: Literal["auto", "numpy", "torch"] = "auto"
    #: who runs the speculator's scoring windows: llama (llama.cpp) or torch (a PyTorch forward of the same
    #: GGUF, dequantized: scoring/torch_speculator.py; a document's windows together on a GPU, one at a time
    #: on the CPU; no speculator cache, so a document's next question scores its windows again; its score
    #: math is numpy on the CPU and on the device on a GPU, whatever score_math says). auto: torch where the
    #: models are on a GPU and the forward can run there (PyTorch with CUDA, a GGUF architecture it
    #: implements), llama otherwise (faster on an H100: docs/benchmarks.md "Issue 50's goals"; the CPU's
    #: evidence rows were measured with llama.cpp's). Part of the evidence key (score_math "torch-speculator")
    speculator_impl: SpeculatorImpl = "auto"
    #: bytes of host memory for saved KV states: the speculator's document windows (spec_cache.py)
    #: and the target's prompt prefixes (prefix_cache.py), one LRU budget; 0 = no caches (the
    #: default for the CLI and benchmarks; the worker's SPECQ_CACHE_BYTES defaults to 2 GiB)
    cache_bytes: int = 0
    #: a directory that mirrors those saved states (engine/cache/disk.py): a new engine loads the newest
    #: that fit cache_bytes, so the caches outlive a restart; "" = host memory only
    cache_dir: str = ""
    #: which of the speculator's scoring windows are saved to that cache (spec_cache.py, "Which windows
    #: are saved"): always (every window prefilled: a further question about any document hits) or
    #: repeat (a stored document's at once, any other's only at its second sight, so a one-off
    #: document costs no device-to-host copy: ~400 MB per 32K-token document with a 0.5B speculator,
    #: on the serving loop's thread; docs/serving.md "Where the time goes"). Scores and kept tokens
    #: are the same under both
    spec_cache_save: Literal["always", "repeat"] = "always"
    #: mode auto: prompts shorter than this run baseline; 0 = the measured break-even of the backend
    #: (engine/policy/auto.py BREAK_EVEN_TOKENS, docs/engine.md)
    auto_min_tokens: int = 0
    #: mode auto: -1 (default) = specprefill only at the prompt lengths where a passing evidence row was
    #: measured with exactly the job's resolved settings (engine/policy/evidence.py, evidence_key.py; none of the
    #: shipped rows passes); >= 0 = an operator's override (their own measurement): specprefill from this
    #: many prompt tokens on, whatever the evidence; such jobs' reasons say "operator override"
    auto_quality_min_tokens: int = -1
    #: mode auto rule 1a (engine/policy/auto.py): questions about a stored document served together (a worker's
    #: group claim, or in the serving loop at once), and that document's later questions, run as
    #: group-sparse prefill from this many prompt tokens on, where the group path's own answers were
    #: measured to hold (evidence rows of arm "group"; none passes) and the serving loop's
    #: group-sparse prefill is on (SPECQ_GROUP_SPARSE); 0 = the backend's measured length
    #: (auto.GROUP_MIN_TOKENS: CUDA only), -1 = never (each takes rule 1b: baseline + prompt cache)
    auto_group_min_tokens: int = 0
    #: the target's GPU: an index among the visible devices (llama.cpp's main_gpu); used with
    #: speculator_gpu, when both models are each placed whole on one device (split mode none)
    main_gpu: int = 0
    #: the speculator's own GPU, an index among the visible devices; -1 = wherever the target is
    #: (the default: llama.cpp's placement, layers split over the visible devices). >= 0: each model
    #: whole on its device (split mode none, main_gpu), and the torch score math runs on the
    #: speculator's device. No effect on a CPU build. `specq worker --gpu N --speculator-gpu M` makes
    #: both devices visible (CUDA_VISIBLE_DEVICES=N,M) and sets main_gpu 0, speculator_gpu 1.
    speculator_gpu: int = -1
    #: CUDA graphs for the models' decodes (ggml's CUDA backend; no effect on a CPU build). One
    #: setting per process: ggml reads GGML_CUDA_DISABLE_GRAPHS once, at the first graph it
    #: computes, and the engine sets or clears that variable before it loads a model
    #: (llama.set_cuda_graphs). Off by default: on the H200 (7B + 0.5B shapes) with graphs on,
    #: `specq bench ttft` at 32K — baseline and specprefill jobs alternating in one engine — ended in
    #: "an illegal instruction was encountered" (ggml_cuda_graph_evaluate_and_capture) at the 4th
    #: pair in 5 runs of 5; with them off the same run finished, and 8 slots served 24 jobs of 32K at
    #: 27.1 jobs/min against 26.8 with graphs on (docs/engine.md, "CUDA graphs").
    cuda_graphs: bool = False

    def resolved_threads(self) -> int:
        return self.n_threads or (os.cpu_count() or 1)


#: the kinds of question a job may declare (RunParams.task); evidence rows are per kind (docs/quality.md "Task kinds")
TASK_KINDS: tuple[str, ...] = typing.get_args(TaskKind)[1:]
#: who may run the speculator's scoring windows (EngineOptions.speculator_impl less auto, which picks one of them)
SPECULATOR_IMPLS: tuple[str, ...] = tuple(x for x in typing.get_args(SpeculatorImpl) if x != "auto")


#: the keep a specprefill run uses where the job sets none and no certified keep applies (RunParams.keep)
DEFAULT_KEEP = 0.3


@dataclass
class RunParams:
    """What one job asks for. Unknown keys are refused by `RunParams.from_dict`."""

    #: the question asked about the document (placed after it, inside the chat template)
    question: str = ""
    #: baseline = prefill every token; specprefill = score, keep the top chunks, prefill those;
    #: auto = the cheapest path measured safe (engine/policy/auto.py: a prompt-cache hit, baseline below the
    #: break-even length, specprefill for long documents where its quality was measured)
    mode: Mode = "auto"
    #: original = kept tokens keep their position ids (needs our patched llama.cpp);
    #: compressed = kept tokens renumbered 0..K-1 (what a stock build can do)
    positions: Positions = "original"
    #: fraction of the document's chunks kept by specprefill; None (unset) = mode auto runs the keep
    #: `specq calibrate` certified for the prompt's length band and the job's settings (engine/policy/
    #: evidence.certified_keep), else DEFAULT_KEEP; an explicit `mode specprefill` runs DEFAULT_KEEP
    keep: Optional[float] = None
    #: tokens per chunk for selection
    chunk: int = 32
    #: cap on kept document tokens (lowest-ranked chunks dropped beyond it); 0 = no cap
    max_keep: int = 0
    #: prompts shorter than this run baseline even in specprefill mode (and in auto mode: its
    #: break-even); -1 = the engine's default
    min_tokens: int = -1
    #: lookahead query rows (the last prompt token + lookahead-1 greedy tokens)
    lookahead: int = 8
    #: average-pool kernel along the sequence applied to attention scores (odd; 1 = off)
    pool: int = 13
    #: how long prompts are scored: windowed (default), sliding (the seed's), full (one pass)
    scorer: Scorer = "windowed"
    #: document tokens per scoring window; 0 = automatic: the whole document in one window up to
    #: 8,192 tokens (ONE_PASS_TOKENS), else 4,096 (DEFAULT_WINDOW); never more than the
    #: speculator's context holds
    window: int = 0
    #: how specprefill spends the keep budget: global (the top `keep` share of the whole document's
    #: chunks) or per-window (the top `keep` share of each scoring window's chunks, chunks cut from the
    #: window's start; needs the windowed or full scorer). docs/history.md "Per-window selection" compares the two
    selection: Selection = "global"
    #: how chunks are ranked (selection.rank_scores): border (the default: the larger of a chunk's mean
    #: score and the means of the two chunk-sized spans straddling its borders, so a sentence the grid
    #: cuts in two is kept whole), mean (each chunk's mean score, the rule before 2026-12-04) or scope
    #: (border, then a header line, the nearest less-indented line above a line, ranks at least 3/4 of
    #: that line's chunk, so code keeps the `def` of a kept `raise`; blocks.py: better recall, worse
    #: answers at 4K, so not the default).
    #: docs/history.md "Chunk borders" and "Header lines" measure them; mode auto's quality bands are per rule
    chunk_rule: ChunkRule = DEFAULT_CHUNK_RULE
    #: the kind of question (TASK_KINDS: lookup, two-place, aggregation, review, summary): mode auto then reads
    #: that kind's evidence rows only; "" (not declared): auto runs specprefill only at lengths where every kind
    #: is measured and passes (engine/policy/evidence.py; docs/quality.md "Task kinds")
    task: TaskKind = ""
    #: specprefill with per-window selection: the target prefills each window's chunks while the
    #: speculator scores the next one (two threads; the same kept set and answer as the serial run
    #: with per-window selection). Pays off with the speculator on its own GPU (--speculator-gpu)
    pipelined: bool = False
    #: tokens to generate at most
    max_tokens: int = 256
    #: keep generating past end-of-generation tokens (benchmarks: exactly max_tokens output tokens,
    #: as llama-server's ignore_eos); stop strings still end a generation
    ignore_eos: bool = False
    #: 0 = greedy; > 0 samples
    temperature: float = 0.0
    #: 0 = off
    top_k: int = 0
    #: 1.0 = off
    top_p: float = 1.0
    #: seed for sampling (and anything random); -1 = from the clock
    seed: int = -1
    #: drafter for speculative decoding
    draft: Draft = "none"
    #: tokens drafted per verification batch
    n_draft: int = 4
    #: skip drafts shorter than this
    draft_min: int = 1
    #: model drafts stop once the draft's top probability falls below this; 0 = off
    p_min: float = 0.0
    #: n-gram size matched by the ngram drafter
    ngram: int = 2
    #: optional system message for the chat template
    system: str = ""
    #: stop strings (at most 4): generation ends before the first one the answer would contain, and
    #: the answer's text ends just before it (finish_reason "stop")
    stop: list[str] = field(default_factory=list)
    #: chat and completion jobs: tokens at the end of the last user message that scoring never drops
    #: (they are its question); -1 = its last paragraph, at most 256 tokens. Native jobs protect their
    #: whole question instead.
    protect_tail: int = -1
    #: constrain the output to this JSON Schema (grammar-constrained sampling, engine/decode/grammar.py;
    #: the supported keywords: engine/json_schema.py); {"type": "object"} = any JSON object (OpenAI's
    #: response_format json_object); null = free text
    json_schema: dict[str, Any] | None = None
    #: chat jobs: the tool definitions offered to the model (OpenAI's {"type": "function", "function":
    #: {name, description, parameters}}), rendered by the model's own chat template where it renders tools,
    #: else in the Hermes system-message format (engine/prompt/tools.py); never dropped by scoring
    tools: list[dict[str, Any]] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "RunParams":
        """Build from API/CLI keys; unknown keys or bad values raise InputError with a message."""
        if data is None:
            data = {}
        elif not isinstance(data, Mapping):  # `[]`, `false`, `0`, `""` are not "no params"
            raise InputError(f"params must be an object of parameters, not {type(data).__name__}")
        data = dict(data)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k)[:40] for k in set(data) - names)
        if unknown:
            shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
            raise InputError(f"unknown parameter(s): {shown} (known: {', '.join(sorted(names))})")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data or data[f.name] is None:
                continue
            kwargs[f.name] = _coerce(f.name, f.type, data[f.name])
        params = cls(**kwargs)
        params.validate()
        return params

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Raise InputError for the first value out of range (PARAM_BOUNDS, then the rules no single
        range can say: odd pools, windows of 0 or >= 64 tokens, texts within MAX_PROMPT_TEXT_BYTES)."""
        for name, bound in PARAM_BOUNDS.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL_PARAMS:  # unset: the engine chooses (RunParams.keep)
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise InputError(f"{name} must be a finite number")
            if not bound.holds(value):
                raise InputError(f"{name} must be {bound.describe()}")
        for name, choices in PARAM_CHOICES.items():
            if getattr(self, name) not in choices:
                raise InputError(f"{name} must be {_or(choices)}")
        checks: list[tuple[bool, str]] = [
            (self.pool % 2 == 1, "pool must be an odd number >= 1"),
            (self.window == 0 or self.window >= 64, "window must be 0 (auto) or >= 64 tokens"),
            (self.task == "" or self.task in TASK_KINDS, f"task must be {_or(TASK_KINDS)} (or left out: not declared)"),
            (isinstance(self.pipelined, bool), "pipelined must be true or false"),
            (not self.pipelined or self.selection == "per-window",
             "pipelined needs selection per-window (a window's chunks are chosen as soon as it is scored)"),
            (self.selection != "per-window" or self.scorer in ("windowed", "full"),
             "selection per-window needs the windowed or full scorer (sliding windows overlap)"),
        ]
        for ok, message in checks:
            if not ok:
                raise InputError(message)
        if not isinstance(self.stop, list) or len(self.stop) > MAX_STOP_STRINGS:
            raise InputError(f"stop must be a list of at most {MAX_STOP_STRINGS} strings")
        if self.json_schema is not None:
            json_schema.check(self.json_schema)
            if self.ignore_eos:
                raise InputError("ignore_eos cannot be used with json_schema (the output ends where the schema's "
                                 "JSON ends)")
        if self.tools is not None:
            _check_tools(self.tools)
        for text in self.stop:
            if not isinstance(text, str) or not text:
                raise InputError("stop strings must be non-empty strings")
            if len(text.encode("utf-8", "surrogatepass")) > MAX_STOP_BYTES or "\x00" in text:
                raise InputError(f"a stop string must be at most {MAX_STOP_BYTES} bytes of UTF-8 without NUL")
        for name in ("question", "system", *(f"stop[{i}]" for i in range(len(self.stop)))):
            text = self.stop[int(name[5:-1])] if name.startswith("stop[") else getattr(self, name)
            if "\x00" in text:
                raise InputError(f"{name} contains a NUL character")
            try:
                size = len(text.encode("utf-8"))
            except UnicodeEncodeError:
                raise InputError(f"{name} contains lone surrogates; send UTF-8 text") from None
            if size > MAX_PROMPT_TEXT_BYTES:
                raise InputError(f"{name} is {size} bytes, over the limit of {MAX_PROMPT_TEXT_BYTES} bytes")


@dataclass(frozen=True)
class Bound:
    """An inclusive range [lo, hi] of a numeric parameter (`lo_open`: lo itself excluded, and so on)."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def holds(self, value: float) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def describe(self) -> str:
        return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _or(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1]


#: the largest question or system message, UTF-8 bytes (the document has SPECQ_MAX_INPUT_BYTES)
MAX_PROMPT_TEXT_BYTES = 64 * 1024
#: stop strings per job, and the longest one (UTF-8 bytes)
MAX_STOP_STRINGS = 4
MAX_STOP_BYTES = 256
#: protect_tail's cap when it is -1 (the last paragraph of the last user message, at most this many tokens)
DEFAULT_PROTECT_TAIL = 256
#: the largest signed 32-bit integer: what llama.cpp and numpy take for counts of tokens
INT32_MAX = 2**31 - 1

#: every numeric parameter's range; the one place its upper bound is set. The API's schema
#: (specq.api.schemas) is built from it, so /openapi.json states the same ranges.
#: Bounds that cap memory the run would need before it starts: `pool` (scoring pads each
#: (layer x head x lookahead row) score vector by pool - 1: 1,000,001 cost 39 s and 1.8 GB on a
#: 30-token document), `lookahead` and `n_draft` (rows and batch sizes the contexts are built for),
#: `chunk`; a `window` or `max_keep` above the context is cut to it by the engine, bounded here to
#: keep the numbers 32-bit.
PARAM_BOUNDS: dict[str, Bound] = {
    "keep": Bound(0.0, 1.0, lo_open=True),
    "chunk": Bound(1, 4096),
    "max_keep": Bound(0, INT32_MAX),
    "min_tokens": Bound(-1, INT32_MAX),
    "lookahead": Bound(1, 64),
    "pool": Bound(1, 1023),
    "window": Bound(0, 1 << 20),
    "max_tokens": Bound(1, 32768),
    "temperature": Bound(0.0, 10.0),
    "top_k": Bound(0, INT32_MAX),
    "top_p": Bound(0.0, 1.0, lo_open=True),
    "seed": Bound(-1, 2**63 - 1),
    "n_draft": Bound(1, 64),
    "draft_min": Bound(1, 64),
    "p_min": Bound(0.0, 1.0, hi_open=True),
    "ngram": Bound(1, 16),
    "protect_tail": Bound(-1, 1 << 20),
}
#: numeric parameters that may be left unset (None): the engine then chooses the value
OPTIONAL_PARAMS = ("keep",)
#: the choices of each text-valued option (the Literal types above)
PARAM_CHOICES: dict[str, tuple[str, ...]] = {
    "mode": typing.get_args(Mode),
    "positions": typing.get_args(Positions),
    "scorer": typing.get_args(Scorer),
    "draft": typing.get_args(Draft),
    "selection": typing.get_args(Selection),
    "chunk_rule": CHUNK_RULES,
}


#: the most tool definitions a job may offer
MAX_TOOLS = 128
#: OpenAI's rule for function names (a chat template may write a name as its own text)
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def json_strings(value: Any):
    """Every string (keys too) inside a JSON value (a tool definition or call: each is checked as text)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from json_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from json_strings(v)


def _check_tools(tools: list[dict[str, Any]]) -> None:
    """Each tool is {"type": "function", "function": {name, description?, parameters?}} with a name and a
    parameters schema the allowlist takes (the API checks the same, with OpenAI's words)."""
    if len(tools) > MAX_TOOLS:
        raise InputError(f"tools must hold at most {MAX_TOOLS} functions")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (tool.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str)
                or not _TOOL_NAME.match(fn["name"])):
            raise InputError(f'tools[{i}] must be {{"type": "function", "function": {{"name": …, "parameters": …}}}}')
        if not isinstance(fn.get("description", ""), str):
            raise InputError(f"tools[{i}].function.description must be a string")
        if "parameters" in fn:
            json_schema.check(fn["parameters"], f"tools[{i}].function.parameters")
        for text in json_strings(tool):
            if "\x00" in text:  # PostgreSQL's JSONB cannot hold it
                raise InputError(f"tools[{i}] contains a NUL character")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InputError(f"tools[{i}] contains lone surrogates; send UTF-8 text") from None


def _coerce(name: str, type_name: Any, value: Any) -> Any:
    """Coerce a JSON/CLI value to the field's type, with a message naming the field."""
    type_name = str(type_name)
    if type_name.startswith("Optional["):  # None never gets here (from_dict skips it: unset)
        type_name = type_name[len("Optional["):-1]
    if type_name.startswith("dict["):
        if not isinstance(value, dict):
            raise InputError(f"parameter {name} must be a JSON object")
        return value
    if type_name.startswith("list[dict"):
        if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
            raise InputError(f"parameter {name} must be a list of JSON objects")
        return list(value)
    if type_name == "list[str]":
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise InputError(f"parameter {name} must be a list of strings")
        return list(value)
    try:
        if type_name == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if type_name == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if type_name == "bool":
            if isinstance(value, bool):
                return value
            raise ValueError
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError, OverflowError):
        shown = repr(value)
        raise InputError(f"parameter {name} has a bad value: {shown if len(shown) <= 60 else shown[:57] + '...'}") from None


ENGINE_OPTION_NAMES = tuple(f.name for f in dataclasses.fields(EngineOptions))
RUN_PARAM_NAMES = tuple(f.name for f in dataclasses.fields(RunParams))

__all__ = ["EngineOptions", "RunParams", "json_strings", "DEFAULT_KEEP", "OPTIONAL_PARAMS", "TASK_KINDS", "SPECULATOR_IMPLS", "ENGINE_OPTION_NAMES", "RUN_PARAM_NAMES", "PARAM_BOUNDS", "PARAM_CHOICES",
           "MAX_PROMPT_TEXT_BYTES", "Bound", "MAX_STOP_STRINGS",
           "MAX_STOP_BYTES", "DEFAULT_PROTECT_TAIL"]
