"""The real Qwen2.5-Coder pair (CPU): a chat message holding a ~3K-token document and a question, the
question first, last or in the middle; specprefill at keep 0.3 keeps every token of the question
(issue 47, item 5: before the question finder only the message's last paragraph was protected, so a
question first or in the middle competed with the document for the keep budget)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specq.engine.options import RunParams

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "python-license.txt").read_text()
QUESTION = "Which company did the Python core development team move to in May 2000?"


def message(place: str) -> str:
    if place == "first":
        return QUESTION + "\n\n" + TEXT
    if place == "last":
        return TEXT + "\n\n" + QUESTION
    cut = TEXT.index("\n\n", len(TEXT) // 2)
    return TEXT[:cut] + "\n\n" + QUESTION + "\n\n" + TEXT[cut + 2:]


@pytest.mark.real_models
@pytest.mark.parametrize("place", ["first", "last", "middle"])
def test_real_pair_keeps_the_question_wherever_it_stands(real_engine, place):
    messages = [("user", message(place))]
    params = RunParams(mode="specprefill", keep=0.3, max_tokens=8, min_tokens=0)
    r = real_engine.run("", params, messages=messages)
    prompt = real_engine.tokenize_prompt("", params, messages=messages)
    assert r.spec.mode == "specprefill" and prompt.n > 2500 and prompt.question_found, prompt.question_note
    kept = set(r.kept_indices)
    assert len(kept) < 0.6 * prompt.n  # most of the document dropped
    # the prompt's text with every dropped token blanked: the question is there whole
    seen = b"".join(real_engine.target.token_bytes(t) if i in kept else b"\x00" for i, t in enumerate(prompt.tokens))
    assert QUESTION.encode() in seen, (place, prompt.question_note)
    assert not any("no question found" in w for w in r.warnings)
