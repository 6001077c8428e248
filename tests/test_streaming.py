"""The pieces behind streamed answers and claim order, on real parts: the engine's TextStream on the
tiny models' tokens, the worker's DeltaPublisher into the real job store, and claims on SQLite and
PostgreSQL."""

from __future__ import annotations

import time

import pytest

from service_helpers import empty_store
from specq.engine.decode.textstream import TextStream


def _feed(stream: TextStream, pieces: list[bytes]) -> list[str]:
    return [stream.push(p) for p in pieces] + [stream.finish()]


def test_text_stream_releases_whole_characters_only():
    data = "Grüße 東京 😀".encode()
    out = _feed(TextStream(), [data[i:i + 1] for i in range(len(data))])
    assert "".join(out) == "Grüße 東京 😀"
    for piece in out:
        piece.encode("utf-8")  # whole characters: no piece holds half of one (or a stray surrogate)
    assert "\ufffd" not in "".join(out)
    assert out[data.index("ü".encode()) + 1] == "ü"  # released with its second byte, not before


def test_stop_strings_are_held_back_until_they_cannot_match():
    s = TextStream(["Ende.", "\n\n"])
    assert s.push(b"Das En") == "Das "  # "En" may start "Ende."
    assert s.push(b"gel") == "Engel"  # it did not
    assert s.push(b" sagt Ende") == " sagt "
    assert s.push(b". Mehr") == "" and s.stopped
    assert s.finish() == "" and s.text == "Das Engel sagt "


def test_a_stop_string_straddling_multi_byte_tokens():
    s = TextStream(["ß東"])
    pieces = ["Gru".encode(), "ß".encode()[:1], "ß".encode()[1:] + "東".encode()[:2], "東".encode()[2:] + "京".encode()]
    parts = _feed(s, pieces)
    assert "".join(parts) == "Gru" and s.stopped


def test_held_back_text_is_released_at_the_end():
    s = TextStream(["stop here"])
    assert s.push(b"a sto") == "a "
    assert s.finish() == "sto" and s.text == "a sto" and not s.stopped


def test_engine_applies_stop_strings_and_reports_text_as_decoded(tiny_models):
    from specq.engine.options import EngineOptions, RunParams
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=1024, n_threads=2))
    try:
        messages = [("user", "Grüße aus Köln\n\nWas ist das?")]
        full = eng.run("", RunParams(max_tokens=24), messages=messages)
        assert full.finish_reason == "length" and len(full.text) > 6
        stop = full.text[4:6]
        pieces: list[str] = []
        cut = eng.run("", RunParams(max_tokens=24, stop=[stop]), messages=messages, on_text=pieces.append)
        assert cut.text == full.text[: full.text.index(stop)] and cut.finish_reason == "stop"
        assert "".join(pieces) == cut.text and cut.usage.completion_tokens < 24
    finally:
        eng.close()


def test_chat_prompt_protects_template_and_the_last_paragraph(tiny_models):
    from specq.engine.prompt.chat import build_chat_prompt
    from specq.engine.llama.binding import Model

    model = Model(tiny_models.target, n_gpu_layers=0)
    try:
        doc = "word " * 400
        p = build_chat_prompt(model, [("system", "Be brief."), ("user", doc + "\n\nWhat is it?")])
        text = lambda idx: model.detokenize([p.tokens[i] for i in idx])  # noqa: E731
        assert text(range(p.doc_start)).endswith("Be brief.\nuser\n")  # system message and opener: head
        assert text(range(p.doc_end, p.n)).startswith("What is it?")  # the last paragraph is protected
        assert text(range(p.doc_start, p.doc_end)).strip() == doc.strip()
        one = build_chat_prompt(model, [("user", doc)], protect_tail=-1)  # no paragraph break: the last 256 tokens
        assert 0 < one.doc_end - one.doc_start and one.n - one.doc_end >= 256
        many = build_chat_prompt(model, [("user", doc), ("assistant", "ok"), ("user", "and?")], protect_tail=2)
        assert many.pinned and all(many.doc_start <= i < many.doc_end for i in many.pinned)
    finally:
        model.close()


