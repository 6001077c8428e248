"""`specq bench …`: benchmarks on this machine (not timed tests)."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app
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
    window: int = typer.Option(0, help="Document tokens per scoring window (0 = auto)."),
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
    batch_invariant: str = typer.Option("both", help="Batch-invariant target numerics: both (on, then off: the headline "
                                        "compares with the fastest baseline), auto (= off), on, off."),
    out: Path = typer.Option(None, help="Write the report as JSON here."),
    plot: Path = typer.Option(None, help="Write a PNG plot here (needs matplotlib: pip install 'specq[bench]')."),
) -> None:
    """TTFT of baseline vs specprefill, alternating in one run, in the same numerics, with the phase split
    and ratio; by default in both batch-invariant modes, quoting the fastest baseline."""
    from ..contracts import EngineError
    from ..engine.options import EngineOptions

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
    opts = EngineOptions(n_gpu_layers=n_gpu_layers, n_ctx=n_ctx or max(sizes) + 1024, n_batch=n_batch, n_ubatch=n_ubatch,
                         n_threads=threads, n_parallel=n_parallel, score_math=score_math, batch_invariant=batch_invariant)
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

            from ..engine import invariance
            from ..engine.llama import backend_name

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

    from ..engine.synthetic import write_qwen2_gguf
    from ..engine.synthetic_archs import ARCHS, write_arch_gguf

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
