"""The question of a chat or completion prompt is found wherever it stands and never dropped (issue 47,
item 5): the finder on text (engine/prompt/question.py), the prompts that pin what it finds
(engine/chat_prompt.py), mode auto's rule 0 and the engine's warnings, on the tiny models. The real
pair with the question first, last and in the middle: tests/test_question_placement.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from specq.contracts import InputError
from specq.engine.prompt.question import find_question

ROOT = Path(__file__).resolve().parents[1]
LICENSE = (ROOT / "examples" / "python-license.txt").read_text()
CODE = (ROOT / "examples" / "textwrap.py").read_text()
Q = "Which company did the Python core development team move to in May 2000?"


def found_texts(text: str, explicit: str = "") -> tuple[str | None, list[str]]:
    f = find_question(text, explicit)
    return (None, []) if f is None else (f.where, [text[a:b] for a, b in f.spans])


@pytest.mark.parametrize("doc", [LICENSE, CODE], ids=["prose", "code"])
def test_finder_first_last_middle(doc):
    assert found_texts(Q + "\n\n" + doc) == ("first", [Q])
    assert found_texts(doc + "\n\n" + Q) == ("last", [Q])
    cut = doc.index("\n\n", len(doc) // 2)
    assert found_texts(doc[:cut] + "\n\n" + Q + "\n\n" + doc[cut + 2:]) == ("middle", [Q])


def test_finder_glued_lines_instructions_and_labels():
    # a question glued to the document by a single newline: the first or last line
    assert found_texts(Q + "\n" + CODE) == ("first", [Q])
    assert found_texts(CODE.rstrip() + "\n" + Q) == ("last", [Q])
    # an instruction without "?" and a labelled question
    ask = "Summarize the license terms in three bullet points."
    assert found_texts(ask + "\n\n" + LICENSE) == ("first", [ask])
    label = "Question: the year BeOpen.com was founded"
    assert found_texts(LICENSE + "\n\n" + label) == ("last", [label])
    # a question before and an instruction after the document: both
    where, texts = found_texts(Q + "\n\n" + LICENSE + "\n\nAnswer with the company name only.")
    assert where == "first and last" and texts == [Q, "Answer with the company name only."]


def test_finder_finds_nothing_in_a_bare_document_or_a_statement():
    assert found_texts(LICENSE) == (None, [])
    assert found_texts(CODE) == (None, [])
    assert found_texts(LICENSE + "\n\nI need the company name.") == (None, [])  # a documented limit
    assert found_texts("") == (None, [])


def test_finder_in_an_faq_document_keeps_only_the_ends():
    faq = "Frequently asked questions about items.\n\n" + "\n\n".join(f"Q{i}: is item {i} supported?\n\nYes, item {i} is supported since version {i}." for i in range(12))
    where, texts = found_texts(faq + "\n\n" + Q)
    assert where == "last" and texts == [Q]  # the FAQ's own 12 questions are not all protected
    assert found_texts(faq) == (None, [])  # a title first, an answer last: none at its ends


def test_finder_explicit_question():
    text = Q + "\n\n" + LICENSE
    assert found_texts(text, "  " + Q + " ") == ("specq.question", [Q])
    part = "BeOpen.com"
    where, texts = found_texts(text, part)
    assert where == "specq.question" and texts == [part]
    f = find_question(text, part)
    assert f.spans[0][0] == text.rindex(part)  # its last occurrence
    assert find_question(text, "not in the message at all") is None


# --- prompts (tiny models: a byte vocabulary, about one token per byte) ---------------------------------

@pytest.fixture(scope="module")
def model(tiny_models):
    from specq.engine.llama.binding import Model

    m = Model(tiny_models.target, n_gpu_layers=0)
    yield m
    m.close()


def protected_text(model, prompt) -> str:
    """The prompt's text with every droppable token replaced by NUL: what scoring can never drop."""
    keep = set(prompt.protected_indices())
    return b"".join(model.token_bytes(t) if i in keep else b"\x00" for i, t in enumerate(prompt.tokens)).decode(
        "utf-8", "replace")


DOC = "".join(f"Line {i}: the value of item_{i} is {i * 7}.\n" for i in range(80))


