"""The engine: models loaded once, then runs of tokenize → score → select → sparse prefill → decode.

`Engine.run()` is the single entry point for the CLI, the worker and the benchmarks. Its progress
callback is called between phases, per scoring window, per llama_decode call of the target's prefill
(`sparse_prefill` i/n kept tokens) and per decoded token; raising RunCancelled
(or any exception) from it stops the run there. Its `stop` (engine/llama/stop.py) is also checked before
every llama_decode call, and cuts a running one (CPU).
"""

from __future__ import annotations

from .llama.binding import Context, Model, backend_name, set_cuda_graphs, supports_position_gaps  # isort: skip  (llama_cpp first)
from .llama.ext import set_hidden_output  # isort: skip
from .decode.drafters_hidden import mtp_unsupported, open_eagle3_context, open_mtp_context  # isort: skip

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .policy import auto, evidence
from .llama import invariance
from .decode.loop import generate
from .decode.grammar import guide_for
from .policy.evidence_key import TORCH_SPECULATOR_KEY, EvidenceKey, effective_scoring, model_sha256
from ..contracts import ContextLengthExceeded, EngineError, InputError, ModelError
from .scoring.kept_spans import selection_record
from .options import DEFAULT_KEEP, EngineOptions, RunParams
from .decode.prefill import PrefillResult, sparse_prefill
from .cache.prefix import PrefixCache
from .cache.speculator import Numerics as CacheNumerics, SpeculatorCache, StateStore, file_sha256
from .prompt.chat import build_chat_prompt, build_raw_prompt
from .prompt.build import Prompt, build_prompt
from .result import CORE_PHASES, DraftInfo, EngineInfo, RunResult, SpecInfo, Usage
from .decode.sampling import Sampler
from .llama.stop import Stop, checked_progress, running
from .decode.textstream import TextStream

Progress = Callable[[str, int, int], None]
#: receives the answer's text as it becomes final (TextStream: whole characters, stop strings applied)
OnText = Callable[[str], None]

#: prompts shorter than this run baseline in specprefill mode, on the assumption that scoring costs
#: more than it saves below it. NOT measured: no benchmark has located the break-even yet (the
#: document-reuse issue measures it); a chosen value, overridable per job (`min_tokens`)
DEFAULT_MIN_TOKENS = 1024
#: the target's default context when the model's training context is larger (a configured n_ctx
#: is served up to the model's training context)
MAX_DEFAULT_CTX = 32768
#: EngineOptions.call_tokens = 0: tokens per prefill llama_decode call, about 0.5 s of work on each
#: backend (measured: docs/engine.md, "Cancel and the time limit")
#: CPU: one n_ubatch (512), not 64: patch 0003's C abort already cuts a call within a graph node there,
#: and 64-token calls cost ~17% speculator prefill / ~20% TTFT on the real pair (docs/engine.md)
DEFAULT_CALL_TOKENS = {"cpu": 512, "gpu": 2048}


def default_call_tokens(backend: str) -> int:
    return DEFAULT_CALL_TOKENS["cpu" if backend == "cpu" else "gpu"]


def run_keep(params: RunParams, spec: SpecInfo) -> float:
    """The keep a specprefill run uses: the job's; where it set none, the one `Engine.prepare` chose
    (`spec.keep_source` set: its band's certified keep, or DEFAULT_KEEP); else DEFAULT_KEEP (a caller that
    scores without prepare). Never None: every selection reads it from here."""
    if params.keep is not None:
        return params.keep
    return spec.keep if spec.keep_source else DEFAULT_KEEP


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


