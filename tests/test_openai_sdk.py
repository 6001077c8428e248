"""The OpenAI surface driven by the real `openai` SDK against a live API + worker (tiny random-weight
models on the CPU, keys on): on the embedded default (SQLite + the SQLAlchemy broker: text streams
through `job_deltas`) and on Redis + PostgreSQL (text streams through Redis pub/sub).

The tiny models' answers are byte soup (a random-weight model over a byte vocabulary): they hold
multi-byte characters, U+FFFD for bytes that form none, and tokens of several bytes — what the
stream's whole-character and stop-string logic must get right. Greedy decoding (temperature 0) makes
each answer repeatable, so a stop string can be cut from one answer and asked for in the next.
"""

from __future__ import annotations

import json
import time
from datetime import datetime

import httpx
import pytest

from service_helpers import Stack, base_env, free_port, pg_database, redis_pg_env, require_servers, running

openai = pytest.importorskip("openai")

#: a document of several thousand tokens (the tiny vocabulary is about one token per byte) with
#: multi-byte characters, and its question as the last paragraph
DOC = "".join(f"Zeile {i}: Grüße aus Köln — 東京 {i * 7} ✓.\n" for i in range(60))
QUESTION = "Welche Stadt kommt vor?"


@pytest.fixture(scope="module", params=["embedded", pytest.param("redis_pg", marks=pytest.mark.services)])
def stack(request, tiny_models, tmp_path_factory):
    home = tmp_path_factory.mktemp(f"openai_{request.param}")
    port = free_port()
    # mode auto (the OpenAI routes' default) as these tests were written for it: specprefill from 1,024
    # prompt tokens (as if docs/quality.md had measured that length), and no prompt cache, so a repeated
    # request runs the same path and gives the same answer (the caches: test_doc_cache, test_documents)
    extra = dict(SPECQ_API_PORT=str(port), SPECQ_AUTH="keys", SPECQ_AUTO_QUALITY_MIN_TOKENS="1024",
                 SPECQ_CACHE_BYTES="0")

    def serve(env):
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        from specq.storage import db, keys

        with db.session(st.database_url) as s:
            st.keys = {t: keys.create_key(s, t)[1] for t in ("team-a", "team-b", "pager")}
        db.dispose_engines()
        services = [("up", "up")] if request.param == "embedded" else [("api", "api"), ("worker", "worker")]
        return st, running(st, *services)

    def ready(st):  # the worker's heartbeat is there (GET /v1/models lists what it serves)
        deadline = time.monotonic() + 120
        while httpx.get(f"{st.url}/readyz", timeout=5).json().get("workers_ready", 0) < 1:
            assert time.monotonic() < deadline, st.log("up") + st.log("worker")
            time.sleep(0.2)
        return st

    if request.param == "embedded":
        st, ctx = serve(base_env(home, tiny_models, **extra))
        with ctx:
            yield ready(st)
        return
    require_servers()
    with pg_database() as pg_url:
        st, ctx = serve(base_env(home, tiny_models, **extra, **redis_pg_env(pg_url, "specq-openai")))
        with ctx:
            yield ready(st)


def sdk(stack, tenant: str = "team-a"):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys[tenant], max_retries=0, timeout=300)


def rest(stack, tenant: str = "team-a") -> httpx.Client:
    return httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {stack.keys[tenant]}"}, timeout=60)


def job(stack, job_id: str, tenant: str = "team-a") -> dict:
    with rest(stack, tenant) as c:
        return c.get(f"/v1/jobs/{job_id}").json()


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def wait_batch(client, batch_id: str, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        assert time.monotonic() < deadline, f"batch {batch_id} still {b.status}"
        time.sleep(0.3)


def batch_file(client, n: int, prefix: str = "r", max_tokens: int = 4, bad: bool = False,
               ignore_eos: bool = False) -> str:
    lines = [{"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "target", "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": f"Frage {i}: was ist π?"}]}} for i in range(n)]
    if ignore_eos:  # exactly max_tokens per request: the work per request does not depend on the weights
        for line in lines:
            line["body"]["specq"] = {"ignore_eos": True}
    if bad:
        lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}})
    data = "\n".join(json.dumps(x, ensure_ascii=False) for x in lines).encode()
    return client.files.create(file=("requests.jsonl", data), purpose="batch").id