def test_protected_tail_is_counted_from_the_end(tiny_models):
    """The last paragraph's tokens are found walking back from the end: the same answer as walking every
    token from the start (the rule as first written), with work bounded by DEFAULT_PROTECT_TAIL rather
    than the document's length (a 128K-token prompt spent 0.5 s of GIL-held Python there)."""
    import random

    from specq.engine.prompt.chat import protected_count
    from specq.engine.llama.binding import Model
    from specq.engine.options import DEFAULT_PROTECT_TAIL

    model = Model(tiny_models.target, n_gpu_layers=0)

    def from_start(content: str, tokens: list[int]) -> int:
        body = content.rstrip()
        cut = body.rfind("\n\n")
        start_byte = len(body[: cut + 2].encode("utf-8")) if cut >= 0 else 0
        seen = 0
        for i, tok in enumerate(tokens):
            seen += len(model.token_bytes(tok))
            if seen > start_byte:
                return min(len(tokens) - i, DEFAULT_PROTECT_TAIL)
        return min(len(tokens), 1)

    try:
        rng = random.Random(3)
        alphabet = ["a", " ", "\n", "\n\n", "é", "字", "😀", "\t", "\r\n", "x = 1"]
        for _ in range(300):
            content = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
            tokens = model.tokenize(content, add_special=False, parse_special=False)
            assert protected_count(model, content, tokens, -1) == from_start(content, tokens), repr(content)
        calls = [0]
        real = model.token_bytes

        def counted(tok):
            calls[0] += 1
            return real(tok)

        model.token_bytes = counted
        long_doc = "word " * 20000 + "\n\nWhat is it?"
        tokens = model.tokenize(long_doc, add_special=False, parse_special=False)
        assert protected_count(model, long_doc, tokens, -1) == len(model.tokenize("What is it?", add_special=False))
        assert calls[0] <= DEFAULT_PROTECT_TAIL + 1 < len(tokens) // 10
    finally:
        model.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path, monkeypatch):
    from specq.storage import db

    with empty_store(request.param, tmp_path) as url:
        monkeypatch.setenv("SPECQ_DATABASE_URL", url)
        db.upgrade(url)
        yield url


def test_delta_publisher_coalesces_into_the_store(store_url):
    from sqlalchemy import select

    from specq.storage import db, deltas, jobs
    from specq.storage.models import JobDelta
    from specq.worker.stream import DeltaPublisher, StoreChannel

    with db.session() as s:
        job_id = jobs.create_job(s, text="x", params={}).id
        token = jobs.mark_running(s, job_id, "w:1")
    interval = 0.2
    pub = DeltaPublisher(StoreChannel(), job_id, attempt=1, interval=interval, token=token)
    t0 = time.monotonic()
    for ch in "abcdefghij":  # ten pieces, 5 ms apart (longer on a loaded machine)
        pub.feed(ch)
        time.sleep(0.005)
    fed = time.monotonic() - t0
    pub.finish()
    with db.session() as s:
        rows = deltas.read_after(s, job_id)
        stamps = [r.created_at for r in s.scalars(select(JobDelta).where(JobDelta.job_id == job_id)
                                                  .order_by(JobDelta.seq))]
    assert "".join(r.text for r in rows) == "abcdefghij" and rows[-1].final
    assert len(rows) <= 2 + fed / interval, (len(rows), fed)  # coalesced: at most one publish per interval
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:-1])]
    assert all(g >= interval * 0.9 for g in gaps), gaps
    assert [r.offset for r in rows] == [sum(len(x.text) for x in rows[:i]) for i in range(len(rows))]
    with db.session() as s:
        assert deltas.clear(s, job_id) == len(rows)


def test_claims_interactive_first_then_tenants_take_turns(store_url):
    from specq.storage import claims, db, jobs

    with db.session() as s:
        made = [jobs.create_job(s, text="x", params={}, tenant=t, priority=p, queue="q").id
                for t, p in [("a", 1)] * 4 + [("b", 1)] * 2 + [("c", 0)]]
        claimed = [claims.claim_next(s, made[0], f"w:{i}", queue="q") for i in range(len(made))]
        for claim in claimed:  # each finishes before the next claim, as with one worker
            jobs.mark_failed(s, claim.job_id, "done", token=claim.token)
        order = [c.job_id for c in claimed]
        assert claims.claim_next(s, made[0], "w:9", queue="q") is None  # nothing queued: the message is dropped
        other = jobs.create_job(s, text="x", params={}, queue="elsewhere").id
        assert claims.claim_next(s, made[0], "w:9", queue="q") is None and other  # another queue's job stays
    tenant = {j: t for j, t in zip(made, "aaaabbc")}
    assert [tenant[j] for j in order] == ["c", "a", "b", "a", "b", "a", "a"]
