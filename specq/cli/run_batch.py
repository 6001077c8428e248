"""`specq run-batch -i in.jsonl -o out.jsonl`: an OpenAI batch file answered in this process, no service
needed (the format of `vllm run-batch` and of OpenAI's Batch API input and output files).

Each input line is `{"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
"body": {…}}`; its body is checked as the API checks a request (the same refusals, e.g. `n > 1`,
`tools`) and run on the local engine. Each output line, in input order, is
`{"id", "custom_id", "response": {"status_code": 200, "request_id", "body": <chat.completion |
text_completion>}, "error": null}`, or for a refused or failed request `{"id", "custom_id",
"response": {"status_code": 400, "body": {"error"}}, "error": {"code", "message"}}`. A body's `model`
is checked as the API checks it: the target's id (its file name without `.gguf`, as GET /v1/models
lists it), else the line fails with status 404 and code `model_not_found`.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import typer

from .app import app
from .common import fail, with_models


@app.command("run-batch")
def run_batch_cmd(
    input_path: Path = typer.Option(..., "-i", "--input", help="OpenAI batch JSONL: {custom_id, method, url, body} per line."),
    output_path: Path = typer.Option(..., "-o", "--output", help="Where the result lines go (JSONL, input order)."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator/drafter model: registry name or GGUF path."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    n_ctx: int = typer.Option(0, help="Target context size (0 = model's, capped at 32768)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
) -> None:
    """Answer every request of an OpenAI batch file in this process and write OpenAI-format result lines."""
    from ..contracts import EngineError

    if not input_path.is_file():
        raise fail(f"file not found: {input_path}")
    from ..engine.options import EngineOptions

    opts = with_models(EngineOptions(n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, n_threads=threads), target=target,
                       speculator=speculator)
    try:
        from ..engine.pipeline import Engine

        engine = Engine(opts)
    except EngineError as e:
        raise fail(str(e)) from None
    done = failed = 0
    t0 = time.perf_counter()
    with input_path.open("rb") as src, output_path.open("w", encoding="utf-8") as out:
        for n, raw in enumerate(src, 1):
            if not raw.strip():
                continue
            line = answer_line(engine, n, raw)
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            out.flush()
            if line["error"] is None:
                done += 1
            else:
                failed += 1
                typer.echo(f"line {n}: {line['error']['message']}", err=True)
    typer.echo(f"{done} answered, {failed} failed in {time.perf_counter() - t0:.1f} s -> {output_path}", err=True)
    if failed:
        raise typer.Exit(1)


def answer_line(engine, n: int, raw: bytes) -> dict:
    """The output line of input line `n`."""
    from .. import openai_format as F
    from ..api import openai_schemas as O
    from ..api.errors import ApiError
    from ..api.openai_models import check_model
    from ..served_models import model_id
    from ..api.openai_requests import chat_spec, check_params, completion_spec, parse
    from ..contracts import ContextLengthExceeded, EngineError

    request_id = "job_" + secrets.token_hex(12)
    custom_id = None
    try:
        try:
            line = json.loads(raw)
        except ValueError:
            raise ApiError(400, f"line {n} is not valid JSON", code="invalid_json") from None
        if not isinstance(line, dict):
            raise ApiError(400, f"line {n} must be a JSON object {{custom_id, method, url, body}}")
        custom_id = line.get("custom_id") if isinstance(line.get("custom_id"), str) else None
        models = {"/v1/chat/completions": (O.ChatCompletionRequest, chat_spec),
                  "/v1/completions": (O.CompletionRequest, completion_spec)}
        if line.get("url") not in models:
            raise ApiError(400, f"line {n}: url must be one of {', '.join(models)}", param="url")
        if not isinstance(line.get("body"), dict):
            raise ApiError(400, f"line {n}: body must be a JSON object", param="body")
        model, to_spec = models[line["url"]]
        spec = to_spec(parse(model, json.dumps(line["body"]).encode(), "body"))
        check_model(spec.model, [model_id(engine.options.target)])
        params = check_params(spec.params)
        messages = [(m["role"], m["content"]) for m in spec.messages] if spec.messages is not None else None
        result = engine.run(spec.text, params, messages=messages, raw=spec.kind == "completion").to_dict()
        return F.output_line(request_id, custom_id, spec.kind, spec.model, int(time.time()), result)
    except ApiError as e:
        code, message, status = getattr(e, "code", None) or "invalid_request", str(e.detail), e.status_code
    except ContextLengthExceeded as e:
        code, message, status = "context_length_exceeded", str(e), 400
    except EngineError as e:
        code, message, status = "job_failed", str(e), 400
    error = {"code": code, "message": message}
    return {"id": F.batch_line_id(request_id), "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": {"error": {**error, "type": "invalid_request_error"}}},
            "error": error}


__all__ = ["run_batch_cmd", "answer_line"]
