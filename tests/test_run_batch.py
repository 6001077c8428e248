"""`specq run-batch`: an OpenAI batch file answered in process on the tiny models (no service)."""

from __future__ import annotations

import json
import subprocess
import sys

from service_helpers import REPO


def test_run_batch_answers_each_line_in_order(tiny_models, tmp_path):
    """Each line answered or refused as the API would: `model` is checked as the server checks it
    (the target's id, "target" for target.gguf), a prompt over the context is context_length_exceeded."""
    lines = [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "target", "messages": [{"role": "user", "content": "Grüße"}], "max_tokens": 4}},
        {"custom_id": "text", "method": "POST", "url": "/v1/completions",
         "body": {"model": "target.gguf", "prompt": "once upon", "max_tokens": 3, "stop": ["\n\n"]}},
        {"custom_id": "refused", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "target", "messages": [{"role": "user", "content": "x"}], "n": 2}},
        {"custom_id": "other-model", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}},
        {"custom_id": "too-long", "method": "POST", "url": "/v1/completions",
         "body": {"model": "target", "prompt": "word " * 1000, "max_tokens": 8}},
    ]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    r = subprocess.run([sys.executable, "-m", "specq", "run-batch", "-i", str(src), "-o", str(out), "--target",
                        str(tiny_models.target), "--speculator", str(tiny_models.speculator), "--n-gpu-layers", "0",
                        "--n-ctx", "2048", "--threads", "2"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "2 answered, 3 failed" in r.stderr, r.stderr  # exit 1: a line failed
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["custom_id"] for g in got] == ["chat", "text", "refused", "other-model", "too-long"]
    chat, text, refused, other, long_ = got
    assert chat["response"]["status_code"] == 200 and chat["error"] is None
    assert chat["response"]["body"]["object"] == "chat.completion" and chat["response"]["body"]["model"] == "target"
    assert other["response"]["status_code"] == 404 and other["error"]["code"] == "model_not_found"
    assert "`gpt-4o` does not exist" in other["error"]["message"] and "target" in other["error"]["message"]
    assert long_["response"]["status_code"] == 400 and long_["error"]["code"] == "context_length_exceeded"
    assert long_["response"]["body"]["error"]["code"] == "context_length_exceeded"
    assert chat["response"]["body"]["usage"]["completion_tokens"] <= 4
    assert text["response"]["body"]["object"] == "text_completion"
    assert refused["response"]["status_code"] == 400 and refused["error"]["code"] == "unsupported_parameter"
