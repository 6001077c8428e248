"""`specq submit`: one job, or a batch of files or JSONL lines, sent to the API."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app
from .common import (CHUNK_RULE_HELP, STDIN_NAME, api_call, fail, finish_job, is_stdin, load_document, read_input, shown_name,
                     stream_answer, wait_batch_with_progress, wait_with_progress)
from .output import print_json, safe, stdout_is_terminal
from .render import print_results_table


@app.command("submit")
def submit_cmd(
    files: list[Path] = typer.Argument(None, help="Documents or code files (text: UTF-8, or UTF-16/32 with a BOM); several make a batch; - reads one from stdin."),
    question: str = typer.Option(None, "-q", "--question", help="The question asked about FILE (required with FILEs; a --jsonl line may carry its own)."),
    questions: Path = typer.Option(None, "--questions", help="A text file of questions, one a line: FILE is stored once "
                                   "(POST /v1/documents) and asked each of them, as one batch of one job per question "
                                   "(- = stdin); each request's custom_id is `qN: the question`."),
    jsonl: Path = typer.Option(None, "--jsonl", help="A batch as JSONL: one {custom_id, text or document_id, question, params} per line (- = stdin)."),
    batch_name: str = typer.Option(None, "--batch", help="Submit as a batch with this name (`specq results NAME`)."),
    mode: str = typer.Option(None, help="auto (the default: docs/engine.md), baseline or specprefill."),
    positions: str = typer.Option(None, help="original or compressed."),
    keep: float = typer.Option(None, help="Fraction of the document's chunks kept by specprefill. Unset: mode auto runs the keep `specq calibrate` certified for the prompt's length band, else 0.3; --mode specprefill runs 0.3."),
    scorer: str = typer.Option(None, help="windowed, sliding or full."),
    lookahead: int = typer.Option(None, help="Lookahead query rows for scoring."),
    chunk: int = typer.Option(None, help="Tokens per selection chunk."),
    max_keep: int = typer.Option(None, help="Cap on kept document tokens (0 = none)."),
    min_tokens: int = typer.Option(None, help="Shorter prompts run baseline (-1 = engine default)."),
    pool: int = typer.Option(None, help="Average-pool kernel over scores (odd)."),
    window: int = typer.Option(None, help="Document tokens per scoring window (0 = auto: one window up to 8,192 tokens, else 4,096)."),
    selection: str = typer.Option(None, help="How specprefill spends the keep budget: global (whole document) or per-window (each scoring window)."),
    chunk_rule: str = typer.Option(None, help=CHUNK_RULE_HELP),
    task: str = typer.Option(None, help="What kind of question this is (lookup, two-place, aggregation, review, summary): mode auto reads that kind's quality evidence; not given, auto needs every kind's (docs/quality.md)."),
    pipelined: bool = typer.Option(None, "--pipelined/--no-pipelined", help="Prefill each window's kept chunks while the next window is scored (needs --selection per-window)."),
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
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait for the answer: progress (phase, i/n, time in it, "
                              "time left), then the answer as it is decoded, what ran and why, and the phase table."),
    as_json: bool = typer.Option(False, "--json", help="Print the new job (batch) object as JSON instead of its id; with --wait the run result object with the job's id as `job_id` (the finished batch)."),
) -> None:
    """Submit FILE + QUESTION as a job to the specq API (`specq --url`, SPECQ_API_URL or the URL `specq up` recorded); print its id, or with --wait its answer.

    Several FILEs, --jsonl or --batch submit a batch (one job per file or line): its id is printed;
    --wait shows the batch's progress, then on a terminal its answers (`specq results BATCH` prints
    them again; --format csv or jsonl). FILE `-` is stdin
    (the job's file name is "stdin"): `git diff | specq submit - -q "Any bugs?" --wait`.

    Options not given take the server's defaults (those of `specq run`). Model options (target, speculator,
    GPU layers, context) belong to the worker: `specq worker --help`.
    """
    from ..contracts import InputError

    given = dict(mode=mode, positions=positions, keep=keep, scorer=scorer, lookahead=lookahead, chunk=chunk,
                 max_keep=max_keep, min_tokens=min_tokens, pool=pool, window=window, selection=selection,
                 chunk_rule=chunk_rule, pipelined=pipelined, task=task, max_tokens=max_tokens,
                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft=draft, n_draft=n_draft,
                 draft_min=draft_min, p_min=p_min, ngram=ngram)
    params = {k: v for k, v in given.items() if v is not None}
    files = list(files or [])
    if questions is not None:
        return submit_questions(files, questions, question, jsonl, params, batch_name, wait, as_json)  # below
    if jsonl is not None or batch_name is not None or len(files) > 1:
        return submit_batch(files, jsonl, question, params, batch_name, wait, as_json)  # below
    if not files:
        raise fail("give a FILE to submit (or several, or --jsonl FILE for a batch)")
    try:  # the server's checks, before uploading
        filename, data, _ = load_document(files[0])
    except InputError as e:
        raise fail(str(e)) from None
    require_question(question)

    def go(c):
        job = c.submit_bytes(filename, data, question=question, params=params)
        if not wait:
            if as_json:
                print_json(job)
            else:
                typer.echo(job["id"])
            typer.echo(f"queued: `specq status {job['id']}` or `specq result {job['id']} --wait`", err=True)
            return
        typer.echo(f"job {job['id']}", err=True)  # to find it again (`specq status`) while the answer comes
        try:
            if as_json:
                done, printed = wait_with_progress(c, job["id"]), False
            else:  # the answer is printed as it is decoded (the job's event stream)
                done, printed = stream_answer(c, job["id"])
        except KeyboardInterrupt:
            raise fail(f"stopped waiting; job {job['id']} keeps running (`specq status {job['id']}`)") from None
        finish_job(done, as_json, printed, with_id=True)

    api_call(go)


def require_question(question: str | None) -> None:
    """FILEs need -q: without it the job would ask an empty question."""
    if not (question or "").strip():
        raise fail('give the question about FILE with -q QUESTION (e.g. -q "Any bugs?"), or --questions FILE '
                   'for several')


def read_questions(path: Path) -> list[str]:
    """The non-blank lines of a questions file (- = stdin), stripped."""
    from ..contracts import InputError

    _, data = read_input(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{STDIN_NAME if is_stdin(path) else path} is not UTF-8 text") from None
    qs = [line.strip() for line in text.splitlines() if line.strip()]
    if not qs:
        raise InputError(f"{STDIN_NAME if is_stdin(path) else path} holds no questions (one a line)")
    return qs


def questions_jsonl(document_id: str, qs: list[str]) -> bytes:
    """The batch of `--questions`: one line per question about one stored document."""
    import json

    return b"".join((json.dumps({"custom_id": question_id(i, q), "document_id": document_id, "question": q},
                                ensure_ascii=False) + "\n").encode() for i, q in enumerate(qs, 1))


#: the longest custom_id the API takes
MAX_CUSTOM_ID = 255


def question_id(i: int, question: str) -> str:
    """The custom_id of question `i`: its number and its text (cut to the API's 255 characters), so
    every view of the results (`specq results`, JSONL, CSV, the page) says which question each answers."""
    cid = f"q{i}: {' '.join(question.split())}"
    return cid if len(cid) <= MAX_CUSTOM_ID else cid[: MAX_CUSTOM_ID - 1] + "…"


def submit_questions(files: list[Path], questions: Path, question, jsonl, params: dict, name, wait: bool,
                     as_json: bool) -> None:
    """`specq submit --questions qs.txt FILE`: FILE stored once, one job per question (a batch)."""
    from ..contracts import InputError

    if jsonl is not None or question is not None or len(files) != 1:
        raise fail("--questions takes exactly one FILE (and no --jsonl or --question)")
    if is_stdin(files[0]) and is_stdin(questions):
        raise fail("FILE and --questions cannot both be stdin (-)")
    try:
        qs = read_questions(questions)
        filename, data, _ = load_document(files[0])
    except InputError as e:
        raise fail(str(e)) from None

    def stored(c) -> bytes:
        doc = c.create_document(filename, data)
        typer.echo(f"document {doc['id']} ({'stored' if doc.get('created') else 'already stored'}): "
                   f"{len(qs)} questions", err=True)
        return questions_jsonl(doc["id"], qs)

    submit_batch([], Path("questions.jsonl"), None, params, name, wait, as_json, make_jsonl=stored)


def submit_batch(files: list[Path], jsonl: Path | None, question, params: dict, name, wait: bool,
                 as_json: bool = False, make_jsonl=None) -> None:
    """`specq submit` with several files, --jsonl or --batch: one batch; prints its id."""
    from ..contracts import InputError

    if jsonl is not None and files:
        raise fail("give either FILEs or --jsonl FILE, not both")
    if jsonl is None and not files:
        raise fail("give the FILEs of the batch, or --jsonl FILE")
    if sum(is_stdin(f) for f in files) > 1:
        raise fail("stdin (-) can be one FILE of a batch, once")
    try:  # the server's checks, before uploading
        if make_jsonl is not None:  # built once connected (--questions: after storing the document)
            jsonl_name, jsonl_data = str(jsonl), b""
        elif jsonl is not None:
            jsonl_name, jsonl_data = read_input(jsonl)
            if not jsonl_data.strip():
                raise InputError(f"{STDIN_NAME if is_stdin(jsonl) else jsonl} is empty")
        docs = [load_document(f) for f in files]
    except InputError as e:
        raise fail(str(e)) from None
    if jsonl is None:  # FILEs: the question is the job (a JSONL line carries its own)
        require_question(question)
    metadata = {"name": name} if name else None

    def go(c):
        nonlocal jsonl_data
        if make_jsonl is not None:
            jsonl_data = make_jsonl(c)
        if jsonl is not None:
            batch = c.submit_batch_jsonl(Path(jsonl_name), params=params, question=question, metadata=metadata,
                                         content=jsonl_data)
        else:
            names = [STDIN_NAME if is_stdin(f) else shown_name(str(f)) for f in files]
            batch = c.submit_batch_files(files, question=question, params=params, metadata=metadata, names=names,
                                         contents=[data for _, data, _ in docs])
        if batch["status"] == "failed":
            _batch_fail(batch)
        if as_json and not wait:
            print_json(batch)
        elif not as_json:
            typer.echo(batch["id"])
        total = batch["request_counts"]["total"]
        if not wait:
            typer.echo(f"{total} requests queued: `specq batch {batch['id']}`, `specq results {batch['id']}`", err=True)
            return
        try:
            done = wait_batch_with_progress(c, batch)
        except KeyboardInterrupt:
            raise fail(f"stopped waiting; batch {batch['id']} keeps running (`specq batch {batch['id']}`)") from None
        counts = done["request_counts"]
        if as_json:
            print_json(done)
        elif stdout_is_terminal() and counts["completed"]:  # piped, stdout stays the batch id alone
            print_results_table(c.batch_export(done["id"], "results"))
        typer.echo(f"batch {done['id']} {done['status']}: {counts['completed']}/{counts['total']} completed, "
                   f"{counts['failed']} failed; answers: `specq results {done['id']}` (--format csv or jsonl)", err=True)
        if done["status"] != "completed" or counts["failed"]:
            raise typer.Exit(1)

    api_call(go)


def _batch_fail(batch: dict) -> None:
    """The validation errors of a batch the API refused as a whole (at most 20), then exit 1."""
    errors = (batch.get("errors") or {}).get("data") or []
    for e in errors[:20]:
        typer.echo(f"error: {safe(e.get('message') if isinstance(e, dict) else e)}", err=True)
    if len(errors) > 20:
        typer.echo(f"error: … and {len(errors) - 20} more", err=True)
    raise fail(f"batch {batch['id']} failed validation: nothing was queued")