class Engine:
    """Loads the target (and, on first need, the speculator) once; `run()` many times."""

    def __init__(self, options: EngineOptions | None = None, *, pull_progress: Callable[[int, int], None] | None = None,
                 select_override: Callable[[list[int], Prompt, int], list[int]] | None = None) -> None:
        from .models import resolve_model

        self.options = opts = options or EngineOptions()
        self._pull_progress = pull_progress
        self.target_path = Path(resolve_model(opts.target, progress=pull_progress))
        #: benchmarks on random weights only: `(kept, prompt, chunk) -> kept` replaces every specprefill
        #: selection after it ran (the benchmark injects it: specq/testing/emulated_selection.py); None here
        self.select_override = select_override
        backend = backend_name()
        # before the first model: ggml reads the CUDA-graph setting once per process
        cuda_graphs = set_cuda_graphs(opts.cuda_graphs) and backend == "cuda"
        #: the target's numerics: batch-invariant mode or as the options say (invariance.py)
        self.numerics = num = invariance.resolve(opts, backend)
        # MTP layers load with the trunk when the file has them (a model without any is unaffected)
        # --speculator-gpu: each model whole on its own device; otherwise llama.cpp places the target
        pinned = opts.speculator_gpu >= 0
        self.target = Model(self.target_path, n_gpu_layers=opts.n_gpu_layers, repack=num.repack, load_mtp=True,
                            main_gpu=opts.main_gpu if pinned else -1)
        train = self.target.n_ctx_train
        if opts.n_ctx:
            self.n_ctx = min(opts.n_ctx, train) if train > 0 else opts.n_ctx
        else:
            self.n_ctx = min(train or MAX_DEFAULT_CTX, MAX_DEFAULT_CTX)
        self.n_ubatch = opts.n_ubatch or (2048 if backend != "cpu" else 512)
        #: sequences of the target's context (serving slots); each may hold n_ctx cells
        self.slots = max(1, int(opts.slots))
        on_cpu = invariance.on_cpu(opts, backend)
        #: tokens per prefill call (EngineOptions.call_tokens)
        self.call_tokens = opts.call_tokens or default_call_tokens("cpu" if on_cpu else backend)
        # the target prefills sparsely at original positions: its context (and the drafters' that
        # follow its positions) accept gaps; every other context keeps llama.cpp's stock checks
        self.ctx = Context(
            self.target,
            n_ctx=self.n_ctx * self.slots,
            n_seq_max=self.slots,
            # one KV stream of n_ctx cells per slot: a job attends over its own cells only, and they
            # stay in position order (in one unified cache another job's rollback leaves holes that a
            # job's later tokens fill out of order, which changes flash attention's summation order)
            kv_unified=self.slots == 1 or opts.kv_unified,
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
            cuda_graphs=cuda_graphs,
        )
        self._speculator: Model | None = None
        self._scorer = None
        #: EngineOptions.speculator_impl resolved (speculator_impl()), and why auto chose llama.cpp
        self._impl: str | None = None
        self.speculator_impl_reason = ""
        #: serving slot -> its model drafter's speculator context (draft_cache; slots > 1 only)
        self._draft_caches: dict[int, Any] = {}
        self._mtp_ctx: Context | None = None
        self._eagle3: tuple[Model, Context, list[int]] | None = None
        self._eagle3_why: str | None = None
        #: saved KV states of both caches under one byte budget (EngineOptions.cache_bytes)
        self.cache_store = StateStore(opts.cache_bytes, disk=self._cache_disk(opts))
        self._prefix_cache: PrefixCache | None = None
        self._spec_cache: SpeculatorCache | None = None
        #: the quality evidence mode auto reads (evidence.py): the shipped rows until the caller passes the
        #: store's in (`set_evidence`; the worker does, at start and when the table changes)
        self.evidence_rows: tuple = evidence.shipped_rows()
        self._model_hashes: tuple[str, str, str] | None = None

    # -- caches ------------------------------------------------------------------------------------
    @staticmethod
    def _cache_disk(opts: EngineOptions):
        """The caches' directory copy (EngineOptions.cache_dir), keyed to this llama.cpp build."""
        if not opts.cache_dir or opts.cache_bytes <= 0:
            return None
        from .cache.disk import DiskTier
        from .llama.binding import library_version

        try:
            return DiskTier(opts.cache_dir, library_version(), max_pending_bytes=opts.cache_bytes)
        except OSError as e:
            raise EngineError(f"SPECQ_CACHE_DIR {opts.cache_dir}: {e}") from None

    def prefix_cache(self) -> PrefixCache | None:
        """The target's prompt cache (prefix_cache.py), or None when cache_bytes is 0."""
        if not self.cache_store.enabled:
            return None
        if self._prefix_cache is None:
            num = self.numerics
            # the serving slots' context (one KV stream per sequence) saves other bytes than one sequence
            self._prefix_cache = PrefixCache(self.cache_store, CacheNumerics(
                file_sha256(self.target_path), num.type_k, num.flash_attn, num.repack, num.batch_invariant,
                self.n_ubatch, self.info.backend, layout="single" if self.slots == 1 else "streams"))
        return self._prefix_cache

    def spec_cache(self) -> SpeculatorCache | None:
        """The speculator's document-window cache (spec_cache.py), or None when cache_bytes is 0."""
        if not self.cache_store.enabled:
            return None
        if self._spec_cache is None:
            # the scorer's context: f16 K cache, flash attention as the options say, weights repacked
            # (Model's default); batch_invariant is the target's, keyed too so a change always misses
            self._spec_cache = SpeculatorCache(self.cache_store, CacheNumerics(
                file_sha256(self.speculator.path), "f16", self.options.flash_attn, True,
                self.numerics.batch_invariant, self.n_ubatch, self.info.backend), policy=self.options.spec_cache_save)
        return self._spec_cache
        #: the last pipelined run's stages and their times (pipelined.PipelineTrace; None otherwise)
        self.last_trace = None

    # -- models ------------------------------------------------------------------------------------
    @property
    def speculator(self) -> Model:
        """The speculator, loaded on first use; refused if its vocabulary differs from the target's."""
        if self._speculator is None:
            from .models import resolve_model

            path = Path(resolve_model(self.options.speculator, progress=self._pull_progress))
            spec = Model(path, n_gpu_layers=self.options.n_gpu_layers, main_gpu=self.options.speculator_gpu)
            if spec.n_vocab != self.target.n_vocab or spec.vocab_signature() != self.target.vocab_signature():
                spec.close()
                raise ModelError(
                    f"speculator {path.name} has a different vocabulary from target {self.target_path.name} "
                    f"({spec.n_vocab} vs {self.target.n_vocab} tokens): they must share one tokenizer"
                )
            self._speculator = spec
            self.info.speculator = path.name
        return self._speculator

    def warm_up_job(self) -> tuple[str, RunParams]:
        """A specprefill job of two scoring windows at production ubatch sizes (each window about one
        n_ubatch of tokens, so the speculator's and the target's prefills run full micro-batches),
        scored by the production scorer path (parallel streams on a GPU, the torch/numpy score math),
        then a few decoded tokens: the first real job finds every kernel, context and stream warm."""
        spec = self.speculator
        window = max(64, min(self.n_ubatch, 4096, (self.n_ctx - 512) // 2))
        words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor".split()
        piece = " ".join(words[i % len(words)] + str(i % 97) for i in range(256)) + "\n"
        per = max(1, len(spec.tokenize(piece)))
        doc = piece * max(1, (2 * window) // per + 1)
        toks = spec.tokenize(doc)
        doc = spec.detokenize(toks[: 2 * window])
        return doc, RunParams(question="ok", mode="specprefill", min_tokens=0, window=window, max_tokens=4, seed=0)

    def warm_up(self) -> float:
        """Run the warm-up job (warm_up_job); its duration in seconds."""
        t0 = time.perf_counter()
        doc, params = self.warm_up_job()
        self.run(doc, params)
        return time.perf_counter() - t0

    # -- running -----------------------------------------------------------------------------------
    def tokenize_prompt(self, document: str, params: RunParams, *, messages: list[tuple[str, str]] | None = None,
                        raw: bool = False) -> Prompt:
        """The prompt: native (`document` + question + system), a chat (`messages`), or `document` as a
        raw completion prompt (`raw`); engine/prompt/chat.py says what scoring may drop in the last two."""
        if params.tools and messages is None:
            raise InputError("tools are for chat jobs (messages); this job has none")
        if messages is not None:
            prompt = build_chat_prompt(self.target, messages, params.protect_tail, params.question, params.tools)
        elif raw:
            prompt = build_raw_prompt(self.target, document, params.protect_tail, params.question)
        else:
            prompt = build_prompt(self.target, document, params.question, params.system)
        if prompt.n + params.max_tokens > self.n_ctx:
            raise ContextLengthExceeded(prompt.n, params.max_tokens, self.n_ctx)
        return prompt

    def prepare(self, document: str, params: RunParams, *, messages: list[tuple[str, str]] | None = None,
                raw: bool = False, scope: str = "", reused_document: bool = False,
                prompt_cache: bool = True, prompt: Prompt | None = None,
                slot_tokens: int = 0, group: int = 0,
                grouped_before: bool = False) -> tuple[Prompt, str, str, list[str], dict, SpecInfo]:
        """The first phase of a job: params checked, prompt tokenized, the mode and positions that will
        run decided; (prompt, mode, positions, warnings, timings, spec). `scope` (the tenant) keys the
        caches: saved KV is only ever reused within one scope. `reused_document`: the job asks about a
        stored document (more questions expected: mode auto then fills the prompt cache, auto.py 1b).
        `prompt_cache=False`: the caller prefills without the target's prompt cache, so mode auto does
        not count on it. `prompt`: already tokenized by the caller (`tokenize_prompt`; the serving loop's
        submitting threads do it beside the loop's model work, and time it themselves). `slot_tokens`:
        this prompt's prefix already in the caller's serving slot (serving.py's resident prompt), which
        mode auto counts as cached like the prompt cache's. `group`: how many questions about this stored
        document (this one included) the caller serves together as one group-sparse prefill (serving.py;
        mode auto's rule 1a), 0 where it cannot; `grouped_before`: earlier questions about it were."""
        params.validate()
        timings = {p: 0.0 for p in CORE_PHASES}
        timings["cache_restore"] = 0.0
        warnings: list[str] = []
        t0 = time.perf_counter()
        if prompt is None:
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
        mode, reason = params.mode, "asked for"
        keep, keep_source = 1.0, ""  # the keep a specprefill run uses, and where it came from (SpecInfo.keep_source)
        prefix = self.prefix_cache() if prompt_cache else None
        if mode == "auto":
            found = prefix.lookup(scope, prompt.array) if prefix is not None else None
            cached = max(found[1] if found else 0, slot_tokens if prefix is not None else 0)
            shape = "chat" if messages is not None else "completion" if raw else "native"
            looked: dict[str, tuple] = {}

            def keep_choice() -> evidence.KeepChoice:
                """A job that sets no keep: the keep certified for its band (evidence.certified_keep), else the
                default; looked up once, when a rule needs it."""
                if "keep" not in looked:
                    rows = self.evidence_rows
                    key = (self.evidence_key(prompt, params, positions, shape, keep=DEFAULT_KEEP)
                           if any(r.certified for r in rows) else None)
                    looked["keep"] = (evidence.certified_keep(rows, key, prompt.n, DEFAULT_KEEP),)
                return looked["keep"][0]

            def lookup(arm: str) -> tuple:
                """The job's key is made (models hashed, the speculator's path resolved) only when a rule needs
                it and some row of `arm` passes at all; its keep is the job's, or the one it would run."""
                if arm not in looked:
                    rows = self.evidence_rows
                    key = None
                    if any(r.passes and r.arm == arm for r in rows):
                        keep = params.keep if params.keep is not None else keep_choice().keep
                        key = self.evidence_key(prompt, params, positions, shape, keep=keep)
                    looked[arm] = evidence.lookup(rows, key, arm)
                return looked[arm]

            choice = auto.decide(prompt.n, backend=self.info.backend, cached_tokens=cached,
                                 min_tokens=params.min_tokens, auto_min_tokens=self.options.auto_min_tokens,
                                 quality_min_tokens=self.options.auto_quality_min_tokens, evidence=lookup,
                                 reused_document=reused_document and prefix is not None, group=group,
                                 grouped_before=grouped_before,
                                 group_min_tokens=self.options.auto_group_min_tokens,
                                 no_question="" if prompt.question_found else prompt.question_note)
            mode, reason = choice.mode, "auto: " + choice.reason
            if params.keep is None and (mode == "specprefill" or "keep" in looked):
                chose = keep_choice()  # which keep runs (or would have), and the certified row that chose it
                reason += f"; keep unset: {chose.why}"
                keep, keep_source = chose.keep, "certified" if chose.rows else "default"
        elif mode == "specprefill" and prompt.n < min_tokens:
            mode = "baseline"
            reason = f"prompt has {prompt.n} tokens < min_tokens {min_tokens}"
            warnings.append(f"prompt has {prompt.n} tokens < min_tokens {min_tokens}: ran baseline")
        if mode == "specprefill" and not prompt.question_found:
            warnings.append(f"{prompt.question_note}: only the prompt's last {prompt.n - prompt.doc_end} tokens (the "
                            "message's last paragraph or protect_tail tokens, and the template after it) were "
                            "protected, so scoring may have dropped the question; name it with specq.question")
        if mode == "specprefill" and params.keep is not None:
            keep, keep_source = params.keep, "job"
        elif mode == "specprefill" and keep_source == "":
            keep, keep_source = DEFAULT_KEEP, "default"  # an explicit `mode specprefill` that sets no keep ("asked for")
        spec = SpecInfo(mode=mode, reason=reason, positions=positions, keep=1.0, lookahead=0, windows=0, scorer="none")
        if mode == "specprefill":  # the keep it runs (select and the pipelined prefill read it: run_keep)
            spec.keep, spec.keep_source = keep, keep_source
        spec.cache = {"speculator": "off", "target": "off", "bytes_restored": 0}
        return prompt, mode, positions, warnings, timings, spec

    def set_evidence(self, rows) -> None:
        """The evidence rows mode auto reads from now on (evidence.merge of the shipped rows and the store's)."""
        self.evidence_rows = tuple(rows)

    def evidence_key(self, prompt: Prompt, params: RunParams, positions: str, shape: str = "native",
                     keep: float | None = None) -> EvidenceKey:
        """The settings this job's specprefill would run with, resolved (evidence_key.py): `positions` after the
        library probe, the effective scorer and window for this document, the score math this engine uses;
        `keep`: the keep it runs where the job set none (else the job's, else DEFAULT_KEEP)."""
        from .models import resolve_model

        if self._model_hashes is None:
            spath = self._speculator.path if self._speculator is not None else Path(
                resolve_model(self.options.speculator, progress=self._pull_progress))
            self._model_hashes = (model_sha256(self.target_path), model_sha256(spath), Path(spath).name)
        target_sha, spec_sha, spec_name = self._model_hashes
        if self._scorer is not None:
            scorer_ctx = self._scorer.n_ctx
        else:  # as scorer() will size it
            train = self._speculator.n_ctx_train if self._speculator is not None else 0
            scorer_ctx = min(train or self.n_ctx, max(self.n_ctx, 4096))
        room = scorer_ctx - prompt.doc_start - (prompt.n - prompt.doc_end) - params.lookahead - 1
        scorer, window = effective_scoring(params.scorer, params.window, prompt.doc_end - prompt.doc_start, room)
        try:
            score_math = self.info.score_math or self._score_math()
        except ModelError:
            score_math = self.options.score_math
        if self.speculator_impl() == "torch":
            score_math = TORCH_SPECULATOR_KEY  # another forward: its own evidence (evidence_key.py)
        return EvidenceKey(
            target_sha256=target_sha, speculator_sha256=spec_sha,
            backend="cpu" if invariance.on_cpu(self.options, self.info.backend) else self.info.backend,
            prompt_shape=shape, task=params.task or None, positions=positions, score_math=score_math, scorer=scorer, window=window,
            chunk_rule=params.chunk_rule, max_keep=params.max_keep, chunk=params.chunk,
            keep=params.keep if params.keep is not None else keep if keep is not None else DEFAULT_KEEP,
            lookahead=params.lookahead, pool=params.pool, selection=params.selection, pipelined=params.pipelined,
            protect_tail=-1 if shape == "native" else params.protect_tail,
            target=self.target_path.name, speculator=spec_name)

    def run(self, document: str, params: RunParams | None = None, progress: Progress | None = None, *,
            messages: list[tuple[str, str]] | None = None, raw: bool = False, on_text: OnText | None = None,
            scope: str = "", reused_document: bool = False, stop: Stop | None = None,
            _kept: list[int] | None = None) -> RunResult:
        """One job. `messages` (a chat) or `raw` (a completion prompt) change how the prompt is built
        (`tokenize_prompt`); `on_text` receives the answer as it is decoded; `scope`, `reused_document`:
        `prepare`. `stop`: the job's cancel request and deadline, checked with every progress report
        and before every llama_decode call, and read in C during one (engine/llama/stop.py); it raises
        RunCancelled or JobTimeLimit.
        `_kept` (internal, tests and benchmarks only): a specprefill run prefills exactly these prompt
        indices (sorted, ending at the last prompt token) instead of scoring; the speculator does not
        run (group_sparse.py's equivalence tests force a group's union this way)."""
        with running(stop):
            return self._run(document, params, progress, messages=messages, raw=raw, on_text=on_text,
                             scope=scope, reused_document=reused_document, stop=stop, kept_override=_kept)

    def _run(self, document: str, params: RunParams | None, progress: Progress | None, *,
             messages: list[tuple[str, str]] | None, raw: bool, on_text: OnText | None, scope: str,
             reused_document: bool, stop: Stop | None, kept_override: list[int] | None = None) -> RunResult:
        params = params or RunParams()
        report = checked_progress(progress, stop)
        t_start = time.perf_counter()
        guide = guide_for(self.target, params.json_schema)  # a schema that cannot be a grammar fails here
        report("tokenize", 0, 1)
        prompt, mode, positions, warnings, timings, spec = self.prepare(
            document, params, messages=messages, raw=raw, scope=scope, reused_document=reused_document)
        prefix = self.prefix_cache()

        doc_scores = None
        save_prompt = None  # a full prefill through the prompt cache: its save, after the first token
        self.last_trace = None
        if mode == "specprefill" and params.pipelined and kept_override is None:
            # scoring and the target's prefill interleave (pipelined.py): an MTP/EAGLE3 drafter, which
            # reads the target's hidden states, is made first; any other after scoring, as below
            early = params.draft in ("mtp", "eagle3", "auto")
            drafter = self.drafter_for(params, prompt, scored=False) if early else None
            kept, doc_scores, pre = self._pipelined(prompt, params, positions, timings, spec, report,
                                                    observe=getattr(drafter, "observe", None))
            if not early:
                drafter = self.drafter_for(params, prompt, scored=True)
        else:
            if mode == "specprefill" and kept_override is not None:
                kept = sorted(set(int(i) for i in kept_override))
            elif mode == "specprefill":
                kept, doc_scores = self.select(prompt, params, timings, spec, report, scope=scope,
                                               reused_document=reused_document)
            else:
                kept = list(range(prompt.n))

            # made before the prefill: an MTP/EAGLE3 drafter reads the target's hidden states of the prompt
            drafter = self.drafter_for(params, prompt, scored=(mode == "specprefill" and kept_override is None))
            observe = getattr(drafter, "observe", None)
            report("sparse_prefill", 0, len(kept))

            def prefilled(done: int, total: int) -> None:  # the long phase of a long prompt: i/n tokens
                report("sparse_prefill", done, total)

            t0 = time.perf_counter()
            if mode == "baseline" and prefix is not None and observe is None:
                # a full prefill: through the target's prompt cache (a drafter that reads the prompt's
                # hidden states needs every token prefilled, so it bypasses the cache)
                use = prefix.prefill(self.ctx, scope, prompt.tokens, save=False, progress=prefilled)
                pre = PrefillResult(next_pos=prompt.n, n_kept=prompt.n, logits=self.ctx.logits_row(-1))
                timings["cache_restore"] += use.restore_ms
                spec.cache["bytes_restored"] += use.bytes_restored
                timings["sparse_prefill"] = _ms(t0) - use.restore_ms

                def save_prompt() -> None:
                    prefix.save(self.ctx, 0, scope, prompt.tokens, use)
                    spec.cache["target"] = use.as_dict()
            else:
                pre = sparse_prefill(self.ctx, prompt.tokens, kept, positions, observe=observe, progress=prefilled)
                timings["sparse_prefill"] = _ms(t0)

        sampler = Sampler(params.temperature, params.top_k, params.top_p, params.seed)
        n_draft = self.draft_budget(params, drafter, warnings)
        t_decode = time.perf_counter()
        first: list[float] = []
        text, on_token, accept = self.text_callbacks(params, report, on_text, first)
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
            ignore_eos=params.ignore_eos,
            after_first=save_prompt,
            guide=guide,
        )
        t_end = time.perf_counter()
        if guide is not None:  # part of `decode` (and of `ttft` for the first token)
            timings["grammar"] = guide.ms
        timings["ttft"] = ((first[0] if first else t_end) - t_start) * 1000.0
        timings["decode"] = (t_end - t_decode) * 1000.0
        timings["total"] = (t_end - t_start) * 1000.0
        draft_prefill = getattr(drafter, "prefill_ms", 0.0)
        if draft_prefill:  # the model drafter's own prompt prefill (baseline runs): part of `decode` above
            timings["draft_prefill"] = round(draft_prefill, 3)
        return self.finish_result(document, prompt, params, gen, text, on_text, timings, spec, warnings, kept, doc_scores)

    def run_group(self, document: str, questions: list[str], params: RunParams | None = None,
                  progress: Progress | None = None, *, scope: str = "", stop: Stop | None = None,
                  layout: str = "rollback", reused_document: bool = True) -> list[RunResult]:
        """Several questions about one document with one group-sparse prefill of the target (the
        union of their kept chunks, group_sparse.py); one RunResult per question, in order."""
        from .group_sparse import run_group

        return run_group(self, document, questions, params, scope=scope, progress=progress, stop=stop,
                         layout=layout, reused_document=reused_document)

    def draft_budget(self, params: RunParams, drafter, warnings: list[str]) -> int:
        """Tokens drafted per verification: n_draft, capped by the numerics (batch-invariant mode)."""
        n_draft = params.n_draft
        if drafter is not None:
            warnings += invariance.draft_warning(self.numerics, n_draft, greedy=params.temperature == 0)
            if self.numerics.max_draft:
                n_draft = min(n_draft, self.numerics.max_draft)
        return n_draft

    def text_callbacks(self, params: RunParams, report: Progress, on_text: OnText | None, first: list[float]):
        """(TextStream, on_token, accept) of a job's decode: progress per token, the time of the first
        token appended to `first`, text published through on_text with stop strings applied."""
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

        return text, on_token, accept

    def finish_result(self, document: str, prompt: Prompt, params: RunParams, gen, text: TextStream,
                      on_text: OnText | None, timings: dict, spec: SpecInfo, warnings: list[str], kept: list[int],
                      doc_scores) -> RunResult:
        """The RunResult of a decoded job (the text's held-back rest published first)."""
        rest = text.finish()
        if rest and on_text is not None:
            on_text(rest)
        d = gen.draft.as_dict()
        # after the timed phases: what the target saw, in character offsets (kept_spans.py)
        selection = None if doc_scores is None else selection_record(
            self.target.pieces(prompt.document), document, prompt.doc_start, kept,
            prompt.protected_indices(), doc_scores, params.chunk, params.chunk_rule)
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
            from .scoring.scorer import SpecPrefillScorer

            spec = self.speculator
            opts = self.options
            n_ctx = min(spec.n_ctx_train or self.n_ctx, max(self.n_ctx, 4096))
            self.info.score_math = self._score_math()
            impl = self.speculator_impl()
            forward = None
            if impl == "torch":
                from .scoring import score_torch
                from .scoring.torch_speculator import TorchSpeculator

                on_gpu = not invariance.on_cpu(self.options, self.info.backend)
                why = score_torch.available(gpu=on_gpu) if self.options.speculator_impl == "torch" else None
                if why:  # (auto probed it already)
                    raise ModelError(f"speculator_impl torch: {why}")
                forward = TorchSpeculator(spec.path, device=f"cuda:{max(0, spec.main_gpu)}" if on_gpu else "cpu")
            elif impl != "llama":
                raise ModelError(f"unknown speculator_impl {impl!r} (auto, llama or torch)")
            self.info.speculator_impl = impl
            self._scorer = SpecPrefillScorer(
                spec, n_ctx=n_ctx, n_batch=opts.n_batch, n_ubatch=self.n_ubatch,
                n_threads=opts.resolved_threads(), flash_attn=opts.flash_attn,
                n_parallel=opts.n_parallel or (8 if self.info.backend != "cpu" else 1),
                score_math=self.info.score_math, device=max(0, spec.main_gpu), call_tokens=self.call_tokens,
                torch_speculator=forward,
            )
        return self._scorer

    def speculator_impl(self) -> str:
        """EngineOptions.speculator_impl resolved once: auto is torch where the target is on a GPU, PyTorch runs
        there and the torch forward implements the speculator's GGUF; llama otherwise, and on the CPU always (its
        evidence rows were measured with llama.cpp's, and the torch forward keeps no speculator cache);
        `speculator_impl_reason` says why auto chose llama."""
        if self._impl is None:
            impl = self.options.speculator_impl
            if impl == "auto":
                from .models import resolve_model
                from .scoring import score_torch
                from .scoring.torch_speculator import unsupported

                if invariance.on_cpu(self.options, self.info.backend):
                    why = "the models are on the CPU"
                else:
                    spath = (self._speculator.path if self._speculator is not None
                             else resolve_model(self.options.speculator, progress=self._pull_progress))
                    why = score_torch.available(gpu=True) or unsupported(spath)
                impl = "llama" if why else "torch"
                self.speculator_impl_reason = f"auto: {why}" if why else ""
            self._impl = impl
        return self._impl

    def _score_math(self) -> str:
        """EngineOptions.score_math resolved: auto picks torch on a GPU when PyTorch can run there."""
        from .scoring import score_torch

        choice = self.options.score_math
        gpu = not invariance.on_cpu(self.options, self.info.backend)
        if choice == "auto":
            return "torch" if gpu and score_torch.available(gpu=True) is None else "numpy"
        if choice == "torch":
            why = score_torch.available(gpu=gpu)
            if why:
                raise ModelError(f"score_math torch: {why}")
        return choice

    def select(self, prompt: Prompt, params: RunParams, timings: dict, spec: SpecInfo,
               report: Progress, scope: str = "", between_calls=None,
               reused_document: bool = False) -> tuple[list[int], np.ndarray]:
        """Score the prompt with the speculator and pick the kept indices (phases `score`, `select`);
        (kept indices, document token scores). Window prefixes go through the speculator cache
        (`reused_document`: a stored document, whose windows its save policy keeps at once; the time
        spent saving is `cache_save`, part of `speculator_prefill`).
        between_calls(ctx): run after each llama_decode call of a window's prefill (scoring.py, "Between
        calls"; the serving loop's decode batches of other jobs); Engine.run passes none."""
        from .scoring.selection import select_kept, select_kept_per_window

        scorer = self.scorer()
        cache = self.spec_cache() if params.scorer != "sliding" else None
        use = cache.begin(expect_reuse=reused_document) if cache is not None else None
        t0 = time.perf_counter()
        scored = scorer.score(
            prompt, scorer=params.scorer, lookahead=params.lookahead, pool=params.pool, window=params.window,
            progress=lambda done, total: report("score", done, total), cache=cache, scope=scope,
            between_calls=between_calls,
        )
        timings["score"] = _ms(t0)
        timings.update(scored.timings_ms)
        if use is not None:
            spec.cache["speculator"] = use.as_dict()
            spec.cache["bytes_restored"] += use.bytes_restored
            timings["cache_save"] = round(use.save_ms, 3)
        report("select", 0, 1)
        t0 = time.perf_counter()
        keep = run_keep(params, spec)
        pieces = self.rule_pieces(prompt, params.chunk_rule)
        if params.selection == "per-window":
            kept = select_kept_per_window(
                scored.scores, scored.plan, doc_start=prompt.doc_start, n_prompt=prompt.n,
                protected=prompt.protected_indices(), keep=keep, chunk=params.chunk, max_keep=params.max_keep,
                rule=params.chunk_rule, pieces=pieces,
            )
        else:
            kept = select_kept(
                scored.scores, doc_start=prompt.doc_start, n_prompt=prompt.n, protected=prompt.protected_indices(),
                keep=keep, chunk=params.chunk, max_keep=params.max_keep, rule=params.chunk_rule, pieces=pieces,
            )
        if self.select_override is not None and prompt.doc_end > prompt.doc_start:
            kept = self.select_override(kept, prompt, params.chunk)
            spec.reason += f" (selection EMULATED for a benchmark: {self.select_override})"
        timings["select"] = _ms(t0)
        spec.keep, spec.lookahead, spec.windows, spec.scorer = keep, params.lookahead, scored.windows, params.scorer
        spec.selection, spec.chunk_rule = params.selection, params.chunk_rule
        return kept, scored.scores

    def rule_pieces(self, prompt: Prompt, rule: str) -> list[bytes] | None:
        """The document tokens' bytes where the chunk rule reads the text (`scope`: its header lines)."""
        from .scoring.selection import reads_text

        return self.target.pieces(prompt.document) if reads_text(rule) else None

    def _pipelined(self, prompt: Prompt, params: RunParams, positions: str, timings: dict, spec: SpecInfo,
                   report: Progress, *, observe=None, threaded: bool = True):
        """Scoring and sparse prefill as one pipeline (pipelined.py): per-window selection, window i's
        chunks prefilled while window i+1 is scored. Phases: `score` (the speculator's wall time),
        `select` (summed over windows), `sparse_prefill` (the target's time after scoring ended: what
        the overlap did not hide), `prefill_overlapped` (target decoding while scoring ran).
        (kept indices, document scores, PrefillResult); the stages' times are in `last_trace`."""
        from .scoring.pipelined import pipelined_prefill

        scorer = self.scorer()
        # bit-identical micro-batches to a single sparse_prefill where the numerics are batch-invariant
        c = self.ctx
        align = (c.n_ubatch if c.n_batch % c.n_ubatch == 0 else c.n_batch) if self.numerics.batch_invariant else 1

        def progress(done: int, total: int) -> None:
            report("score", done, total)
            if done == total:  # scoring is over: what is left is the target's (the tail, any backlog)
                report("sparse_prefill", 0, 1)

        keep = run_keep(params, spec)
        kept, scored, pre, trace = pipelined_prefill(
            scorer, self.ctx, prompt, keep=keep, chunk=params.chunk, max_keep=params.max_keep, positions=positions,
            rule=params.chunk_rule, pieces=self.rule_pieces(prompt, params.chunk_rule),
            score_kwargs=dict(scorer=params.scorer, lookahead=params.lookahead, pool=params.pool, window=params.window),
            threaded=threaded, align=align, observe=observe, progress=progress,
        )
        timings["score"] = trace.score_end_s * 1000.0
        timings.update(scored.timings_ms)
        timings["select"] = sum(s.select_ms for s in trace.stages)
        timings["sparse_prefill"] = (trace.end_s - trace.score_end_s) * 1000.0
        overlapped = sum(max(0.0, min(s.prefill_end_s, trace.score_end_s) - s.prefill_start_s) for s in trace.stages)
        timings["prefill_overlapped"] = overlapped * 1000.0
        spec.keep, spec.lookahead, spec.windows, spec.scorer = keep, params.lookahead, scored.windows, params.scorer
        spec.selection, spec.pipelined, spec.chunk_rule = params.selection, True, params.chunk_rule
        self.last_trace = trace
        return sorted(kept), scored.scores, pre

    def drafter_for(self, params: RunParams, prompt: Prompt, *, scored: bool = False, seq: int = 0):
        """The run's drafter (drafters.py); `model` drafts on the scorer's speculator context and, when
        this run scored, continues from the KV state scoring left there; `mtp` / `eagle3` on their
        own contexts, fed with the target's hidden states (drafters_hidden.py)."""
        from .decode.drafters import make_drafter

        hidden, unavailable = {}, {}
        if self.slots > 1:  # their contexts hold one sequence and read rows of the target's own batches
            unavailable["mtp"] = self.mtp_unsupported or "not with several serving slots (SPECQ_SLOTS > 1)"
            unavailable["eagle3"] = "not with several serving slots (SPECQ_SLOTS > 1)"
        elif self.mtp_unsupported:
            unavailable["mtp"] = self.mtp_unsupported
        else:
            hidden["mtp"] = lambda: (self.mtp_context(), {})
        if params.draft in ("eagle3", "auto") and self.slots == 1:  # the head loads (and is checked) only when it may draft
            why = self._eagle3_unsupported()
            if why:
                unavailable["eagle3"] = why
            else:
                hidden["eagle3"] = self._eagle3_drafter_args
        return make_drafter(
            params.draft, prompt, ngram=params.ngram, temperature=params.temperature, top_k=params.top_k,
            top_p=params.top_p, seed=params.seed, p_min=params.p_min, backend=self.info.backend,
            speculator_cache=lambda: self.draft_cache(seq, prompt if scored else None), scored=scored, hidden_drafters=hidden, unavailable=unavailable, seq=seq,
        )

    def draft_cache(self, slot: int = 0, scored: Prompt | None = None):
        """The speculator context `draft model` drafts on for serving slot `slot`: the scorer's with one
        slot (a drafter then continues from the window scoring left there), else a context of the
        slot's own (drafters.DraftCache, built on first use), so that jobs decoding together never
        draft on one another's KV. `scored`: the job's prompt when it was just scored; the window
        scoring left in the scorer's context is then copied into the slot's (a host copy of the
        speculator's KV of one window, instead of prefilling the prompt again)."""
        from .decode.drafters import DraftCache, is_window_view
        from .cache.speculator import restore_seq, save_seq

        scorer = self.scorer()
        if self.slots == 1:
            return scorer
        cache = self._draft_caches.get(slot)
        if cache is None:
            opts = self.options
            cache = self._draft_caches[slot] = DraftCache(Context(
                self.speculator, n_ctx=scorer.n_ctx, n_batch=opts.n_batch, n_ubatch=self.n_ubatch,
                n_threads=opts.resolved_threads(), flash_attn=opts.flash_attn, call_tokens=self.call_tokens))
        window = scorer.cached_tokens
        if (scored is not None and window and scorer.ctx.seq_pos_max(0) == len(window) - 1
                and is_window_view(window, scored) and cache.cached_tokens != window):
            cache.ctx.clear()
            cache.cached_tokens = []
            restore_seq(cache.ctx, save_seq(scorer.ctx, 0), 0)
            cache.cached_tokens = list(window)
        return cache

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
        if self.cache_store.disk is not None:  # the saves still queued for the cache directory
            self.cache_store.disk.flush(timeout=30.0)
        if self._mtp_ctx is not None:
            self._mtp_ctx.close()
        if self._eagle3 is not None:
            self._eagle3[1].close()
            self._eagle3[0].close()
        self.ctx.close()
        self.target.close()
        for cache in self._draft_caches.values():
            cache.close()
        self._draft_caches.clear()
        if self._scorer is not None:
            self._scorer.close()
        if self._speculator is not None:
            self._speculator.close()