def test_models_list(stack):
    models = sdk(stack).models.list().data
    assert [m.id for m in models] == ["target"]
    m = models[0].model_dump()
    assert m["object"] == "model" and m["speculator"] == "speculator" and m["context"] == 4096
    assert m["backend"] == "cpu" and m["workers"] == 1


def test_chat_streams_before_the_job_ends_and_deltas_join_to_the_answer(stack):
    client = sdk(stack)
    messages = [{"role": "system", "content": "Antworte kurz."}, {"role": "user", "content": DOC + "\n\n" + QUESTION}]
    whole = client.chat.completions.create(model="target", messages=messages, max_tokens=48, temperature=0)
    answer = whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.usage.completion_tokens == 48
    assert any(ord(ch) > 127 for ch in answer), answer  # multi-byte characters (and U+FFFD) in the answer
    # a stop string straddling tokens: two characters from the middle of the answer
    cut = next(i for i in range(8, len(answer) - 2) if len(answer[i:i + 2].encode()) >= 2 and answer[i:i + 2].strip())
    stop = answer[cut:cut + 2]
    expected = answer[: answer.index(stop)]

    arrivals, parts = [], []
    stream = client.chat.completions.create(model="target", messages=messages, max_tokens=48, temperature=0,
                                            stop=[stop], stream=True, stream_options={"include_usage": True})
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.time())
            parts.append(chunk.choices[0].delta.content)
    job_id = chunks[0].model_extra["specq"]["job_id"]
    finished = ts(job(stack, job_id)["finished_at"])
    assert "".join(parts) == expected, (parts, expected)
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(final) == 1 and final[0].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 2  # the usage chunk, last
    assert all(c.usage is None for c in chunks[:-1])
    stored = job(stack, job_id)
    assert stored["kind"] == "chat" and stored["result"]["text"] == expected
    assert stored["result"]["finish_reason"] == "stop"
    # streamed, not buffered: text arrived while the job was still decoding
    if len(expected) > 4:
        assert arrivals[0] < finished, (arrivals[0], finished)


def test_a_streamed_chat_has_its_trace_in_order(stack):
    """GET /v1/jobs/{id}'s `trace`: every stamp of a streamed chat (storage.trace), in the order the job
    passed them, and the client's first text after the server's."""
    client = sdk(stack)
    sent = time.time()
    stream = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "Hallo?"}],
                                            max_tokens=8, temperature=0, stream=True)
    job_id, first_text = None, None
    for chunk in stream:
        job_id = job_id or chunk.model_extra["specq"]["job_id"]
        if first_text is None and chunk.choices and chunk.choices[0].delta.content:
            first_text = time.time()
    deadline = time.monotonic() + 10
    while (trace := job(stack, job_id)["trace"])["first_byte"] is None:  # written once the response was sent
        assert time.monotonic() < deadline, trace
        time.sleep(0.05)
    assert all(trace[k] is not None for k in trace), trace
    order = ["accepted", "stored", "claimed", "engine_start", "first_token", "engine_done", "done"]
    assert [trace[k] for k in order] == sorted(trace[k] for k in order), trace
    assert trace["stored"] <= trace["queued"] and trace["first_token"] <= trace["first_text"], trace
    assert trace["accepted"] <= trace["first_byte"] <= trace["first_text"], trace
    assert sent <= trace["accepted"] and trace["first_text"] <= first_text, (sent, first_text, trace)


def test_a_single_user_message_with_a_long_document_is_scored(stack):
    r = sdk(stack).chat.completions.create(model="target", max_tokens=4,
                                           messages=[{"role": "user", "content": DOC + "\n\n" + QUESTION}])
    extra = r.model_extra["specq"]
    assert extra["mode"] == "specprefill" and 0 < extra["kept_tokens"] < r.usage.prompt_tokens
    assert {"score", "select", "sparse_prefill", "decode"} <= set(extra["timings_ms"])


