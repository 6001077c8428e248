"""The engine: models loaded once, then runs of tokenize → score → select → sparse prefill → decode.

`Engine.run()` is the single entry point for the CLI, the worker and the benchmarks. Its progress
callback is called between phases, per scoring window and per decoded token; raising RunCancelled
(or any exception) from it stops the run there. Its `stop` (engine/stop.py) is also checked before
every llama_decode call, and cuts a running one (CPU).
"""

from __future__ import annotations

from .llama import Context, Model, backend_name, supports_position_gaps  # isort: skip  (llama_cpp first)
from .llama_ext import set_hidden_output  # isort: skip
from .drafters_hidden import mtp_unsupported, open_eagle3_context, open_mtp_context  # isort: skip

import time
from pathlib import Path
from typing import Callable

import numpy as np

from . import invariance
from .decode import generate
from ..contracts import InputError, ModelError
from .kept_spans import selection_record
from .options import EngineOptions, RunParams
from .prefill import sparse_prefill
from .chat_prompt import build_chat_prompt, build_raw_prompt
from .prompt import Prompt, build_prompt
from .result import CORE_PHASES, DraftInfo, EngineInfo, RunResult, SpecInfo, Usage
from .sampling import Sampler
from .stop import Stop, running
from .textstream import TextStream

Progress = Callable[[str, int, int], None]
#: receives the answer's text as it becomes final (TextStream: whole characters, stop strings applied)
OnText = Callable[[str], None]

#: prompts shorter than this run baseline in specprefill mode (scoring costs more than it saves);
#: measured break-even on a 2-core CPU with the real pair, see docs/benchmarks.md
DEFAULT_MIN_TOKENS = 1024
#: the target's context when the model's training context is larger
MAX_DEFAULT_CTX = 32768
#: EngineOptions.call_tokens = 0: tokens per prefill llama_decode call, about 0.5 s of work on each
#: backend (measured: docs/engine.md, "Cancel and the time limit")
DEFAULT_CALL_TOKENS = {"cpu": 64, "gpu": 2048}


def default_call_tokens(backend: str) -> int:
    return DEFAULT_CALL_TOKENS["cpu" if backend == "cpu" else "gpu"]


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


