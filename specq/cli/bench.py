"""`specq bench …`: benchmarks on this machine (not timed tests)."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app
from ..engine.options import DEFAULT_CHUNK_RULE
from .common import fail, with_models


bench_app = typer.Typer(help="Benchmarks on this machine (not timed tests).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("decode")
def bench_decode(
    methods: str = typer.Option("none,ngram,model", help="Comma-separated drafters to compare (none first)."),
    jobs: str = typer.Option("rename,quote,explain", help="Comma-separated jobs: rename, quote (copy-heavy), explain (free-form)."),
    max_tokens: int = typer.Option(128, help="Tokens to generate per run."),
    n_draft: int = typer.Option(4, help="Tokens drafted per verification batch."),
    draft_min: int = typer.Option(1, help="Skip drafts shorter than this."),
    p_min: float = typer.Option(0.0, help="Model drafts stop below this top probability (0 = off)."),
    ngram: int = typer.Option(2, help="N-gram size for the ngram drafter."),
    repeat: int = typer.Option(1, help="Runs per job and method (the median decode time counts)."),
    mode: str = typer.Option("baseline", help="Prefill mode: baseline or specprefill."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator/drafter model: registry name or GGUF path."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    batch_invariant: str = typer.Option("auto", help="Batch-invariant target numerics: auto (= off), on, off."),
    repack: bool = typer.Option(True, "--repack/--no-repack", help="CPU weight repacking for the target (with --batch-invariant off)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report (rows and provenance) as JSON."),
    out: Path = typer.Option(None, help="Write the report (rows and provenance) as JSON here."),
) -> None:
    """Decode tokens/s for none / ngram / model drafting, side by side, on copy-heavy and free-form jobs
    (a model drafter's own prompt prefill is booked as draft prefill ms, not decode time)."""
    import json

    from ..bench.decode import default_jobs, run_bench
    from ..contracts import EngineError
    from ..engine.options import EngineOptions

    if batch_invariant not in ("auto", "on", "off"):
        raise fail(f"--batch-invariant must be auto, on or off, not {batch_invariant!r}")
    opts = with_models(EngineOptions(n_gpu_layers=n_gpu_layers, n_threads=threads, repack=repack,
                                     batch_invariant=batch_invariant), target=target, speculator=speculator)
    wanted = [j.strip() for j in jobs.split(",") if j.strip()]
    by_name = {j.name: j for j in default_jobs()}
    unknown = [j for j in wanted if j not in by_name]
    if unknown:
        raise fail(f"unknown job(s): {', '.join(unknown)} (known: {', '.join(by_name)})")
    header = (f"{'job':8} {'kind':10} {'method':11} {'tokens':>6} {'decode ms':>10} {'d.prefill':>9} {'tok/s':>7} {'ratio':>6} "
              f"{'accept':>7} {'mean acc':>8} {'batches':>7}  same")

    def show(row) -> None:
        if not as_json:
            same = "-" if row.same_as_none is None else ("yes" if row.same_as_none else "NO")
            typer.echo(f"{row.job:8} {row.kind:10} {row.method:11} {row.tokens:6d} {row.decode_ms:10.1f} "
                       f"{row.draft_prefill_ms:9.1f} {row.tokens_per_s:7.2f} "
                       f"{row.ratio:5.2f}x {row.accept_rate:7.3f} {row.mean_accepted_len:8.2f} {row.verify_batches:7d}  {same}")

    if not as_json:
        typer.echo(header)
    prov: dict = {}
    try:
        rows = run_bench(
            opts, methods=[m.strip() for m in methods.split(",") if m.strip()], jobs=[by_name[j] for j in wanted],
            max_tokens=max_tokens, n_draft=n_draft, draft_min=draft_min, p_min=p_min, ngram=ngram, repeat=repeat,
            mode=mode, on_row=show, provenance=prov,
        )
    except EngineError as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:
        raise fail("interrupted") from None
    report = {"benchmark": "decode", "commit": prov.get("code", {}).get("describe"), "provenance": prov,
              "rows": [r.as_dict() for r in rows]}
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")
        typer.echo(f"wrote {out}", err=as_json)


@bench_app.command("drafters")
def bench_drafters(
    methods: str = typer.Option("ngram,model,mtp", help="Comma-separated drafters: ngram, model, mtp, eagle3."),
    rates: str = typer.Option("0,0.25,0.5,0.75,0.9,1", help="Forced acceptance rates (each drafted token kept with this probability)."),
    n_draft: int = typer.Option(4, help="Tokens drafted per verification batch."),
    max_tokens: int = typer.Option(64, help="Tokens generated per run."),
    prompt_tokens: int = typer.Option(1024, help="Prompt length (context the costs are measured at)."),
    reps: int = typer.Option(5, help="Repetitions of each unit-cost measurement (the fastest counts)."),
    repeat: int = typer.Option(1, help="Runs per drafter and rate (the fastest counts)."),
    clock: str = typer.Option("wall", help="wall, or thread (this thread's CPU time: with --threads 1 on a CPU build, the uncontended cost on a shared machine)."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path (an MTP-capable one for mtp)."),
    speculator: str = typer.Option(None, help="Speculator for the model drafter: registry name or GGUF path."),
    drafter: str = typer.Option(None, help="EAGLE3 head for eagle3 (GGUF path)."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    n_ctx: int = typer.Option(0, help="Target context (0 = prompt + generated tokens, rounded up)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    batch_invariant: str = typer.Option("auto", help="Batch-invariant target numerics: auto (= off), on, off."),
    out: Path = typer.Option(None, help="Write the report as JSON here."),
) -> None:
    """Cost of each drafter's step and of verification vs a single decode, and decode speed-up as a function
    of a forced acceptance rate (random weights: the acceptance is forced, the costs are real)."""
    import json

    from ..bench.drafters import run_drafters_bench
    from ..contracts import EngineError
    from ..engine.options import EngineOptions

    try:
        rate_list = [float(r) for r in rates.split(",") if r.strip()]
    except ValueError:
        raise fail(f"--rates must be comma-separated numbers, not {rates!r}") from None
    if not rate_list or any(not 0 <= r <= 1 for r in rate_list):
        raise fail("--rates must be in [0, 1]")
    if batch_invariant not in ("auto", "on", "off"):
        raise fail(f"--batch-invariant must be auto, on or off, not {batch_invariant!r}")
    ctx = n_ctx or ((prompt_tokens + max_tokens + 2 * n_draft + 512) // 256 + 1) * 256
    opts = with_models(EngineOptions(n_gpu_layers=n_gpu_layers, n_threads=threads, n_ctx=ctx, batch_invariant=batch_invariant),
                       target=target, speculator=speculator, drafter=drafter)
    try:
        report = run_drafters_bench(opts, methods=[m.strip() for m in methods.split(",") if m.strip()],
                                    rates=rate_list, n_draft=n_draft, max_tokens=max_tokens,
                                    prompt_tokens=prompt_tokens, reps=reps, repeat=repeat, clock=clock,
                                    say=typer.echo)
    except (EngineError, ValueError) as e:
        raise fail(str(e)) from None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")
        typer.echo(f"wrote {out}")


# --------------------------------------------------------------------------- bench: ttft, make-model


@bench_app.command("ttft")
def bench_ttft(
    lengths: str = typer.Option("4000", help="Comma-separated prompt lengths in tokens, e.g. 8000,32000,65000,131000."),
    keep: float = typer.Option(0.3, help="Fraction of the document's chunks kept."),
    scorer: str = typer.Option("windowed", help="windowed, sliding or full."),
    lookahead: int = typer.Option(8, help="Lookahead query rows."),
    window: int = typer.Option(0, help="Document tokens per scoring window (0 = auto: one window up to 8,192 tokens, else 4,096)."),
    reps: int = typer.Option(3, help="Rounds per length after the dropped warm-up (median counts)."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    n_ctx: int = typer.Option(0, help="Target context (0 = the largest length + 1024)."),
    n_batch: int = typer.Option(4096, help="Largest batch handed to llama_decode."),
    n_ubatch: int = typer.Option(0, help="Micro-batch (0 = 2048 on GPU, 512 on CPU)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    n_parallel: int = typer.Option(0, help="Scoring windows run together (0 = 8 on GPU, 1 on CPU)."),
    score_math: str = typer.Option("auto", help="Where score math runs: auto, numpy (host) or torch (on the speculator's device)."),
    speculator_impl: str = typer.Option("auto", help="Who runs the speculator's scoring windows: auto (as the service: torch "
                                        "with the models on a GPU where PyTorch runs there, else llama), llama (llama.cpp) "
                                        "or torch (the PyTorch forward; SPECQ_SPECULATOR_IMPL in the service)."),
    batch_invariant: str = typer.Option("both", help="Batch-invariant target numerics: both (on, then off: the headline "
                                        "compares with the fastest baseline), auto (= off), on, off."),
    out: Path = typer.Option(None, help="Write the report as JSON here."),
    plot: Path = typer.Option(None, help="Write a PNG plot here (needs matplotlib: pip install 'specq[bench]')."),
) -> None:
    """TTFT of baseline vs specprefill, alternating in one run, in the same numerics, with the phase split
    and ratio; by default in both batch-invariant modes, quoting the fastest baseline."""
    from ..contracts import EngineError
    from ..engine.options import SPECULATOR_IMPLS, EngineOptions

    try:
        sizes = [int(x.replace("_", "")) for x in lengths.split(",") if x.strip()]
    except ValueError:
        raise fail(f"bad --lengths {lengths!r}: comma-separated token counts") from None
    if not sizes or min(sizes) < 64 or reps < 1:
        raise fail("--lengths must be token counts >= 64 and --reps >= 1")
    if score_math not in ("auto", "numpy", "torch"):
        raise fail(f"--score-math must be auto, numpy or torch (got {score_math!r})")
    if batch_invariant not in ("both", "auto", "on", "off"):
        raise fail(f"--batch-invariant must be both, auto, on or off, not {batch_invariant!r}")
    if speculator_impl not in ("auto", *SPECULATOR_IMPLS):
        raise fail(f"--speculator-impl must be auto, {' or '.join(SPECULATOR_IMPLS)}, not {speculator_impl!r}")
    opts = EngineOptions(n_gpu_layers=n_gpu_layers, n_ctx=n_ctx or max(sizes) + 1024, n_batch=n_batch, n_ubatch=n_ubatch,
                         n_threads=threads, n_parallel=n_parallel, score_math=score_math, batch_invariant=batch_invariant,
                         speculator_impl=speculator_impl)
    if target:
        opts.target = target
    if speculator:
        opts.speculator = speculator
    try:
        from ..bench.ttft import print_report, run_ttft_bench, run_ttft_modes, write_outputs
        from ..engine.pipeline import Engine

        kw = dict(keep=keep, scorer=scorer, lookahead=lookahead, window=window, reps=reps,
                  say=lambda m: typer.echo(m, err=True), on_report=lambda r: write_outputs(r, out, None))
        if batch_invariant == "both":
            from dataclasses import replace

            from ..engine.llama import invariance
            from ..engine.llama.binding import backend_name

            service = "on" if invariance.resolve(replace(opts, batch_invariant="auto"), backend_name()).batch_invariant \
                else "off"
            report = run_ttft_modes(opts, sizes, modes=("on", "off"), default_mode=service, **kw)
        else:
            engine = Engine(opts)
            report = run_ttft_bench(engine, sizes, **kw)
    except EngineError as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:
        raise fail("interrupted") from None
    print_report(report)
    write_outputs(report, out, plot)
    if out:
        typer.echo(f"wrote {out}")
    if plot:
        typer.echo(f"wrote {plot}")


@bench_app.command("make-model")
def bench_make_model(
    shape: str = typer.Option(..., help="qwen2: tiny, 0.5b, 1.5b, 7b or 14b; glm4moe: tiny, glm45-air-8e; qwen3: tiny, 8b; eagle3: tiny, 8b."),
    arch: str = typer.Option("qwen2", help="qwen2, glm4moe (with an MTP block), qwen3 or eagle3 (a head for qwen3)."),
    out: Path = typer.Option(..., help="Where to write the GGUF."),
    vocab: str = typer.Option("bytes", help="'bytes' (tiny byte vocabulary) or a vocab-only GGUF, e.g. llama.cpp's ggml-vocab-qwen2.gguf."),
    seed: int = typer.Option(0, help="Weight seed."),
    n_ctx: int = typer.Option(0, help="Training context written into the file (0 = the shape's)."),
    n_layer: int = typer.Option(0, help="Override the number of layers (0 = the shape's)."),
) -> None:
    """Write a random-weight GGUF of a real shape (for speed measurements: timing does not depend on weights)."""
    import time as _time

    from ..testing.synthetic import write_qwen2_gguf
    from ..testing.synthetic_archs import ARCHS, write_arch_gguf

    overrides = {}
    if n_ctx:
        overrides["n_ctx"] = n_ctx
    if n_layer:
        overrides["n_layer"] = n_layer
    t0 = _time.perf_counter()
    try:
        if arch == "qwen2":
            path = write_qwen2_gguf(out, shape, vocab=vocab, seed=seed, **overrides)
        elif arch in ARCHS:
            path = write_arch_gguf(out, arch, shape, vocab=vocab, seed=seed, **overrides)
        else:
            raise ValueError(f"unknown architecture {arch!r} (qwen2, {', '.join(ARCHS)})")
    except (ValueError, OSError) as e:
        raise fail(str(e)) from None
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB, {_time.perf_counter() - t0:.1f} s)")


@bench_app.command("worker")
def bench_worker(
    union: str = typer.Option(..., help="U:K, e.g. 0.43:8: every specprefill selection replaced by one of K questions that together cover about U of the document (random weights only)."),
    loglevel: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """`specq worker` (settings from the environment) with the selections' overlap emulated, for serving
    benchmarks on random weights (bench/gpu/serve.sh with SPECQ_BENCH_UNION). Its results say EMULATED."""
    from ..contracts import EngineError
    from ..testing.emulated_selection import EmulatedUnion
    from .common import service_ready_db, service_settings

    try:
        override = EmulatedUnion.parse(union)
    except ValueError as e:
        raise fail(f"--union: {e}") from None
    settings = service_settings()
    service_ready_db(upgrade=False)
    from ..worker.main import run_worker

    try:
        run_worker(settings, loglevel=loglevel, select_override=override)
    except EngineError as e:
        raise fail(f"worker could not load its models: {e}") from None


@bench_app.command("prefill")
def bench_prefill(
    model: str = typer.Option("qwen2.5-coder-1.5b-instruct-q4_k_m", help="Registry name or GGUF path."),
    tokens: int = typer.Option(4000, help="Prompt length."),
    keep: float = typer.Option(0.3, help="Share of tokens in the gapped / compressed prefill."),
    decode_tokens: int = typer.Option(32, help="Single-token decode steps timed after a full prefill."),
    reps: int = typer.Option(3, help="Rounds after a dropped warm-up (median counts)."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    n_batch: int = typer.Option(4096, help="Largest batch handed to llama_decode."),
    n_ubatch: int = typer.Option(512, help="Micro-batch."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Prefill and decode tokens/s of one model; gapped (original positions) vs contiguous prefill of the same count."""
    import json
    import os

    from ..contracts import EngineError
    from ..engine.models import resolve_model

    if tokens < 64 or not 0 < keep <= 1 or reps < 1:
        raise fail("--tokens must be >= 64, --keep in (0, 1], --reps >= 1")
    try:
        from ..bench.prefill import run_prefill_bench

        path = resolve_model(model)
        report = run_prefill_bench(str(path), n_tokens=tokens, keep=keep, decode_tokens=decode_tokens, reps=reps,
                                   n_gpu_layers=n_gpu_layers, n_threads=threads or (os.cpu_count() or 1),
                                   n_batch=n_batch, n_ubatch=n_ubatch, say=lambda m: typer.echo(m, err=True))
    except EngineError as e:
        raise fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    r = report
    typer.echo(f"{r['model']}: {r['prompt_tokens']} tokens")
    typer.echo(f"  full prefill        {r['full_s']:8.3f} s  {r['full_tok_s']:8.1f} tok/s")
    typer.echo(f"  gapped ({r['kept_tokens']} tokens) {r['gapped_s']:8.3f} s  {r['gapped_tok_s']:8.1f} tok/s  (original positions)")
    typer.echo(f"  compressed (same)   {r['compressed_s']:8.3f} s  {r['compressed_tok_s']:8.1f} tok/s  -> gapped/compressed {r['gapped_vs_compressed']:.3f}")
    typer.echo(f"  decode              {r['decode_tok_s']:8.2f} tok/s")


@bench_app.command("serve")
def bench_serve(
    url: str = typer.Option(None, help="The running service (default SPECQ_API_URL or http://127.0.0.1:8178, where `specq up` listens)."),
    kind: str = typer.Option("specq", help="specq or llama-server (which fields carry ignore_eos and the mode)."),
    docs: int = typer.Option(8, help="Distinct documents."),
    doc_tokens: int = typer.Option(1000, help="Tokens per document (about: --chars-per-token characters each)."),
    questions: int = typer.Option(1, help="Questions per document (jobs = docs x questions)."),
    max_tokens: int = typer.Option(64, help="Output tokens per job (ignore_eos: exactly this many)."),
    arrival: str = typer.Option("t0", help="t0 = every job at once; per-doc = each document's questions one after "
                                "the other (the next sent when the last ended), the documents in parallel; a rate "
                                "in jobs per second, e.g. 0.5; or poisson:RATE, random (Poisson) arrivals at RATE jobs "
                                "per second, the same offsets for the same --seed."),
    mode: str = typer.Option("baseline", help="specq's mode: baseline, specprefill or auto (llama-server: ignored)."),
    documents: bool = typer.Option(False, "--documents/--chat", help="specq only: store each document once (POST "
                                   "/v1/documents) and send each question as a job naming its document_id (POST "
                                   "/v1/jobs, followed on GET /v1/jobs/{id}/events), the path where group claims "
                                   "and the document caches apply; uploads are timed apart, not in the makespan. "
                                   "Default --chat: every job an inline prompt to /v1/chat/completions."),
    seed: int = typer.Option(0, help="Seed of the documents' text (another seed: other documents), of the "
                             "Poisson arrivals and of the mixed workload's lengths."),
    lengths_mix: str = typer.Option("", help="Mixed workload: LO:HI document tokens, drawn log-uniform per job from "
                                    "--seed (e.g. 4096:65536); each of --docs jobs its own document; chat path, one "
                                    "question each. The summary adds TTFT p90 and per-band rows (--length-bands)."),
    max_tokens_mix: str = typer.Option("", help="Mixed workload: LO:HI output tokens, drawn uniform per job from "
                                       "--seed (e.g. 64:512), instead of --max-tokens."),
    length_bands: str = typer.Option("8192,32768", help="Mixed workload: band edges in document tokens "
                                     "(8192,32768: <8K, 8K-32K, >=32K)."),
    keep: float = typer.Option(0.3, help="specq's keep fraction for specprefill."),
    chars_per_token: float = typer.Option(4.0, help="Characters per token of the models' tokenizer (byte vocabularies: 1)."),
    model: str = typer.Option("", help="The request's model field (default: the first of GET /v1/models)."),
    api_key: str = typer.Option("", envvar="SPECQ_API_KEY", help="Bearer key, if the service wants one."),
    label: str = typer.Option("", help="Name of this run in the report and plot."),
    timeout: float = typer.Option(3600.0, help="Seconds one request may take."),
    out: Path = typer.Option(None, help="Write the report as JSON here."),
    plot: Path = typer.Option(None, help="Write a PNG here (needs matplotlib); with --compare, all reports."),
    compare: list[Path] = typer.Option(None, help="Earlier reports (JSON) drawn in the same PNG."),
) -> None:
    """Jobs/min, client and engine TTFT p50/p95 and decode tokens/s of a workload sent to a running service:
    through OpenAI /v1/chat/completions with streaming (the same client for specq and llama-server), or with
    --documents through specq's stored documents and native jobs (its per-job modes and cache hits reported).
    For specq, also where each job's time went: p50/p90 of the gaps between its server-side stamps (GET
    /v1/jobs/{id} `trace`) and the client's send and first text."""
    import json

    from ..bench.serve import Workload, check_arrival, plot as draw, run_serve_bench
    from ..client import api_url

    if kind not in ("specq", "llama-server"):
        raise fail(f"--kind must be specq or llama-server, not {kind!r}")
    if documents and kind != "specq":
        raise fail("--documents is specq's path (POST /v1/documents, /v1/jobs); llama-server takes --chat")
    bad_arrival = check_arrival(arrival)
    if bad_arrival:
        raise fail(bad_arrival)
    if min(docs, doc_tokens, questions, max_tokens) < 1:
        raise fail("--docs, --doc-tokens, --questions and --max-tokens must be >= 1")
    mixed = bool(lengths_mix or max_tokens_mix)
    if mixed:
        from ..bench.workloads import parse_bands, parse_range

        if documents or questions != 1:
            raise fail("--lengths-mix / --max-tokens-mix run the chat path with one question per document "
                       "(no --documents, --questions 1)")
        try:
            for text, what in ((lengths_mix, "--lengths-mix"), (max_tokens_mix, "--max-tokens-mix")):
                if text:
                    parse_range(text, what)
            parse_bands(length_bands)
        except ValueError as e:
            raise fail(str(e)) from None
    w = Workload(docs=docs, doc_tokens=doc_tokens, questions=questions, max_tokens=max_tokens, arrival=arrival,
                 mode=mode, keep=keep, chars_per_token=chars_per_token, seed=seed, documents=documents,
                 lengths_mix=lengths_mix, max_tokens_mix=max_tokens_mix, length_bands=length_bands)
    report = run_serve_bench(url or api_url(), w, kind=kind, model=model, api_key=api_key, timeout=timeout, label=label)
    s = report["summary"]
    typer.echo(f"{report['label']} ({s['path']}, arrival {arrival}): {s['succeeded']}/{s['jobs']} jobs in "
               f"{s['makespan_s']} s = {s['jobs_per_min']} jobs/min; "
               f"client TTFT p50 {s['client_ttft_ms_p50']} ms p95 {s['client_ttft_ms_p95']} ms; engine TTFT p50 "
               f"{s['engine_ttft_ms_p50']} ms p95 {s['engine_ttft_ms_p95']} ms; decode {s['decode_tok_s_per_job_p50']} tok/s "
               f"per job, {s['output_tok_s_total']} tok/s in all")
    if s.get("client_ttft_ms_first_question_p50") is not None:
        typer.echo(f"  client TTFT of each document's first question p50 {s['client_ttft_ms_first_question_p50']} ms "
                   f"p95 {s['client_ttft_ms_first_question_p95']} ms; of the later ones p50 "
                   f"{s['client_ttft_ms_later_questions_p50']} ms p95 {s['client_ttft_ms_later_questions_p95']} ms")
    if s.get("prefill_floor_ms_p50") is not None:
        typer.echo(f"  prefill-compute floor per job (scoring + prefill, engine time) p50 {s['prefill_floor_ms_p50']} ms: "
                   f"{s['jobs_per_min_prefill_floor']} jobs/min if that work ran back to back and nothing else")
    if "mixed" in s:
        m = s["mixed"]
        typer.echo(f"  mixed: client TTFT p90 {m['client_ttft_ms_p90']} ms")
        for name, b in m["bands"].items():
            typer.echo(f"  band {name}: {b['succeeded']}/{b['jobs']} jobs, {b['jobs_per_min']} jobs/min, "
                       f"{b['output_tok_s']} output tok/s, client TTFT p50 {b['client_ttft_ms_p50']} ms "
                       f"p90 {b['client_ttft_ms_p90']} ms")
    if documents:
        typer.echo(f"  {w.docs} documents stored in {s['upload_s']} s (not in the makespan; with it: "
                   f"{s['jobs_per_min_with_upload']} jobs/min)")
    if "modes" in s:
        typer.echo(f"  modes {s['modes']}; target prompt-cache hits {s['target_cache_hits']} "
                   f"({s.get('target_slot_hits', 0)} from their slot; {s['target_reused_tokens']} tokens reused); "
                   f"speculator windows reused "
                   f"{s['speculator_window_hits']} ({s['speculator_window_resident']} still in their stream), "
                   f"prefilled {s['speculator_window_misses']}")
    if s.get("group_members"):
        typer.echo(f"  group-sparse: {s['group_members']} jobs in groups (size p50 {s['group_size_p50']}), "
                   f"{s['group_union_copies']} copied head + union from another slot; union {s['group_union_fraction_p50']} "
                   f"of the document (p50), own selection {s['group_own_fraction_p50']}; "
                   f"{s['group_prefilled_tokens']} target tokens prefilled by members")
    if s.get("breakdown_ms"):
        typer.echo("  where the time went (ms, p50 / p90 over the jobs; server stamps, GET /v1/jobs/{id} trace):")
        for gap, v in s["breakdown_ms"].items():
            typer.echo(f"    {gap:<32} {v['p50']:>10.1f} {v['p90']:>10.1f}  ({v['n']} jobs)")
    for e in s["errors"]:
        typer.echo(f"error: {e}", err=True)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        typer.echo(f"wrote {out}")
    if plot:
        reports = [json.loads(p.read_text()) for p in (compare or [])] + [report]
        draw(reports, str(plot))
        typer.echo(f"wrote {plot}")
    if s["succeeded"] < s["jobs"]:
        raise typer.Exit(1)


@bench_app.command("calibrate-service")
def bench_calibrate_service(
    url: str = typer.Option(None, help="The running service (default SPECQ_API_URL or http://127.0.0.1:8178)."),
    docs: int = typer.Option(8, help="Documents (text lines, made as `bench serve` makes its documents)."),
    questions: int = typer.Option(2, help="Questions per document (units = docs x questions)."),
    doc_tokens: int = typer.Option(7680, help="Tokens per document (about: --chars-per-token characters each)."),
    chars_per_token: float = typer.Option(4.0, help="Characters per token of the models' tokenizer."),
    lengths: str = typer.Option("", help="The calibration's length edges, comma-separated (default: the service's)."),
    keep: float = typer.Option(0.3, help="The keep calibrated."),
    max_tokens: int = typer.Option(32, help="Tokens each answer generates at most."),
    seed: int = typer.Option(0, help="Seed of the documents' text."),
    api_key: str = typer.Option("", envvar="SPECQ_API_KEY", help="An admin key, if the service wants one."),
    timeout: float = typer.Option(3600.0, help="Seconds to wait for the calibration."),
    out: Path = typer.Option(None, help="Write the report as JSON here."),
) -> None:
    """Questions per minute of a calibration run by the service's workers (POST /v1/calibrations with `text`
    lines, the path of `specq calibrate --service`): wall from the POST to the last unit done, per-unit seconds."""
    import json
    import time

    from ..bench import calibrate_service as cs
    from ..bench.provenance import Start, provenance
    from ..client import api_url

    if min(docs, questions, doc_tokens, max_tokens) < 1:
        raise fail("--docs, --questions, --doc-tokens and --max-tokens must be >= 1")
    start = Start()
    body: dict = {"lines": cs.lines(docs, questions, doc_tokens, chars_per_token, seed), "keep": [keep],
                  "max_tokens": max_tokens, "task": "lookup"}
    if lengths:
        body["lengths"] = [int(x) for x in lengths.split(",") if x.strip()]
    measured = cs.run(url or api_url(), body, api_key=api_key, timeout=timeout)
    report = {"benchmark": "calibrate-service", "url": url or api_url(),
              "workload": {"docs": docs, "questions": questions, "doc_tokens": doc_tokens, "chars_per_token": chars_per_token,
                           "keep": keep, "max_tokens": max_tokens, "lengths": body.get("lengths"), "seed": seed},
              **measured, "measured": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "provenance": provenance(None, start=start, measured_from="client")}
    typer.echo(f"calibration {measured['calibration_id']}: {measured['status']}, {measured['units_done']}/{measured['units']} "
               f"units in {measured['wall_s']} s = {measured['questions_per_min']} questions/min; per unit p50 "
               f"{measured['unit_s_p50']} s (engine {measured['unit_engine_s_p50']} s); {measured['rows_written']} rows")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        typer.echo(f"wrote {out}")
    if measured["status"] != "succeeded":
        raise typer.Exit(1)


@bench_app.command("shadow-cost")
def bench_shadow_cost(
    url: str = typer.Option(None, help="The running service (default SPECQ_API_URL or http://127.0.0.1:8178)."),
    shadow_rate: float = typer.Option(..., help="The SPECQ_SHADOW_RATE the service was started with (recorded)."),
    jobs: int = typer.Option(32, help="Jobs of the Poisson run (each its own document)."),
    doc_tokens: int = typer.Option(15360, help="Tokens per document."),
    chars_per_token: float = typer.Option(4.0, help="Characters per token of the models' tokenizer."),
    max_tokens: int = typer.Option(64, help="Output tokens per job (ignore_eos)."),
    keep: float = typer.Option(0.3, help="Keep of the jobs (mode auto)."),
    seed: int = typer.Option(0, help="Seed of the documents and of the Poisson arrivals."),
    utilization: float = typer.Option(0.7, help="Arrival rate = this / the probe jobs' median time (no --rate-from)."),
    probe: int = typer.Option(3, help="Jobs sent one after another before the run (they also derive the rate)."),
    rate_from: Path = typer.Option(None, help="An earlier run's JSON: take its arrival rate (the identical job list)."),
    against: Path = typer.Option(None, help="The run without shadows (its JSON): write the comparison to --out."),
    routing: str = typer.Option("", help="How mode auto was sent to specprefill (recorded), e.g. the override's value."),
    api_key: str = typer.Option("", envvar="SPECQ_API_KEY", help="Bearer key, if the service wants one."),
    out: Path = typer.Option(None, help="Write the report as JSON here."),
) -> None:
    """Jobs/min, client TTFT p50/p90 and the shadow checks run, cancelled and their seconds inside the window
    (/metrics) of a Poisson run in mode auto; with --against, the ratio with / without shadows
    (specq/bench/shadow_cost.py)."""
    import json
    import time

    from ..bench import shadow_cost as sc
    from ..bench.provenance import Start, provenance
    from ..bench.serve import Workload
    from ..client import api_url

    start = Start()
    rate = json.loads(rate_from.read_text())["arrival_rate"] if rate_from else None
    w = Workload(docs=jobs, doc_tokens=doc_tokens, questions=1, max_tokens=max_tokens, mode="auto", keep=keep,
                 chars_per_token=chars_per_token, seed=seed)
    r = sc.run(url or api_url(), w, shadow_rate=shadow_rate, arrival_rate=rate, utilization=utilization, probe=probe,
               api_key=api_key)
    r.update(benchmark="shadow-cost-run", routing=routing,
             measured=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
             provenance=provenance(None, start=start, measured_from="client"))
    win = r["shadow_window"]
    typer.echo(f"shadow rate {shadow_rate:g}, poisson:{r['arrival_rate']}: {r['succeeded']}/{r['jobs']} jobs, "
               f"{r['jobs_per_min']} jobs/min, client TTFT p50 {r['client_ttft_ms_p50']} ms p90 {r['client_ttft_ms_p90']} ms, "
               f"busy {r['busy_fraction']}, modes {r['modes']}; in the window: {win['checks']:g} checks, "
               f"{win['cancelled']:g} cancelled, {win['seconds']} s")
    report = r
    if against:
        off = json.loads(against.read_text())
        report = {"benchmark": "shadow-cost", "routing": routing, "without": off, "with": r,
                  "ratio_with_over_without": sc.compare(off, r), "measured": r["measured"], "provenance": r["provenance"]}
        typer.echo(f"with / without: {report['ratio_with_over_without']}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        typer.echo(f"wrote {out}")
    if r["succeeded"] < r["jobs"]:
        raise typer.Exit(1)


@bench_app.command("group")
def bench_group(
    lengths: str = typer.Option("2000,4000", help="Comma-separated prompt lengths in tokens."),
    groups: str = typer.Option("1,2,4,8", help="Comma-separated group sizes (questions per document)."),
    keep: float = typer.Option(0.3, help="Fraction of the document's chunks each question keeps."),
    chunk: int = typer.Option(32, help="Tokens per kept chunk."),
    window: int = typer.Option(0, help="Document tokens per scoring window (0 = auto: one window up to 8,192 tokens, else 4,096)."),
    max_tokens: int = typer.Option(8, help="Tokens decoded per answer."),
    reps: int = typer.Option(3, help="Rounds after the dropped warm-up (median counts)."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    batch_invariant: str = typer.Option("auto", help="Batch-invariant target numerics: auto, on, off."),
    cache_bytes: int = typer.Option(2 << 30, help="Byte budget of the speculator window cache and the target's "
                                    "prompt cache (both strategies that reuse the document need them; > 0)."),
    out: Path = typer.Option(None, help="Write the report (rows and provenance) as JSON here."),
) -> None:
    """k questions about one document: k specprefill runs vs full prefill + prompt cache vs one
    group-sparse prefill (engine/group_sparse.py); total time and per-question TTFT from the group's start."""
    import json

    from ..contracts import EngineError
    from ..engine.options import EngineOptions

    try:
        sizes = [int(x.replace("_", "")) for x in lengths.split(",") if x.strip()]
        ks = [int(x) for x in groups.split(",") if x.strip()]
    except ValueError:
        raise fail("--lengths and --groups are comma-separated integers") from None
    if not sizes or not ks or min(sizes) < 64 or min(ks) < 1 or reps < 1 or cache_bytes <= 0:
        raise fail("--lengths must be >= 64 tokens, --groups >= 1, --reps >= 1, --cache-bytes > 0")
    opts = EngineOptions(n_gpu_layers=n_gpu_layers, n_ctx=max(sizes) + 1024, n_threads=threads,
                         batch_invariant=batch_invariant, cache_bytes=cache_bytes)
    if target:
        opts.target = target
    if speculator:
        opts.speculator = speculator
    try:
        from ..bench.group import print_report, run_group_bench
        from ..engine.pipeline import Engine

        engine = Engine(opts)
        report = run_group_bench(engine, sizes, ks, keep=keep, chunk=chunk, window=window, max_tokens=max_tokens,
                                 reps=reps, say=lambda m: typer.echo(m, err=True))
    except EngineError as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:
        raise fail("interrupted") from None
    print_report(report, typer.echo)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        typer.echo(f"wrote {out}")


@bench_app.command("selection")
def bench_selection(
    lengths: str = typer.Option("8192,16384", help="Comma-separated prompt lengths in tokens."),
    keep: float = typer.Option(0.3, help="Fraction of the document's chunks kept (both rules)."),
    window: int = typer.Option(0, help="Document tokens per scoring window (0 = 4096)."),
    tasks: int = typer.Option(5, help="The first N of the planted-fact tasks."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path."),
    out: Path = typer.Option(None, "--out", help="Write the JSON report here (rows as they finish)."),
) -> None:
    """Answer-chunk recall of global vs per-window selection from the same speculator scores."""
    from ..bench.selection import main

    argv = ["--lengths", lengths, "--keep", str(keep), "--window", str(window), "--tasks", str(tasks),
            "--threads", str(threads)]
    if speculator:
        argv += ["--speculator", speculator]
    if out:
        argv += ["--json", str(out)]
    main(argv)


@bench_app.command("quality")
def bench_quality(
    half: str = typer.Argument(..., help="recall (speculator only: every scorer and keep), answer (target: baseline vs specprefill), "
                                          "group (families: one group-sparse prefill per family, paired with answer's records) or report."),
    journal: list[Path] = typer.Option(..., help="JSONL journal: results are appended per task and a rerun skips done tasks (report: one or more)."),
    lengths: str = typer.Option("4000,8000,16000", help="Comma-separated document lengths in tokens."),
    n: int = typer.Option(200, help="Tasks per length."),
    start: int = typer.Option(0, help="First task index (tasks are numbered per length)."),
    seed: int = typer.Option(0, help="Task seed."),
    kinds: str = typer.Option("needle,multikey,raises,const", help="Task kinds, rotated: needle, multikey (planted), raises, const (not planted); "
                                                             "or, apart from those, two-place, aggregation, review, summary (questions about whole "
                                                             "windows of real source files, bench/kinds-documents.json; docs/quality.md)."),
    split: str = typer.Option("reported", help="two-place/aggregation/review/summary: which documents of the catalogue, "
                                                "tuning (to choose a default on) or reported (rows that vouch for one)."),
    shape: str = typer.Option("native", help="answer: native (document, then question) or chat (both in one OpenAI user message)."),
    per_kind: int = typer.Option(2, help="two-place/aggregation/review/summary: questions per kind per document (up to)."),
    scorers: str = typer.Option("windowed,full", help="recall: scorers (windowed, full, sliding, windowed@W: windows of W document tokens, a window-size arm); windowed also yields windowed-max / windowed-z."),
    keeps: str = typer.Option("0.2,0.3,0.5", help="recall: keep levels (all from one scoring pass)."),
    keep: float = typer.Option(0.3, help="answer: keep of the specprefill runs."),
    scorer: str = typer.Option("windowed", help="answer: scorer of the specprefill runs."),
    window: int = typer.Option(0, help="Document tokens per scoring window (0 = the engine default: one window up to 8,192 tokens, else 4,096)."),
    chunk_rule: str = typer.Option(DEFAULT_CHUNK_RULE, help="How chunks are ranked: border (the engine's default), mean (the rule before "
                                                  "2026-12-04), scope (border + header lines) or block (border + whole indented blocks). recall also records "
                                                  "<scorer>-<rule> for the other rules from the same pass."),
    baseline_from: Path = typer.Option(None, help="answer: reuse the closed-book and baseline answers of this earlier answer journal "
                                                  "(same tasks and settings but the chunk rule, scorer, window or keep) instead of running them again."),
    max_tokens: int = typer.Option(24, help="answer: tokens generated per run."),
    scores_dir: str = typer.Option("", help="recall: also save each task's token scores (.npz per task and scorer, with the "
                                            "document) in this directory, to compare chunk rules offline."),
    scores_from: str = typer.Option("", help="recall: take each task's token scores from this directory (saved by --scores-dir) "
                                             "instead of scoring again; tasks without a matching file are scored."),
    family: int = typer.Option(0, help="Questions per document (up to; 0 = one document per task). Families reuse the "
                                       "document's KV through the service's caches, as a user's second question does."),
    cache_bytes: int = typer.Option(2 << 30, help="With --family (or the non-lookup kinds, always families): bytes of saved KV (speculator windows, target prompts)."),
    cache_dir: str = typer.Option("", help="With --family: keep that saved KV in this directory too, so a resumed run "
                                           "does not prefill a family's document again (SPECQ_CACHE_DIR)."),
    threads: int = typer.Option(2, help="CPU threads."),
    n_gpu_layers: int = typer.Option(0, help="Layers offloaded to the GPU."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path."),
    speculator_impl: str = typer.Option("llama", help="Who runs the speculator's scoring windows: llama (llama.cpp) or torch "
                                                      "(the PyTorch forward; its records carry score_math torch-speculator)."),
    out: Path = typer.Option(None, help="Write the aggregated report (JSON, with provenance) here."),
    table: Path = typer.Option(None, help="Write the table (Markdown) here."),
    plot: Path = typer.Option(None, help="Write a PNG plot here (needs matplotlib)."),
) -> None:
    """Quality of SpecPrefill on real text: answer-chunk recall (cheap) and answer accuracy (expensive), resumable."""
    from ..contracts import EngineError
    from ..engine.options import EngineOptions

    if half not in ("recall", "answer", "group", "report"):
        raise fail(f"half must be recall, answer, group or report, not {half!r}")
    if half == "group" and not family and not any(k.strip() in ("two-place", "aggregation", "review", "summary") for k in kinds.split(",")):
        raise fail("the group half needs --family (questions per document)")
    try:
        sizes = [int(x.replace("_", "")) for x in lengths.split(",") if x.strip()]
        keep_list = [float(x) for x in keeps.split(",") if x.strip()]
    except ValueError:
        raise fail("--lengths must be token counts and --keeps numbers") from None
    from ..bench import quality as q
    from ..bench.quality_report import plot as draw, table_markdown
    from ..bench.quality_kinds import KINDS as CODE_KINDS
    from ..bench.quality_tasks import KINDS

    from ..engine.options import CHUNK_RULES

    if chunk_rule not in CHUNK_RULES:
        raise fail(f"--chunk-rule must be one of {', '.join(CHUNK_RULES)}")
    if baseline_from is not None and half != "answer":
        raise fail("--baseline-from is an option of the answer half")
    kind_list = [k.strip() for k in kinds.split(",") if k.strip()]
    if not kind_list or any(k not in KINDS + CODE_KINDS for k in kind_list):
        raise fail(f"--kinds: known kinds are {', '.join(KINDS + CODE_KINDS)}")
    settings = q.QualitySettings(lengths=sizes, n=n, start=start, seed=seed, kinds=kind_list,
                                 scorers=[s.strip() for s in scorers.split(",") if s.strip()], keeps=keep_list, keep=keep,
                                 scorer=scorer, window=window, max_tokens=max_tokens, family=family, chunk_rule=chunk_rule,
                                 scores_dir=scores_dir, scores_from=scores_from, split=split, shape=shape, per_kind=per_kind,
                                 speculator_impl=speculator_impl)
    try:
        settings.check()
    except ValueError as e:
        raise fail(f"--kinds/--split/--shape/--per-kind/--speculator-impl: {e}") from None
    engine = None
    if half != "report":
        if len(journal) != 1:
            raise fail("recall, answer and group write one --journal")
        opts = with_models(EngineOptions(n_gpu_layers=n_gpu_layers, n_threads=threads, n_ctx=max(sizes) + 1024,
                                         cache_bytes=cache_bytes if family or settings.code_kinds else 0,
                                         cache_dir=cache_dir if family or settings.code_kinds else "",
                                         speculator_impl=settings.speculator_impl),
                           target=target, speculator=speculator)
        try:
            from ..engine.pipeline import Engine

            engine = Engine(opts)
            jr = q.Journal(journal[0], settings)
            say = lambda m: typer.echo(m, err=True)  # noqa: E731
            say(f"provenance: {q.provenance(engine, settings)}")
            if half == "answer" and baseline_from is not None:
                try:
                    reuse = q.baselines_from(baseline_from, settings)
                except (OSError, ValueError) as e:
                    raise fail(f"--baseline-from: {e}") from None
                q.run_answer(engine, settings, jr, say=say, baselines=reuse, baselines_path=str(baseline_from))
            else:
                {"recall": q.run_recall, "answer": q.run_answer, "group": q.run_group}[half](engine, settings, jr, say=say)
        except EngineError as e:
            raise fail(str(e)) from None
        except KeyboardInterrupt:
            raise fail("interrupted (the journal keeps what finished: rerun to resume)") from None
    import json

    report = q.build_report(list(journal), engine, settings if half != "report" else None)
    text = table_markdown(report)
    typer.echo(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")
        typer.echo(f"wrote {out}")
    if table:
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text(text, encoding="utf-8")
    if plot:
        draw(report, plot, title=f"{report['provenance']['git_describe']} · {report['provenance']['cpu']} · {report['provenance']['date_utc']} UTC")
        typer.echo(f"wrote {plot}")


@bench_app.command("structured")
def bench_structured(
    journal: Path = typer.Option(..., help="JSONL journal: one line per (document, arm); a rerun skips what it holds."),
    out: Path = typer.Option(None, help="Write the aggregated report (per arm, with provenance and every record) as JSON here."),
    references: Path = typer.Option(None, help="Documents and hand-written reference values (default: bench/structured/references.json)."),
    arms: str = typer.Option("schema,plain,schema-draft", help="Comma-separated arms: schema, plain, schema-draft, plain-draft."),
    documents: str = typer.Option("", help="Comma-separated document names to run (default: all)."),
    max_tokens: int = typer.Option(160, help="Tokens to generate at most per answer."),
    mode: str = typer.Option("baseline", help="Prefill mode: baseline (default: the measurement is about the grammar) or specprefill."),
    report_only: bool = typer.Option(False, "--report-only", help="Run nothing: aggregate the journal into --out and print the table."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    n_ctx: int = typer.Option(8192, help="Target context (the longest document and its answer must fit)."),
    prompt_cache: bool = typer.Option(True, "--prompt-cache/--no-prompt-cache", help="Keep each document's prompt in the engine's prompt cache, so only the first arm of a document prefills it (its TTFT counts; the first arm rotates)."),
) -> None:
    """Field accuracy of extraction with a JSON Schema and without (a plain prompt asking for JSON), TTFT,
    grammar ms per token and decode tokens/s with and without drafting, on documents with hand-written
    reference values (specq/bench/structured.py says how answers are graded)."""
    import json

    from ..bench import structured as st
    from ..contracts import EngineError

    try:
        docs = st.load_documents(references or st.REFERENCES)
    except (OSError, ValueError, KeyError) as e:
        raise fail(f"cannot read the references: {e}") from None
    if documents:
        wanted = [d.strip() for d in documents.split(",") if d.strip()]
        unknown = sorted(set(wanted) - {d.name for d in docs})
        if unknown:
            raise fail(f"unknown document(s): {', '.join(unknown)} (known: {', '.join(d.name for d in docs)})")
        docs = [d for d in docs if d.name in wanted]
    arm_list = [a.strip() for a in arms.split(",") if a.strip()]
    unknown_arms = [a for a in arm_list if a not in st.ARMS]
    if unknown_arms:
        raise fail(f"unknown arm(s): {', '.join(unknown_arms)} (known: {', '.join(st.ARMS)})")
    if mode not in ("baseline", "specprefill"):
        raise fail(f"--mode must be baseline or specprefill, not {mode!r}")
    settings = {"arms": arm_list, "max_tokens": max_tokens, "mode": mode, "documents": [d.name for d in docs],
                "prompt_cache": prompt_cache,
                "references": str(references or st.REFERENCES.relative_to(st.REPO))}
    if report_only:
        from ..bench.provenance import provenance as collect

        records = st.read_journal(journal)
        prov = collect(None, settings=settings)
    else:
        from ..bench.provenance import Start
        from ..bench.provenance import provenance as collect
        from ..engine.options import EngineOptions, RunParams
        from ..engine.pipeline import Engine

        opts = with_models(EngineOptions(n_gpu_layers=n_gpu_layers, n_threads=threads, n_ctx=n_ctx,
                                         cache_bytes=(1 << 30) if prompt_cache else 0), target=target,
                           speculator=speculator)
        start = Start()
        try:
            engine = Engine(opts)
        except EngineError as e:
            raise fail(str(e)) from None
        try:
            engine.run("warm up", RunParams(question="ok", max_tokens=4, mode="baseline"))
            records = st.run_structured(engine, docs, journal, arms=arm_list, max_tokens=max_tokens, mode=mode,
                                        say=typer.echo)
            prov = collect(engine, positions=[], warnings=[], start=start, settings=settings)
        except (EngineError, ValueError) as e:
            raise fail(str(e)) from None
        except KeyboardInterrupt:
            raise fail("interrupted (the journal keeps what finished; run again to resume)") from None
        finally:
            engine.close()
    names = {d.name for d in docs}
    records = [r for r in records if r["document"] in names and r["arm"] in arm_list
               and r.get("settings") == {"max_tokens": max_tokens, "mode": mode}]
    report = st.build_report(records, prov, settings)
    typer.echo(st.table_markdown(report))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        typer.echo(f"wrote {out}")


@bench_app.command("labelfree")
def bench_labelfree(
    journals: str = typer.Option(..., help="Comma-separated answer journals: `specq bench quality` answer halves and/or "
                                           "`specq calibrate` journals (graded questions with both arms' answers)."),
    choose_on: str = typer.Option(",".join(("*families*", "*scope*")), help="Comma-separated globs (on the journal's path or "
                                  "name): the journals each metric's threshold is chosen on (in-sample)."),
    check_on: str = typer.Option("", help="Comma-separated globs: the journals the chosen thresholds are checked on "
                                          "(default: every journal not chosen on), less questions about documents the choosing set holds."),
    out: Path = typer.Option(None, help="Write the report (JSON, with provenance) here, e.g. bench/results/labelfree-vs-labels-<date>.json."),
) -> None:
    """Do the label-free metrics (agreement, token F1, loglik delta) catch the questions where baseline is right and
    specprefill wrong? A confusion table per metric, its threshold chosen on one set of journals and checked on another
    (specq/bench/labelfree.py)."""
    import json

    from ..bench import labelfree as lf
    from ..bench.provenance import provenance as collect

    paths = [Path(p.strip()) for p in journals.split(",") if p.strip()]
    missing = [str(p) for p in paths if not p.is_file()]
    if not paths or missing:
        raise fail(f"--journals: no such file: {', '.join(missing)}" if missing else "--journals: give at least one journal")
    choose = [g.strip() for g in choose_on.split(",") if g.strip()]
    check = [g.strip() for g in check_on.split(",") if g.strip()]
    report = lf.build(paths, choose_on=choose, check_on=check)
    if not report["questions"]:
        raise fail("no graded question with both arms' answers in these journals")
    report["command"] = "specq bench labelfree --journals " + ",".join(str(p) for p in paths) + (
        f" --choose-on '{choose_on}'" if choose_on else "") + (f" --check-on '{check_on}'" if check_on else "")
    report["provenance"] = collect(None, settings={"journals": [str(p) for p in paths], "choose_on": choose, "check_on": check})
    typer.echo(lf.table_markdown(report))
    lab = report["labels"]
    typer.echo(f"\n{report['questions']} questions on {report['documents']} documents: {lab['harm']} harm, {lab['gain']} gain, "
               f"{lab['both-right']} both right, {lab['both-wrong']} both wrong")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        typer.echo(f"wrote {out}")


@bench_app.command("report")
def bench_report(
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when a committed table differs from what the results render."),
) -> None:
    """Render the tables of measured numbers in README.md and docs/*.md from bench/results/*.json (with
    each result's provenance), and the configuration reference from specq/settings.py: every
    `<!-- report:NAME -->` … `<!-- /report:NAME -->` block is rewritten, the prose around it is kept."""
    from ..bench.report import REPO, ReportError, render_all

    try:
        changed = render_all(write=not check)
    except ReportError as e:
        raise fail(str(e)) from None
    for path in changed:
        typer.echo(f"{'differs' if check else 'rendered'}: {path.relative_to(REPO)}")
    if check and changed:
        typer.echo("run `specq bench report` to render them", err=True)
        raise typer.Exit(1)
    if not changed:
        typer.echo("every table is up to date")