def test_extra_body_options_reach_the_engine(stack):
    r = sdk(stack).chat.completions.create(
        model="target", max_tokens=6, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"specq": {"document": DOC, "keep": 0.5, "draft": "ngram", "min_tokens": 0, "chunk": 16}})
    stored = job(stack, r.model_extra["specq"]["job_id"])
    assert stored["params"]["keep"] == 0.5 and stored["params"]["chunk"] == 16
    assert stored["input"]["question"] == QUESTION  # the explicit split: the user message is the question
    result = stored["result"]
    assert result["spec"]["mode"] == "specprefill" and result["spec"]["keep"] == 0.5
    assert result["draft"]["method"] == "ngram"
    assert result["usage"]["kept_tokens"] < result["usage"]["prompt_tokens"]


def test_completions_of_a_raw_prompt(stack):
    client = sdk(stack)
    r = client.completions.create(model="target", prompt="<|im_start|>user\nHallo<|im_end|>\n", max_tokens=5)
    assert r.object == "text_completion" and r.usage.completion_tokens == 5
    parts = [c.choices[0].text for c in client.completions.create(model="target", prompt="<|im_start|>user\nHallo",
                                                                  max_tokens=5, stream=True) if c.choices]
    assert len("".join(parts)) > 0


def test_specq_question_names_the_question_else_a_400(stack):
    """specq.question without specq.document: an exact excerpt of the last user message (or the prompt)
    that scoring never drops; one that is not in it is a 400 naming specq.question (issue 47, item 5)."""
    client = sdk(stack)
    content = QUESTION + "\n\n" + DOC  # the question first
    for named in ("Wo liegt Paris?", "   "):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="target", max_tokens=2, messages=[{"role": "user", "content": content}],
                                           extra_body={"specq": {"question": named}})
        assert e.value.param == "specq.question" and "exact excerpt of the last user message" in str(e.value)
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="target", max_tokens=2, prompt=content, extra_body={"specq": {"question": named}})
        assert e.value.param == "specq.question" and "exact excerpt of the prompt" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="target", max_tokens=2, prompt=content, extra_body={"specq": {"document": DOC}})
    assert e.value.param == "specq.document"
    named = "Zeile 7: Grüße aus Köln"
    r = client.chat.completions.create(model="target", max_tokens=2, messages=[{"role": "user", "content": content}],
                                       extra_body={"specq": {"question": named}})
    stored = job(stack, r.model_extra["specq"]["job_id"])
    assert stored["input"]["question"] == named and stored["result"]["spec"]["mode"] == "specprefill"
    r = client.completions.create(model="target", max_tokens=2, prompt=DOC, extra_body={"specq": {"question": named}})
    assert job(stack, r.model_extra["specq"]["job_id"])["result"]["spec"]["mode"] == "specprefill"


def test_no_question_found_runs_baseline_and_says_so(stack):
    client = sdk(stack)
    r = client.chat.completions.create(model="target", max_tokens=2, messages=[{"role": "user", "content": DOC}])
    spec = job(stack, r.model_extra["specq"]["job_id"])["result"]["spec"]
    assert spec["mode"] == "baseline" and spec["reason"].startswith("auto: no question found in the chat message")
    first = client.chat.completions.create(model="target", max_tokens=2,
                                           messages=[{"role": "user", "content": QUESTION + "\n\n" + DOC}])
    assert first.model_extra["specq"]["mode"] == "specprefill"
    r = client.chat.completions.create(model="target", max_tokens=2, messages=[{"role": "user", "content": DOC}],
                                       extra_body={"specq": {"mode": "specprefill"}})
    assert any(w.startswith("no question found in the chat message") for w in r.model_extra["specq"]["warnings"])