class Engine:
    """Loads the target (and, on first need, the speculator) once; `run()` many times."""

    def __init__(self, options: EngineOptions | None = None, *, pull_progress: Callable[[int, int], None] | None = None) -> None:
        from .models import resolve_model

        self.options = opts = options or EngineOptions()
        self._pull_progress = pull_progress
        self.target_path = Path(resolve_model(opts.target, progress=pull_progress))
        backend = backend_name()
        #: the target's numerics: batch-invariant mode or as the options say (invariance.py)
        self.numerics = num = invariance.resolve(opts, backend)
        # MTP layers load with the trunk when the file has them (a model without any is unaffected)
        self.target = Model(self.target_path, n_gpu_layers=opts.n_gpu_layers, repack=num.repack, load_mtp=True)
        self.n_ctx = opts.n_ctx or min(self.target.n_ctx_train or MAX_DEFAULT_CTX, MAX_DEFAULT_CTX)
        self.n_ubatch = opts.n_ubatch or (2048 if backend != "cpu" else 512)
        on_cpu = invariance.on_cpu(opts, backend)
        #: tokens per prefill call (EngineOptions.call_tokens)
        self.call_tokens = opts.call_tokens or default_call_tokens("cpu" if on_cpu else backend)
        # the target prefills sparsely at original positions: its context (and the drafters' that
        # follow its positions) accept gaps; every other context keeps llama.cpp's stock checks
        self.ctx = Context(
            self.target,
            n_ctx=self.n_ctx,
            n_batch=opts.n_batch,
            n_ubatch=self.n_ubatch,
            n_threads=opts.resolved_threads(),
            flash_attn=num.flash_attn,
            type_k=num.type_k,
            position_gaps=True,
            call_tokens=self.call_tokens,
        )
        self.gaps_supported = self.ctx.position_gaps and supports_position_gaps(self.target)
        #: why `--draft mtp` cannot run here ("" = it can: the target's hidden states are then output
        #: on every run, drafting or not, so --draft none and mtp runs share the target's numerics)
        self.mtp_unsupported = mtp_unsupported(self.target)
        if not self.mtp_unsupported:
            set_hidden_output(self.ctx, True, masked=False)
        self.info = EngineInfo(
            n_gpu_layers=self.target.n_gpu_layers,
            flash_attn=num.flash_attn,
            n_batch=self.ctx.n_batch,
            n_ubatch=self.ctx.n_ubatch,
            call_tokens=self.ctx.call_tokens,
            backend=backend,
            target=self.target_path.name,
            speculator="",
            batch_invariant=num.batch_invariant,
            repack=num.repack,
            type_k=num.type_k,
            mtp=not self.mtp_unsupported,
        )
        self._speculator: Model | None = None
        self._scorer = None
        self._mtp_ctx: Context | None = None
        self._eagle3: tuple[Model, Context, list[int]] | None = None
        self._eagle3_why: str | None = None

    # -- models ------------------------------------------------------------------------------------
    @property
    def speculator(self) -> Model:
        """The speculator, loaded on first use; refused if its vocabulary differs from the target's."""
        if self._speculator is None:
            from .models import resolve_model

            path = Path(resolve_model(self.options.speculator, progress=self._pull_progress))
            spec = Model(path, n_gpu_layers=self.options.n_gpu_layers)
            if spec.n_vocab != self.target.n_vocab or spec.vocab_signature() != self.target.vocab_signature():
                spec.close()
                raise ModelError(
                    f"speculator {path.name} has a different vocabulary from target {self.target_path.name} "
                    f"({spec.n_vocab} vs {self.target.n_vocab} tokens): they must share one tokenizer"
                )
            self._speculator = spec
            self.info.speculator = path.name
        return self._speculator

    def warm_up(self) -> None:
        """Load the speculator and run one tiny job so the first real job pays no setup cost."""
        _ = self.speculator
        self.run("warm up", RunParams(question="ok", max_tokens=2))

    # -- running -----------------------------------------------------------------------------------
    def tokenize_prompt(self, document: str, params: RunParams, *, messages: list[tuple[str, str]] | None = None,
                        raw: bool = False) -> Prompt:
        """The prompt: native (`document` + question + system), a chat (`messages`), or `document` as a
        raw completion prompt (`raw`); engine/chat_prompt.py says what scoring may drop in the last two."""
        if messages is not None:
            prompt = build_chat_prompt(self.target, messages, params.protect_tail)
        elif raw:
            prompt = build_raw_prompt(self.target, document, params.protect_tail)
        else:
            prompt = build_prompt(self.target, document, params.question, params.system)
        if prompt.n + params.max_tokens > self.n_ctx:
            raise InputError(
                f"prompt is {prompt.n} tokens; with max_tokens {params.max_tokens} it exceeds the target's "
                f"context of {self.n_ctx} tokens"
            )
        return prompt

    def run(self, document: str, params: RunParams | None = None, progress: Progress | None = None, *,
            messages: list[tuple[str, str]] | None = None, raw: bool = False, on_text: OnText | None = None,
            stop: Stop | None = None) -> RunResult:
        """One job. `messages` (a chat) or `raw` (a completion prompt) change how the prompt is built
        (`tokenize_prompt`); `on_text` receives the answer as it is decoded. `stop`: the job's cancel
        request and deadline, checked with every progress report and before every llama_decode call,
        and read in C during one (engine/stop.py); it raises RunCancelled or JobTimeLimit."""
        with running(stop):
            return self._run(document, params, progress, messages=messages, raw=raw, on_text=on_text, stop=stop)

    def _run(self, document: str, params: RunParams | None, progress: Progress | None, *,
             messages: list[tuple[str, str]] | None, raw: bool, on_text: OnText | None, stop: Stop | None) -> RunResult:
        params = params or RunParams()
        params.validate()
        user_report = progress or (lambda phase, done, total: None)

        def report(phase: str, done: int, total: int) -> None:
            if stop is not None:
                stop.check()
            user_report(phase, done, total)
        t_start = time.perf_counter()
        timings = {p: 0.0 for p in CORE_PHASES}
        warnings: list[str] = []

        report("tokenize", 0, 1)
        t0 = time.perf_counter()
        prompt = self.tokenize_prompt(document, params, messages=messages, raw=raw)
        timings["tokenize"] = _ms(t0)

        positions = params.positions
        if positions == "original" and not self.gaps_supported:
            positions = "compressed"
            warnings.append(
                "this llama.cpp build refuses position gaps (stock wheel?): ran with compressed positions; "
                "build ours with scripts/build-llama.sh"
            )

        min_tokens = DEFAULT_MIN_TOKENS if params.min_tokens < 0 else params.min_tokens
        mode = params.mode
        if mode == "specprefill" and prompt.n < min_tokens:
            mode = "baseline"
            warnings.append(f"prompt has {prompt.n} tokens < min_tokens {min_tokens}: ran baseline")

        spec = SpecInfo(mode=mode, positions=positions, keep=1.0, lookahead=0, windows=0, scorer="none")
        doc_scores = None
        if mode == "specprefill":
            kept, doc_scores = self._select(prompt, params, timings, spec, report)
        else:
            kept = list(range(prompt.n))

        # made before the prefill: an MTP/EAGLE3 drafter reads the target's hidden states of the prompt
        drafter = self._drafter(params, prompt, scored=(mode == "specprefill"))
        report("sparse_prefill", 0, 1)
        t0 = time.perf_counter()
        pre = sparse_prefill(self.ctx, prompt.tokens, kept, positions, observe=getattr(drafter, "observe", None))
        timings["sparse_prefill"] = _ms(t0)

        sampler = Sampler(params.temperature, params.top_k, params.top_p, params.seed)
        n_draft = params.n_draft
        if drafter is not None:
            warnings += invariance.draft_warning(self.numerics, n_draft, greedy=params.temperature == 0)
            if self.numerics.max_draft:
                n_draft = min(n_draft, self.numerics.max_draft)
        t_decode = time.perf_counter()
        first: list[float] = []

        text = TextStream(params.stop)
        emit = on_text or (lambda delta: None)

        def on_token(done: int, total: int) -> None:
            if not first:
                first.append(time.perf_counter())
            report("decode", done, total)

        def accept(token: int) -> bool:
            delta = text.push(self.target.token_bytes(token))
            if delta:
                emit(delta)
            return text.stopped

        gen = generate(
            self.ctx,
            prompt.tokens,
            pre.logits,
            pre.next_pos,
            max_tokens=params.max_tokens,
            sampler=sampler,
            drafter=drafter,
            n_draft=n_draft,
            draft_min=params.draft_min,
            progress=on_token,
            accept=accept,
        )
        rest = text.finish()
        if rest:
            emit(rest)
        t_end = time.perf_counter()
        timings["ttft"] = ((first[0] if first else t_end) - t_start) * 1000.0
        timings["decode"] = (t_end - t_decode) * 1000.0
        timings["total"] = (t_end - t_start) * 1000.0

        d = gen.draft.as_dict()
        # after the timed phases: what the target saw, in character offsets (kept_spans.py)
        selection = None if doc_scores is None else selection_record(
            self.target.token_bytes, document, prompt.document, prompt.doc_start, kept,
            prompt.protected_indices(), doc_scores, params.chunk)
        return RunResult(
            text=text.text,
            finish_reason="stop" if text.stopped else gen.finish_reason,
            usage=Usage(prompt_tokens=prompt.n, kept_tokens=len(kept), completion_tokens=len(gen.tokens)),
            timings_ms=timings,
            spec=spec,
            engine=EngineInfo(**vars(self.info)),
            draft=DraftInfo(**d),
            warnings=warnings,
            tokens=gen.tokens,
            kept_indices=kept,
            selection=selection,
        )

    # -- phases filled by the scoring and speculative-decoding modules --------------------------------
    def scorer(self):
        """The SpecPrefill scorer (speculator context with the capture callback), built on first use."""
        if self._scorer is None:
            from .scoring import SpecPrefillScorer

            spec = self.speculator
            opts = self.options
            n_ctx = min(spec.n_ctx_train or MAX_DEFAULT_CTX, max(self.n_ctx, 4096), MAX_DEFAULT_CTX)
            self.info.score_math = self._score_math()
            self._scorer = SpecPrefillScorer(
                spec, n_ctx=n_ctx, n_batch=opts.n_batch, n_ubatch=self.n_ubatch,
                n_threads=opts.resolved_threads(), flash_attn=opts.flash_attn,
                n_parallel=opts.n_parallel or (8 if self.info.backend != "cpu" else 1),
                score_math=self.info.score_math, call_tokens=self.call_tokens,
            )
        return self._scorer

    def _score_math(self) -> str:
        """EngineOptions.score_math resolved: auto picks torch on a GPU when PyTorch can run there."""
        from . import score_torch

        choice = self.options.score_math
        gpu = not invariance.on_cpu(self.options, self.info.backend)
        if choice == "auto":
            return "torch" if gpu and score_torch.available(gpu=True) is None else "numpy"
        if choice == "torch":
            why = score_torch.available(gpu=gpu)
            if why:
                raise ModelError(f"score_math torch: {why}")
        return choice

    def _select(self, prompt: Prompt, params: RunParams, timings: dict, spec: SpecInfo,
                report: Progress) -> tuple[list[int], np.ndarray]:
        """Score the prompt with the speculator and pick the kept indices (phases `score`, `select`);
        (kept indices, document token scores)."""
        from .selection import select_kept

        t0 = time.perf_counter()
        scored = self.scorer().score(
            prompt, scorer=params.scorer, lookahead=params.lookahead, pool=params.pool, window=params.window,
            progress=lambda done, total: report("score", done, total),
        )
        timings["score"] = _ms(t0)
        timings.update(scored.timings_ms)
        report("select", 0, 1)
        t0 = time.perf_counter()
        kept = select_kept(
            scored.scores, doc_start=prompt.doc_start, n_prompt=prompt.n, protected=prompt.protected_indices(),
            keep=params.keep, chunk=params.chunk, max_keep=params.max_keep,
        )
        timings["select"] = _ms(t0)
        spec.keep, spec.lookahead, spec.windows, spec.scorer = params.keep, params.lookahead, scored.windows, params.scorer
        return kept, scored.scores

    def _drafter(self, params: RunParams, prompt: Prompt, *, scored: bool = False):
        """The run's drafter (drafters.py); `model` drafts on the scorer's speculator context and, when
        this run scored, continues from the KV state scoring left there; `mtp` / `eagle3` on their
        own contexts, fed with the target's hidden states (drafters_hidden.py)."""
        from .drafters import make_drafter

        hidden, unavailable = {}, {}
        if self.mtp_unsupported:
            unavailable["mtp"] = self.mtp_unsupported
        else:
            hidden["mtp"] = lambda: (self.mtp_context(), {})
        if params.draft in ("eagle3", "auto"):  # the head loads (and is checked) only when it may draft
            why = self._eagle3_unsupported()
            if why:
                unavailable["eagle3"] = why
            else:
                hidden["eagle3"] = self._eagle3_drafter_args
        return make_drafter(
            params.draft, prompt, ngram=params.ngram, temperature=params.temperature, top_k=params.top_k,
            top_p=params.top_p, seed=params.seed, p_min=params.p_min, backend=self.info.backend,
            speculator_cache=self.scorer, scored=scored, hidden_drafters=hidden, unavailable=unavailable,
        )

    def mtp_context(self) -> Context:
        """The target's MTP block's context (`--draft mtp`), built on first use."""
        if self._mtp_ctx is None:
            if self.mtp_unsupported:
                raise ModelError(self.mtp_unsupported)
            self._mtp_ctx = open_mtp_context(self.ctx, n_threads=self.options.resolved_threads())
        return self._mtp_ctx

    def eagle3(self) -> tuple[Model, Context, list[int]]:
        """The EAGLE3 head (EngineOptions.drafter), its context and the target layers it reads; loaded
        on first use and refused when it does not fit the target (drafters_hidden.eagle3_unsupported)."""
        if self._eagle3 is None:
            from .models import resolve_model

            path = Path(resolve_model(self.options.drafter, progress=self._pull_progress))
            head = Model(path, n_gpu_layers=self.options.n_gpu_layers)
            try:
                ctx, layers = open_eagle3_context(head, self.ctx, n_threads=self.options.resolved_threads())
            except BaseException:
                head.close()
                raise
            self._eagle3 = (head, ctx, layers)
            self.info.drafter = path.name
        return self._eagle3

    def _eagle3_unsupported(self) -> str:
        """Why `--draft eagle3` cannot run here ("" = it can); loads the head on first call."""
        if not self.options.drafter:
            return "no EAGLE3 head configured (EngineOptions.drafter, --drafter PATH)"
        if self._eagle3_why is None:
            try:
                self.eagle3()
                self._eagle3_why = ""
            except ModelError as e:
                self._eagle3_why = str(e)
        return self._eagle3_why

    def _eagle3_drafter_args(self) -> tuple[Context, dict]:
        _, ctx, layers = self.eagle3()
        return ctx, {"layers": layers, "n_embd_target": self.target.n_embd}

    def close(self) -> None:
        if self._mtp_ctx is not None:
            self._mtp_ctx.close()
        if self._eagle3 is not None:
            self._eagle3[1].close()
            self._eagle3[0].close()
        self.ctx.close()
        self.target.close()
        if self._scorer is not None:
            self._scorer.close()
        if self._speculator is not None:
            self._speculator.close()
