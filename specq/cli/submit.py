"""`specq submit`: one job, or a batch of files or JSONL lines, sent to the API."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app
from .common import api_call, fail, finish_job, read_document, submit_batch, wait_with_progress


@app.command("submit")
def submit_cmd(
    files: list[Path] = typer.Argument(None, help="Documents or code files (UTF-8 text); several make a batch."),
    question: str = typer.Option(None, "-q", "--question", help="The question asked about FILE."),
    jsonl: Path = typer.Option(None, "--jsonl", help="A batch as JSONL: one {custom_id, text, question, params} per line."),
    batch_name: str = typer.Option(None, "--batch", help="Submit as a batch with this name (`specq results NAME`)."),
    mode: str = typer.Option(None, help="baseline or specprefill."),
    positions: str = typer.Option(None, help="original or compressed."),
    keep: float = typer.Option(None, help="Fraction of the document's chunks kept by specprefill."),
    scorer: str = typer.Option(None, help="windowed, sliding or full."),
    lookahead: int = typer.Option(None, help="Lookahead query rows for scoring."),
    chunk: int = typer.Option(None, help="Tokens per selection chunk."),
    max_keep: int = typer.Option(None, help="Cap on kept document tokens (0 = none)."),
    min_tokens: int = typer.Option(None, help="Shorter prompts run baseline (-1 = engine default)."),
    pool: int = typer.Option(None, help="Average-pool kernel over scores (odd)."),
    window: int = typer.Option(None, help="Document tokens per scoring window (0 = auto)."),
    max_tokens: int = typer.Option(None, help="Tokens to generate at most."),
    temperature: float = typer.Option(None, help="0 = greedy."),
    top_k: int = typer.Option(None, help="0 = off."),
    top_p: float = typer.Option(None, help="1 = off."),
    seed: int = typer.Option(None, help="Sampling seed (-1 = random)."),
    draft: str = typer.Option(None, help="Speculative decoding drafter: none, ngram, model, mtp (the target's MTP layers), eagle3 (--drafter) or auto."),
    n_draft: int = typer.Option(None, help="Tokens drafted per verification batch."),
    draft_min: int = typer.Option(None, help="Skip drafts shorter than this."),
    p_min: float = typer.Option(None, help="Model drafts stop below this top probability (0 = off)."),
    ngram: int = typer.Option(None, help="N-gram size for the ngram drafter."),
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait for the answer with a progress bar, then print it."),
    as_json: bool = typer.Option(False, "--json", help="With --wait: print the run result object as JSON."),
) -> None:
    """Submit FILE + QUESTION as a job to the specq API (SPECQ_API_URL); print its id, or with --wait its answer.

    Several FILEs, --jsonl or --batch submit a batch (one job per file or line): its id is printed;
    --wait shows the batch's progress; then `specq results BATCH --format csv`.

    Options not given take the server's defaults (those of `specq run`). Model options (target, speculator,
    GPU layers, context) belong to the worker: `specq worker --help`.
    """
    from ..contracts import InputError

    given = dict(mode=mode, positions=positions, keep=keep, scorer=scorer, lookahead=lookahead, chunk=chunk,
                 max_keep=max_keep, min_tokens=min_tokens, pool=pool, window=window, max_tokens=max_tokens,
                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft=draft, n_draft=n_draft,
                 draft_min=draft_min, p_min=p_min, ngram=ngram)
    params = {k: v for k, v in given.items() if v is not None}
    files = list(files or [])
    if jsonl is not None or batch_name is not None or len(files) > 1:
        return submit_batch(files, jsonl, question, params, batch_name, wait)  # the batches section below
    if not files:
        raise fail("give a FILE to submit (or several, or --jsonl FILE for a batch)")
    file = files[0]
    try:  # the server's checks, before uploading
        read_document(file)
    except InputError as e:
        raise fail(str(e)) from None

    def go(c):
        job = c.submit_file(file, question=question, params=params)
        if not wait:
            typer.echo(job["id"])
            typer.echo(f"queued: `specq status {job['id']}` or `specq result {job['id']}`", err=True)
            return
        try:
            done = wait_with_progress(c, job["id"])
        except KeyboardInterrupt:
            raise fail(f"stopped waiting; job {job['id']} keeps running (`specq status {job['id']}`)") from None
        finish_job(done, as_json)

    api_call(go)