def test_errors_are_the_sdks_typed_exceptions(stack):
    client = sdk(stack)
    msg = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=msg)
    assert e.value.code == "model_not_found"
    for kwargs, param in [({"n": 2}, "n"), ({"logprobs": True}, "logprobs"), ({"logit_bias": {"1": 5}}, "logit_bias"),
                          ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                              "type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}}}]}, "tools"),
                          ({"response_format": {"type": "json_schema", "json_schema": {
                              "name": "n", "schema": {"type": "integer", "minimum": 1}}}}, "response_format"),
                          ({"presence_penalty": 1.0}, "presence_penalty"), ({"max_tokens": 10**6}, "max_tokens")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="target", messages=msg, **kwargs)
        assert e.value.param == param, (kwargs, e.value.body)
    # neutral values and informational fields are accepted
    r = client.chat.completions.create(model="target", messages=msg, max_tokens=2, n=1, logprobs=False,
                                       presence_penalty=0, frequency_penalty=0, user="u1", store=False,
                                       metadata={"a": "b"}, response_format={"type": "text"})
    assert r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="target", messages=msg, extra_body={"temprature": 1})
    assert "temprature" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_0123456789abcdef01234567")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-0123456789abcdef01234567")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk-specq-wrong", max_retries=0).models.list()


#: a prompt far over the workers' context (SPECQ_N_CTX=4096; about one token per byte)
TOO_LONG = "Zeile über Köln und 東京.\n" * 800


def test_a_prompt_over_the_context_is_context_length_exceeded_streamed_or_not(stack):
    """400 `context_length_exceeded` (what LiteLLM and LangChain look for), param messages / prompt;
    with stream: true the same 400 before any stream (the headers wait for the worker's tokenizer)."""
    client = sdk(stack)
    msg = [{"role": "user", "content": TOO_LONG}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="target", messages=msg, max_tokens=16)
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages", e.value.body
    assert e.value.type == "invalid_request_error" and "maximum context length" in e.value.message
    assert "4096" in e.value.message
    job_id = e.value.response.headers["X-Specq-Job-Id"]
    assert job(stack, job_id)["status"] == "failed"
    # streamed: the SDK raises at create(), before any chunk (an error inside a 200 stream would only
    # come out of the iteration, as an APIError without the status)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="target", messages=msg, max_tokens=16, stream=True)
    assert e.value.status_code == 400 and e.value.code == "context_length_exceeded", e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="target", prompt=TOO_LONG, max_tokens=16, stream=True)
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt", e.value.body
    # raw HTTP: the status line itself is the 400, not a 200 with an error event
    with rest(stack) as c, c.stream("POST", "/v1/chat/completions", json={"model": "target", "messages": msg,
                                                                         "stream": True}) as r:
        assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
        assert json.loads(r.read())["error"]["code"] == "context_length_exceeded"
    # a prompt that fits still streams
    chunks = list(client.chat.completions.create(model="target", messages=[{"role": "user", "content": "Hallo"}],
                                                 max_tokens=3, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason


def test_a_batch_line_over_the_context_has_that_code_in_the_error_file(stack):
    client = sdk(stack)
    line = {"custom_id": "long", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "target", "max_tokens": 4, "messages": [{"role": "user", "content": TOO_LONG}]}}
    fid = client.files.create(file=("long.jsonl", json.dumps(line).encode()), purpose="batch").id
    b = wait_batch(client, client.batches.create(input_file_id=fid, endpoint="/v1/chat/completions",
                                                 completion_window="24h").id)
    assert b.request_counts.failed == 1 and b.error_file_id
    (err,) = [json.loads(x) for x in client.files.content(b.error_file_id).text.splitlines()]
    assert err["custom_id"] == "long" and err["error"]["code"] == "context_length_exceeded", err


def test_langchain_sees_the_context_overflow(stack):
    """LangChain's ChatOpenAI on the same 400: the typed error its callers catch for an overflow."""
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["team-a"], model="target",
                                      max_retries=0, max_tokens=16)
    with pytest.raises(Exception) as e:
        llm.invoke(TOO_LONG)
    assert isinstance(e.value, openai.BadRequestError) and e.value.code == "context_length_exceeded"
    overflow = getattr(pytest.importorskip("langchain_core.exceptions"), "ContextOverflowError", None)
    if overflow is not None:  # langchain-core >= 1.1 names it
        assert isinstance(e.value, overflow), type(e.value).__mro__
    with pytest.raises(Exception) as e:  # streamed (LangChain's .stream() sends stream: true)
        list(llm.stream(TOO_LONG))
    assert isinstance(e.value, openai.BadRequestError) and e.value.code == "context_length_exceeded"
    assert llm.invoke("Hallo").content is not None  # and a prompt that fits works


