"""`specq run`: one job answered in this process, no service needed."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app
from .common import CHUNK_RULE_HELP, fail, read_document, with_models
from ..engine.options import DEFAULT_CHUNK_RULE
from .output import print_json


@app.command("run")
def run_cmd(
    file: Path = typer.Argument(..., help="A long document or code file (text: UTF-8, or UTF-16/32 with a BOM); - reads stdin."),
    question: str = typer.Option("", "-q", "--question", help="The question asked about FILE."),
    mode: str = typer.Option("auto", help="auto (the cheapest path measured safe: docs/engine.md), baseline (prefill every token) or specprefill (score, keep the top chunks)."),
    positions: str = typer.Option("original", help="original (kept tokens keep their position ids) or compressed."),
    keep: float = typer.Option(None, help="Fraction of the document's chunks kept by specprefill. Unset: mode auto runs the keep `specq calibrate` certified for the prompt's length band, else 0.3; --mode specprefill runs 0.3."),
    scorer: str = typer.Option("windowed", help="windowed, sliding or full."),
    lookahead: int = typer.Option(8, help="Lookahead query rows for scoring."),
    chunk: int = typer.Option(32, help="Tokens per selection chunk."),
    max_keep: int = typer.Option(0, help="Cap on kept document tokens (0 = none)."),
    min_tokens: int = typer.Option(-1, help="Shorter prompts run baseline (-1 = engine default)."),
    pool: int = typer.Option(13, help="Average-pool kernel over scores (odd)."),
    window: int = typer.Option(0, help="Document tokens per scoring window (0 = auto: one window up to 8,192 tokens, else 4,096)."),
    selection: str = typer.Option("global", help="How specprefill spends the keep budget: global (whole document) or per-window (each scoring window)."),
    chunk_rule: str = typer.Option(DEFAULT_CHUNK_RULE, help=CHUNK_RULE_HELP),
    task: str = typer.Option("", help="What kind of question this is (lookup, two-place, aggregation, review, summary): mode auto reads that kind's quality evidence; not given, auto needs every kind's (docs/quality.md)."),
    pipelined: bool = typer.Option(False, "--pipelined/--no-pipelined", help="Prefill each window's kept chunks while the next window is scored (needs --selection per-window)."),
    max_tokens: int = typer.Option(256, help="Tokens to generate at most."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_k: int = typer.Option(0, help="0 = off."),
    top_p: float = typer.Option(1.0, help="1 = off."),
    seed: int = typer.Option(-1, help="Sampling seed (-1 = random)."),
    draft: str = typer.Option("none", help="Speculative decoding drafter: none, ngram, model, mtp (the target's MTP layers), eagle3 (--drafter) or auto."),
    n_draft: int = typer.Option(4, help="Tokens drafted per verification batch."),
    draft_min: int = typer.Option(1, help="Skip drafts shorter than this."),
    p_min: float = typer.Option(0.0, help="Model drafts stop below this top probability (0 = off)."),
    ngram: int = typer.Option(2, help="N-gram size for the ngram drafter."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator/drafter model: registry name or GGUF path."),
    drafter: str = typer.Option(None, help="EAGLE3 head paired with the target, for --draft eagle3 (GGUF path)."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    n_ctx: int = typer.Option(0, help="Target context size (0 = model's, capped at 32768)."),
    flash_attn: bool = typer.Option(True, "--flash-attn/--no-flash-attn", help="Flash attention."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    batch_invariant: str = typer.Option("auto", help="Batch-invariant target numerics (greedy output identical with every drafter): auto (= off), on (greedy output identical with every drafter on the CPU, at a prefill cost), off."),
    as_json: bool = typer.Option(False, "--json", help="Print the run result object as JSON."),
) -> None:
    """Answer QUESTION about FILE in this process (no service needed) and print the phase timings.

    FILE `-` reads the document from stdin: `git diff | specq run - -q "What changed?"`.
    """

    from ..contracts import EngineError
    from ..engine.options import EngineOptions, RunParams

    try:
        params = RunParams.from_dict(
            dict(question=question, mode=mode, positions=positions, keep=keep, scorer=scorer, lookahead=lookahead,
                 chunk=chunk, max_keep=max_keep, min_tokens=min_tokens, pool=pool, window=window, selection=selection,
                 chunk_rule=chunk_rule, pipelined=pipelined, task=task, max_tokens=max_tokens,
                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft=draft, n_draft=n_draft,
                 draft_min=draft_min, p_min=p_min, ngram=ngram)
        )
        document = read_document(file)
        if batch_invariant not in ("auto", "on", "off"):
            raise fail(f"--batch-invariant must be auto, on or off, not {batch_invariant!r}")
        opts = with_models(EngineOptions(n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, flash_attn=flash_attn, n_threads=threads,
                                         batch_invariant=batch_invariant), target=target, speculator=speculator, drafter=drafter)
        from ..engine.pipeline import Engine

        engine = Engine(opts)
        result = engine.run(document, params).to_dict()
    except EngineError as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:
        raise fail("interrupted") from None
    if as_json:
        print_json(result)
    else:
        from .render import print_result

        print_result(result)