@pytest.mark.parametrize("place", ["first", "last", "middle"])
def test_chat_prompt_pins_the_question_wherever_it_stands(model, place):
    from specq.engine.prompt.chat import build_chat_prompt

    half = DOC.index("\n", len(DOC) // 2) + 1
    content = {"first": Q + "\n\n" + DOC, "last": DOC + "\n\n" + Q,
               "middle": DOC[:half] + "\n" + Q + "\n\n" + DOC[half:]}[place]
    p = build_chat_prompt(model, [("system", "Be brief."), ("user", content)])
    assert p.question_found and f"found {place}" in p.question_note
    assert Q in protected_text(model, p)
    # and most of the document stays droppable
    assert p.doc_end - p.doc_start - len(p.pinned) > 0.8 * len(DOC)


def test_chat_prompt_before_the_fix_left_a_first_question_droppable(model):
    """What the finder changes: the last paragraph alone (today's rule) does not hold a first question."""
    from specq.engine.prompt.chat import build_chat_prompt

    p = build_chat_prompt(model, [("user", Q + "\n\n" + DOC)])
    assert p.pinned and all(p.doc_start <= i < p.doc_end for i in p.pinned)


def test_chat_prompt_without_a_question_and_with_an_explicit_one(model):
    from specq.engine.prompt.chat import build_chat_prompt

    none = build_chat_prompt(model, [("user", DOC)])
    assert not none.question_found and none.question_note == "no question found in the chat message"
    assert not none.pinned
    half = DOC.index("\n", len(DOC) // 2) + 1
    ask = "zz what of item_3, zz"
    named = build_chat_prompt(model, [("user", DOC[:half] + ask + "\n" + DOC[half:])], question=ask)
    assert named.question_found and "specq.question" in named.question_note
    assert ask in protected_text(model, named) and named.pinned
    # protect_tail > 0 names the question too (its last tokens)
    assert build_chat_prompt(model, [("user", DOC)], protect_tail=8).question_found
    with pytest.raises(InputError, match="specq.question"):
        build_chat_prompt(model, [("user", DOC)], question="not there")


def test_raw_prompt_finds_the_question_too(model):
    from specq.engine.prompt.chat import build_raw_prompt

    p = build_raw_prompt(model, Q + "\n\n" + DOC)
    assert p.question_found and Q in protected_text(model, p) and "completion prompt" in p.question_note
    none = build_raw_prompt(model, DOC)
    assert not none.question_found and none.question_note == "no question found in the completion prompt"
    named = build_raw_prompt(model, DOC, question="item_5 is 35")
    assert named.question_found and "item_5 is 35" in protected_text(model, named)
    with pytest.raises(InputError):
        build_raw_prompt(model, DOC, question="item_5 is 36")


def test_auto_rule_0_no_question_runs_baseline_before_any_other_rule():
    from specq.engine.policy import auto

    d = auto.decide(9000, backend="cpu", quality_min_tokens=0, no_question="no question found in the chat message")
    assert d.mode == "baseline" and d.reason.startswith("no question found in the chat message: baseline")
    assert auto.decide(9000, backend="cpu", quality_min_tokens=0).mode == "specprefill"


@pytest.fixture(scope="module")
def engine(tiny_models):
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    # mode auto as if quality were measured from 0 tokens, no prompt cache: only rule 0 can say baseline
    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator),
                               n_gpu_layers=0, n_ctx=4096, auto_min_tokens=64, auto_quality_min_tokens=0,
                               cache_bytes=0))
    yield eng
    eng.close()


def test_engine_auto_runs_baseline_without_a_question_and_says_so(engine):
    from specq.engine.options import RunParams

    r = engine.run("", RunParams(max_tokens=2), messages=[("user", DOC)])
    assert r.spec.mode == "baseline" and r.spec.reason.startswith("auto: no question found in the chat message")
    r = engine.run(DOC, RunParams(max_tokens=2), raw=True)
    assert r.spec.mode == "baseline" and "no question found in the completion prompt" in r.spec.reason
    asked = engine.run("", RunParams(max_tokens=2), messages=[("user", Q + "\n\n" + DOC)])
    assert asked.spec.mode == "specprefill", asked.spec.reason


def test_engine_explicit_specprefill_without_a_question_warns(engine):
    from specq.engine.options import RunParams

    r = engine.run("", RunParams(max_tokens=2, mode="specprefill", min_tokens=0), messages=[("user", DOC)])
    assert r.spec.mode == "specprefill"
    assert any(w.startswith("no question found in the chat message: only the prompt's last ") for w in r.warnings)


@pytest.mark.parametrize("place", ["first", "middle"])
def test_engine_keeps_the_question_tokens(engine, place):
    from specq.engine.options import RunParams

    half = DOC.index("\n", len(DOC) // 2) + 1
    content = Q + "\n\n" + DOC if place == "first" else DOC[:half] + "\n" + Q + "\n\n" + DOC[half:]
    params = RunParams(max_tokens=2, mode="specprefill", min_tokens=0, keep=0.1)
    r = engine.run("", params, messages=[("user", content)])
    assert r.spec.mode == "specprefill" and not r.warnings
    prompt = engine.tokenize_prompt("", params, messages=[("user", content)])
    kept = set(r.kept_indices)
    assert len(kept) < 0.5 * prompt.n
    seen = b"".join(engine.target.token_bytes(t) if i in kept else b"\x00" for i, t in enumerate(prompt.tokens))
    assert Q.encode() in seen


def test_question_tokens_read_from_the_nearer_end(model):
    """A question last (or first) costs its own tokens' pieces, not the document's: a 128K-token message's
    pieces took 0.2-0.4 s of GIL-held Python beside the serving loop."""
    from specq.engine.prompt.chat import question_tokens

    long_doc = "word " * 20000
    read = [0]
    real = model.pieces

    def counted(tokens):
        read[0] += len(tokens)
        return real(tokens)

    model.pieces = counted
    try:
        for content in (long_doc + "\n\n" + Q, Q + "\n\n" + long_doc):
            tokens = model.tokenize(content, add_special=False, parse_special=False)
            read[0] = 0
            idx, note = question_tokens(model, content, tokens)
            assert model.detokenize([tokens[i] for i in idx]).strip() == Q, note
            assert read[0] <= 1024 < len(tokens) // 10
    finally:
        del model.pieces