def test_openai_routes_specq_does_not_serve_say_so(stack):
    """Embeddings, the Responses API and other OpenAI paths: an OpenAI-shaped 404 naming what is not
    served (the SDK's NotFoundError carries the message), not a bare Not Found."""
    client = sdk(stack)
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="target", input="x")
    assert e.value.code == "unsupported_endpoint" and "does not serve embeddings" in e.value.message
    assert "/v1/chat/completions" in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="target", input="x")
    assert e.value.code == "unsupported_endpoint" and "Responses API" in e.value.message
    with rest(stack) as c:
        for method, path in (("POST", "/v1/moderations"), ("POST", "/v1/images/generations"),
                             ("GET", "/v1/fine_tuning/jobs"), ("POST", "/v1/audio/speech")):
            r = c.request(method, path, json={})
            body = r.json()["error"]
            assert r.status_code == 404 and body["code"] == "unsupported_endpoint", (path, body)
            assert body["type"] == "invalid_request_error" and path in body["message"]
        r = c.get("/v1/no-such-thing")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
        # a route's own 404 is unchanged
        r = c.get("/v1/jobs/job_" + "0" * 24)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"


def test_health_as_llama_server_and_vllm_serve_it(stack):
    r = httpx.get(f"{stack.url}/health", timeout=10)  # no key: probes have none
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_files_then_batch_then_output_file(stack):
    client = sdk(stack)
    fid = batch_file(client, 3)
    f = client.files.retrieve(fid)
    assert f.purpose == "batch" and f.filename == "requests.jsonl" and f.bytes > 0
    assert fid in [x.id for x in client.files.list()]
    with pytest.raises(openai.NotFoundError):  # another tenant's file is as good as missing
        sdk(stack, "team-b").files.retrieve(fid)
    b = client.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={"run": "one"})
    assert b.status == "in_progress" and b.expires_at - b.created_at == 86400 and b.input_file_id == fid
    done = wait_batch(client, b.id)
    assert done.status == "completed" and done.request_counts.completed == 3 and done.error_file_id is None
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    lines = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in lines] == ["r0", "r1", "r2"]
    for x in lines:
        body = x["response"]["body"]
        assert x["response"]["status_code"] == 200 and x["error"] is None
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= 4
        assert body["specq"]["job_id"] == x["response"]["request_id"]
    client.files.delete(fid)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(fid)


def test_a_bad_line_fails_the_batch_naming_it(stack):
    client = sdk(stack)
    b = client.batches.create(input_file_id=batch_file(client, 2, bad=True), endpoint="/v1/chat/completions",
                              completion_window="24h")
    assert b.status == "failed" and b.errors.data[0].line == 3 and b.errors.data[0].code == "model_not_found"


