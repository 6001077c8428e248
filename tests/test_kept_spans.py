"""The result's `selection` (specq/engine/scoring/kept_spans.py): kept spans and chunk scores in character
offsets into the document, from a real specprefill run on the tiny models and from hand-made pieces."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from specq.engine.scoring.kept_spans import (
    char_spans,
    decode_offsets,
    decode_scores,
    quantise,
    runs,
    selection_record,
    token_char_bounds,
)

#: multi-byte characters (2, 3 and 4 UTF-8 bytes) that byte-level tokens split
DOC = "".join(f"Grüße {i} — 日本語 {'🙂' * (i % 3)} def f{i}(x): return x * {i}\n" for i in range(60))


def test_bounds_of_byte_pieces_move_into_character_ends():
    text = "aé日🙂b"
    pieces = [bytes([b]) for b in text.encode()]  # one byte per token, as a byte vocabulary may cut it
    bounds, exact = token_char_bounds(pieces, text)
    assert exact
    assert bounds.tolist() == [0, 1, 2, 2, 3, 3, 3, 4, 4, 4, 4, 5]  # a cut inside a character -> its end
    assert all(text[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a)


def test_sentencepiece_leading_space_and_rewritten_text():
    bounds, exact = token_char_bounds([b" hello", b" world"], "hello world")
    assert exact and bounds.tolist() == [0, 5, 11]
    bounds, exact = token_char_bounds([b"HELLO", b"WORLD!"], "hello world")
    assert not exact and bounds[0] == 0 and bounds[-1] == len("hello world") and list(bounds) == sorted(bounds)


def test_runs_spans_and_quantise():
    assert runs([1, 2, 3, 7, 8, 10]) == [(1, 4), (7, 9), (10, 11)]
    bounds = np.array([0, 2, 4, 4, 9, 12])
    assert char_spans([(0, 2), (2, 3), (4, 5)], bounds) == [[0, 4], [9, 12]]  # adjacent merged, empty dropped
    data, lo, hi = quantise(np.array([1.0, 3.0, 2.0]))
    assert list(data) == [0, 255, 128] and (lo, hi) == (1.0, 3.0)
    assert list(quantise(np.array([5.0, 5.0]))[0]) == [0, 0]


def test_record_of_a_real_run(tiny_models):
    from specq.engine.options import EngineOptions, RunParams
    from specq.engine.pipeline import Engine
    from specq.engine.prompt.build import build_prompt

    eng = Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                               n_ctx=8192, n_threads=1))
    try:
        params = RunParams(question="Which function?", mode="specprefill", min_tokens=0, keep=0.3, chunk=16, max_tokens=4)
        result = eng.run(DOC, params)
        sel = result.to_dict()["selection"]
        prompt = build_prompt(eng.target, DOC, params.question)
        piece_lengths = [len(eng.target.token_bytes(t)) for t in prompt.document]
        base = eng.run(DOC, RunParams(question="Which function?", max_tokens=2))
    finally:
        eng.close()
    assert "selection" not in base.to_dict()  # baseline: everything was prefilled
    n_doc = prompt.doc_end - prompt.doc_start
    assert sel["version"] == 1 and sel["offsets"] == "exact" and sel["chunk_tokens"] == 16
    assert sel["n_chunks"] == -(-n_doc // 16)
    offsets = decode_offsets(sel["chunk_offsets"])
    scores = decode_scores(sel["chunk_scores"])
    assert len(offsets) == sel["n_chunks"] + 1 and offsets[0] == 0 and offsets[-1] == len(DOC)
    assert offsets == sorted(offsets) and len(scores) == sel["n_chunks"] and max(scores) == 255 and min(scores) == 0
    assert len(base64.b64decode(sel["chunk_scores"])) == sel["n_chunks"]  # one byte per chunk
    # the kept spans are the kept chunks' text: whole chunks, in the document's characters
    kept = set(result.kept_indices)
    kept_chunks = [c for c in range(sel["n_chunks"]) if prompt.doc_start + c * 16 in kept]
    assert len(kept_chunks) == -(-sel["n_chunks"] * 3 // 10)  # ceil(0.3 * chunks)
    expected = char_spans([(c, c + 1) for c in kept_chunks], np.array(offsets))
    assert sel["kept_spans"] == expected and sel["protected_spans"] == []
    # each chunk starts where its first token's bytes start, moved to the end of a character it cuts
    for c, at in enumerate(offsets[:-1]):
        byte_at = sum(piece_lengths[: c * 16])
        assert 0 <= len(DOC[:at].encode()) - byte_at <= 3
    covered = sum(b - a for a, b in sel["kept_spans"])
    assert 0 < covered < len(DOC)


def test_record_marks_protected_document_tokens():
    text = "abcdefghij"
    pieces = [text[i:i + 2].encode() for i in range(0, 10, 2)]  # 5 tokens of 2 characters
    sel = selection_record(pieces, text, doc_start=3,
                           kept=[0, 1, 2, 3, 4, 6, 7], protected=[0, 1, 2, 7, 8],
                           doc_scores=np.array([1, 1, 5, 5, 3], dtype=np.float32), chunk=2, rule="mean")
    assert sel["kept_spans"] == [[0, 4], [6, 10]]  # document tokens 0, 1 (prompt 3, 4) and 3, 4 (prompt 6, 7)
    assert sel["protected_spans"] == [[8, 10]]  # document token 4 (prompt index 7)
    assert decode_offsets(sel["chunk_offsets"]) == [0, 4, 8, 10]
    assert decode_scores(sel["chunk_scores"]) == [0, 255, 128]
    assert (sel["score_min"], sel["score_max"]) == (1.0, 5.0)
    # the border rule's scores are what it ranks by: chunk 0 takes the span over its right border
    # (tokens 1-2: 1, 5 -> 3), chunk 2 the span over its left border (tokens 3-4: 5, 3 -> 4)
    border = selection_record(pieces, text, doc_start=3, kept=[3, 4, 5, 6], protected=[],
                              doc_scores=np.array([1, 1, 5, 5, 3], dtype=np.float32), chunk=2)
    assert (border["score_min"], border["score_max"]) == (3.0, 5.0)
    assert decode_scores(border["chunk_scores"]) == [0, 255, 128]


def test_scope_scores_are_what_it_ranks_by():
    """Under `scope` a header line's chunk carries the rank of the lines hanging from it."""
    text = "def f():\n    if x:\n        raise E('m')\n"
    pieces = [text[i:i + 4].encode() for i in range(0, len(text), 4)]  # 4 characters a token
    n = len(pieces)
    scores = np.ones(n, dtype=np.float32)
    scores[-3:] = 9.0  # the raise line
    kw = dict(doc_start=0, kept=list(range(n)), protected=[], doc_scores=scores, chunk=2)
    border = decode_scores(selection_record(pieces, text, rule="border", **kw)["chunk_scores"])
    scope = decode_scores(selection_record(pieces, text, rule="scope", **kw)["chunk_scores"])
    iff = (text.index("if x") // 4) // 2
    assert scope[iff] > border[iff] and scope[-1] == border[-1] == 255


@pytest.mark.parametrize("text", ["", "x"])
def test_empty_or_tiny_documents(text):
    pieces = [text.encode()] if text else []
    sel = selection_record(pieces, text, 1, [0, 1, 2], [0, 2],
                           np.ones(len(pieces), dtype=np.float32), 32)
    assert sel["n_chunks"] == len(pieces) and decode_offsets(sel["chunk_offsets"])[-1] == len(text)


def test_selection_is_stored_with_the_result_and_left_out_of_batch_exports(store):
    from specq.engine.result import RunResult
    from specq.storage import db, jobs, results

    text = "abcdefghij"
    pieces = [text[i:i + 2].encode() for i in range(0, 10, 2)]
    sel = selection_record(pieces, text, 1, [1, 2, 5], [], np.arange(5.0), 2)
    with db.session() as s:
        job = jobs.create_job(s, text=text, params={})
        tok = jobs.mark_running(s, job.id, "w:1")
        assert results.save_result(s, job.id, RunResult(text="hi", selection=sel), token=tok)
        assert results.get_result(s, job.id)["selection"] == sel
        assert "selection" not in results.get_results(s, [job.id])[job.id]
        assert results.get_results(s, [job.id], detail=True)[job.id]["selection"] == sel