def test_chat_behind_a_big_batch_starts_at_the_next_free_slot_and_cancel(stack):
    client = sdk(stack)
    b = client.batches.create(input_file_id=batch_file(client, 50, "big", max_tokens=6),
                              endpoint="/v1/chat/completions", completion_window="24h")
    with rest(stack) as c:
        deadline = time.monotonic() + 120
        while not c.get("/v1/jobs", params={"status": "running"}).json()["data"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    r = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "schnell"}], max_tokens=2)
    chat = job(stack, r.model_extra["specq"]["job_id"])
    with rest(stack) as c:
        batch_jobs = c.get("/v1/jobs", params={"limit": 500}).json()["data"]
    started = [ts(j["started_at"]) for j in batch_jobs if j["batch_id"] == b.id and j["started_at"]]
    # the chat took the next free slot: at most the one batch claim already in flight when the chat was
    # stored (this worker has one slot, and created_at/started_at are stamped before the write lock is
    # taken) started between the chat's arrival and its start -- in FIFO order ~49 would have
    between = [t for t in started if ts(chat["created_at"]) < t < ts(chat["started_at"])]
    assert len(between) <= 1, (chat, between)
    assert chat["priority"] == 0 and all(j["priority"] == 1 for j in batch_jobs if j["batch_id"] == b.id)

    cancelled = client.batches.cancel(b.id)
    assert cancelled.status in ("cancelling", "cancelled")
    done = wait_batch(client, b.id)
    assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at
    counts = done.request_counts
    assert counts.total == 50 and counts.completed + counts.failed == 50 and counts.failed > 0
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert len(errors) == counts.failed and all(e["error"]["code"] in ("cancelled", "job_failed") for e in errors)
    if counts.completed:
        out = client.files.content(done.output_file_id).text.splitlines()
        assert len(out) == counts.completed


def test_a_batch_expires_after_its_completion_window(stack):
    """120 requests of exactly 512 tokens each (ignore_eos) take one worker far longer than the 2 s
    window, so the window ends with most of them unfinished whatever the machine's speed. (With 32
    tokens and the tiny models' early end-of-text, a fast 2-core machine finished 65 of 120 inside
    the window.)"""
    n = 120
    client = sdk(stack)
    b = client.batches.create(input_file_id=batch_file(client, n, "late", max_tokens=512, ignore_eos=True),
                              endpoint="/v1/chat/completions", completion_window="2s")
    assert b.expires_at - b.created_at == 2
    done = wait_batch(client, b.id)
    assert done.status == "expired" and done.expired_at >= b.expires_at and done.completed_at is None
    counts = done.request_counts
    assert counts.completed + counts.failed == n and counts.failed >= n // 2
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert len(errors) == counts.failed
    assert any("completion window" in e["error"]["message"] for e in errors)


def test_auto_pagination_over_25_batches_yields_each_once(stack):
    client = sdk(stack, "pager")
    fid = batch_file(client, 1, bad=True)  # each batch fails validation at once: no job runs
    made = {client.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h").id
            for _ in range(25)}
    seen = [b.id for b in client.batches.list(limit=4)]
    assert len(seen) == 25 and set(seen) == made
    page = client.batches.list(limit=10)
    assert page.has_more and len(page.data) == 10


def test_tenants_take_turns(stack):
    """Tenant A's batch is queued first; tenant B's smaller batch, queued after it, is not starved: the
    worker alternates between them (fewest running, then served longest ago)."""
    a, b = sdk(stack, "team-a"), sdk(stack, "team-b")
    ba = a.batches.create(input_file_id=batch_file(a, 12, "a", max_tokens=2), endpoint="/v1/chat/completions",
                          completion_window="24h")
    bb = b.batches.create(input_file_id=batch_file(b, 4, "b", max_tokens=2), endpoint="/v1/chat/completions",
                          completion_window="24h")
    wait_batch(a, ba.id), wait_batch(b, bb.id)
    starts = []
    for tenant, batch_id in (("team-a", ba.id), ("team-b", bb.id)):
        with rest(stack, tenant) as c:
            starts += [(ts(j["started_at"]), tenant) for j in c.get("/v1/jobs", params={"limit": 500}).json()["data"]
                       if j["batch_id"] == batch_id]
    order = [t for _, t in sorted(starts)]
    assert order.count("team-b") == 4
    last_b = max(i for i, t in enumerate(order) if t == "team-b")
    assert last_b < len(order) - 4, order  # B's last request started well before A's batch ended


def test_native_job_events_and_submit_wait_print_the_answer(stack, tmp_path):
    with rest(stack) as c:
        # exactly 1,024 tokens (ignore_eos): the job stays running long enough for the stream's status
        # polls (0.25 s) to see its phases on any machine; 24 tokens ended before the first poll on a fast one
        job_id = c.post("/v1/jobs", json={"text": DOC, "question": QUESTION,
                                          "params": {"max_tokens": 1024, "ignore_eos": True}}).json()["id"]
        events = []
        with c.stream("GET", f"/v1/jobs/{job_id}/events") as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            name = None
            for line in r.iter_lines():
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    events.append((name, json.loads(line[5:])))
        names = [n for n, _ in events]
        assert names[0] == "status" and names[-1] == "done" and "delta" in names and "phase" in names
        text = "".join(d["text"] for n, d in events if n == "delta")
        stored = c.get(f"/v1/jobs/{job_id}").json()
        assert text == stored["result"]["text"] and events[-1][1]["status"] == "succeeded"
        assert c.get("/v1/jobs/job_0123456789abcdef01234567/events").status_code == 404
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    env_key = dict(stack.env, SPECQ_API_KEY=stack.keys["team-a"])
    old, stack.env = stack.env, env_key
    try:
        r = stack.cli("submit", str(doc), "-q", QUESTION, "--max-tokens", "12", "--wait", check=True)
    finally:
        stack.env = old
    assert "phases" in r.stdout and "decode" in r.stdout


# --- structured output: response_format (json_object, json_schema) and native params.json_schema ---------------


def _answer_model():
    from typing import Literal

    from pydantic import BaseModel, Field

    class Answer(BaseModel):  # every field bounded: the grammar ends within ~100 tokens of the tiny models
        city: str = Field(max_length=8)
        kind: Literal["city", "village"]
        count: int
        ok: bool

    return Answer


def _embedded_only(stack):
    """Structured output is the worker's sampling, the same on either broker: run once (on the embedded stack)."""
    if "SPECQ_BROKER_URL" in stack.env:
        pytest.skip("the same code path as on the embedded stack")


def test_structured_output_through_the_sdk_parse_helper_batches_and_native_jobs(stack):
    _embedded_only(stack)
    client = sdk(stack)
    Answer = _answer_model()
    msg = [{"role": "user", "content": "Welche Stadt? Antworte als JSON."}]
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = parse(model="target", messages=msg, response_format=Answer, max_tokens=200)
    got = r.choices[0].message.parsed
    assert isinstance(got, Answer) and r.choices[0].finish_reason == "stop", r.choices[0].message.content
    job_id = r.choices[0].message.model_extra.get("specq", {}).get("job_id") or r.model_extra["specq"]["job_id"]
    assert job(stack, job_id)["params"]["json_schema"]["required"] == ["city", "kind", "count", "ok"]
    # json_schema as a dict, json_object, and on /v1/completions (as llama-server takes it)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "b": {"type": "boolean"}},
              "required": ["n", "b"], "additionalProperties": False}
    r = client.chat.completions.create(model="target", messages=msg, max_tokens=100, response_format={
        "type": "json_schema", "json_schema": {"name": "nb", "schema": schema, "strict": True}})
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"n", "b"} and isinstance(value["n"], int) and isinstance(value["b"], bool)
    r = client.completions.create(model="target", prompt="JSON: ", max_tokens=100,
                                  extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                      "name": "nb", "schema": schema}}})
    assert set(json.loads(r.choices[0].text)) == {"n", "b"}
    r = client.chat.completions.create(model="target", messages=msg, max_tokens=12,
                                       response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # the object went on past max_tokens: cut there, finish_reason length
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    # a batch line and a native job
    line = {"custom_id": "s", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "target", "max_tokens": 100, "messages": msg,
                     "response_format": {"type": "json_schema", "json_schema": {"name": "nb", "schema": schema}}}}
    fid = client.files.create(file=("s.jsonl", json.dumps(line).encode()), purpose="batch").id
    b = wait_batch(client, client.batches.create(input_file_id=fid, endpoint="/v1/chat/completions",
                                                 completion_window="24h").id)
    (out,) = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines()]
    assert set(json.loads(out["response"]["body"]["choices"][0]["message"]["content"])) == {"n", "b"}
    with rest(stack) as c:
        job_id = c.post("/v1/jobs", json={"text": DOC[:300], "question": QUESTION,
                                          "params": {"max_tokens": 100, "json_schema": schema}}).json()["id"]
        deadline = time.monotonic() + 120
        while (j := c.get(f"/v1/jobs/{job_id}").json())["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert set(json.loads(j["result"]["text"])) == {"n", "b"}, j
        bad = c.post("/v1/jobs", json={"text": "x", "question": "q", "params": {"json_schema": {"not": {}}}})
        assert bad.status_code == 422 and "'not' is not supported" in bad.json()["error"]["message"]


def test_schemas_the_grammar_cannot_honour_are_400_before_anything_is_queued(stack):
    client = sdk(stack)
    msg = [{"role": "user", "content": "x"}]
    before = rest(stack).get("/v1/jobs").json()["total"]
    for fmt, words in [
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {
            "type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}}}}, "properties.n: keyword 'maximum'"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "required": ["x"]}}},
         "'x', which is not in its properties"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": []}}, "must be a JSON Schema object"),
        ({"type": "xml"}, "json_schema"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="target", messages=msg, response_format=fmt)
        assert e.value.param == "response_format" and words in e.value.message, e.value.body
        assert e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="target", messages=msg, response_format={"type": "json_object"},
                                       extra_body={"specq": {"ignore_eos": True}})
    assert "ignore_eos" in e.value.message
    assert rest(stack).get("/v1/jobs").json()["total"] == before  # nothing queued


def test_langchain_with_structured_output_json_schema(stack):
    _embedded_only(stack)
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["team-a"], model="target",
                                      max_retries=0, max_tokens=200, temperature=0)
    Answer = _answer_model()
    got = llm.with_structured_output(Answer, method="json_schema").invoke("Welche Stadt? Antworte als JSON.")
    assert isinstance(got, Answer)


#: a function whose arguments end within ~100 tokens of the tiny models (bounded fields, as _answer_model)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["C", "F"]},
                                     "days": {"type": "integer"}},
    "required": ["city", "unit", "days"], "additionalProperties": False}}}


def _weather_args(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit", "days"} and len(args["city"]) <= 8 and args["unit"] in ("C", "F")
    assert isinstance(args["days"], int)
    return args


def test_tool_calling_round_trip_required_and_streamed(stack):
    _embedded_only(stack)
    client = sdk(stack)
    msgs = [{"role": "user", "content": "Wie wird das Wetter in Köln?"}]
    clock = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
    r = client.chat.completions.create(model="target", messages=msgs, tools=[clock, WEATHER], max_tokens=200,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    (call,) = choice.message.tool_calls
    _weather_args(call)
    # the call and its result go back as the SDK writes them: an answer in words
    msgs += [choice.message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}),
             {"role": "tool", "tool_call_id": call.id, "content": "Regen, 12 Grad"}]
    r = client.chat.completions.create(model="target", messages=msgs, tools=[clock, WEATHER], tool_choice="none",
                                       max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    assert job(stack, r.model_extra["specq"]["job_id"])["params"]["mode"] == "baseline"
    # required (one of the tools, its arguments valid), streamed as a tool_calls delta the SDK accumulates
    with client.chat.completions.stream(model="target", messages=msgs[:1], tools=[WEATHER], tool_choice="required",
                                        max_tokens=200) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    _weather_args(final.choices[0].message.tool_calls[0])


def test_langchain_with_structured_output_function_calling(stack):
    _embedded_only(stack)
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["team-a"], model="target",
                                      max_retries=0, max_tokens=200, temperature=0)
    Answer = _answer_model()
    got = llm.with_structured_output(Answer, method="function_calling").invoke("Welche Stadt?")
    assert isinstance(got, Answer)
