"""The indentation structure the `scope` chunk rule reads (engine/scoring/blocks.py, selection.rank_scores)."""

from __future__ import annotations

import numpy as np
import pytest

from specq.engine.scoring.blocks import header_chunks, header_pairs
from specq.engine.scoring.selection import HEADER_WEIGHT, rank_scores, select_kept

CODE = '''import os

def first(x):
    """Say why."""
    if x:
        return 1
    return 2


def decode(extended, pos):
    result = 0
    while True:
        try:
            char = ord(extended[pos])
        except IndexError:
            if errors == "strict":
                raise UnicodeError(
                    "incomplete punicode string")
            return pos + 1, None
        pos += 1
'''


def line_pieces(text: str) -> list[bytes]:
    """One token per character: chunk c is characters [c * chunk, (c + 1) * chunk)."""
    return [ch.encode() for ch in text]


def chunk_of(text: str, needle: str, chunk: int) -> int:
    return text.index(needle) // chunk


def test_a_line_hangs_from_the_nearest_less_indented_line():
    chunk = 16
    heads = header_chunks(line_pieces(CODE), chunk)
    assert len(heads) == -(-len(CODE) // chunk)
    # the message on its continuation line hangs from the raise; the raise from its `if`
    msg, rais, iff = (chunk_of(CODE, s, chunk) for s in ('"incomplete', "raise Unicode", 'if errors'))
    assert rais in heads[msg] and iff in heads[rais]
    # a body line hangs from its def, even with a blank line in between
    assert chunk_of(CODE, "def decode", chunk) in heads[chunk_of(CODE, "result = 0", chunk)]
    # never itself, and only from earlier chunks
    assert all(c not in h and all(x < c for x in h) for c, h in enumerate(heads))
    # top-level lines hang from nothing: their chunks have no header unless they also hold an indented line
    assert heads[0] == ()


def test_pairs_are_the_per_chunk_view_flattened():
    chunk = 16
    heads = header_chunks(line_pieces(CODE), chunk)
    pairs = header_pairs(line_pieces(CODE), chunk)
    assert sorted(map(tuple, pairs.tolist())) == sorted((c, h) for c, hs in enumerate(heads) for h in hs)
    assert pairs.shape[1] == 2 and len(pairs) > 0


def test_text_without_indentation_has_no_headers():
    prose = "In May 2000, Guido and the Python core development team moved to\nBeOpen.com.\n\nIn 2001, the PSF was formed.\n" * 5
    assert all(h == () for h in header_chunks(line_pieces(prose), 8))
    assert header_chunks([], 32) == []


def test_multibyte_tokens_and_tabs():
    text = "def f():\n\tif y:\n\t\treturn 'é' * 3\n"
    pieces = [text[i:i + 3].encode() for i in range(0, len(text), 3)]  # 3 characters a token, one non-ASCII
    heads = header_chunks(pieces, 2)  # chunk = 2 tokens = 6 characters
    ret = (text.index("return") // 3) // 2
    assert (text.index("if y") // 3) // 2 in heads[ret]


def test_scope_rule_keeps_the_def_of_a_strongly_attended_raise():
    """The message line scores high and its def, chunks above, scores low: `border` keeps the message
    without the def (the function's name); `scope` ranks the def's chunk as high as the message's, at the
    same budget, by dropping the lowest-ranked kept chunk."""
    chunk = 16
    text = CODE
    pieces = line_pieces(text)
    n = len(pieces)
    scores = np.full(n, 0.1, dtype=np.float32)
    a = text.index('"incomplete')
    scores[a:a + 27] = 5.0  # the message
    b = text.index("def first")
    scores[b:b + 30] = 1.0  # an unrelated, moderately attended line
    kw = dict(doc_start=0, n_prompt=n, protected=[], keep=0.2, chunk=chunk)
    chunks = lambda kept: {i // chunk for i in kept}  # noqa: E731
    msg = chunk_of(text, '"incomplete', chunk)
    border = chunks(select_kept(scores, rule="border", **kw))
    scope = chunks(select_kept(scores, rule="scope", pieces=pieces, **kw))
    rais = chunk_of(text, "raise Unicode", chunk)
    assert msg in border and rais not in border
    assert msg in scope and rais in scope
    assert len(scope) == len(border)
    # a header's rank is never below border's, and each header ranks at least HEADER_WEIGHT of its chunks'
    heads = header_chunks(pieces, chunk)
    ranks, base = rank_scores(scores, chunk, "scope", header_pairs(pieces, chunk)), rank_scores(scores, chunk, "border")
    assert np.all(ranks >= base)
    assert all(ranks[h] >= HEADER_WEIGHT * base[c] for c, hs in enumerate(heads) for h in hs)
    # chunks that are nobody's header keep border's rank
    headers = {h for hs in heads for h in hs}
    assert all(ranks[c] == base[c] for c in range(len(heads)) if c not in headers)


def test_scope_needs_the_text():
    scores = np.ones(64, dtype=np.float32)
    with pytest.raises(ValueError, match="header pairs"):
        rank_scores(scores, 32, "scope")
    with pytest.raises(ValueError, match="bytes"):
        select_kept(scores, doc_start=0, n_prompt=64, protected=[], keep=0.5, rule="scope")
    with pytest.raises(ValueError, match="header pairs name chunk 5, scores for 2 chunks"):
        rank_scores(scores, 32, "scope", np.array([[5, 0]]))


def test_block_ids_are_the_largest_block_within_the_bound():
    """Each chunk's block is the largest header line + deeper lines that holds it and spans at most
    max_chunks chunks: with room for a whole function, the function (from its `def`); with less, an inner
    block (the `try` of decode); chunks of no block (`import os`) get -1."""
    from specq.engine.scoring.blocks import block_ids

    chunk = 8
    pieces = line_pieces(CODE)
    c = lambda needle: chunk_of(CODE, needle, chunk)  # noqa: E731
    wide = block_ids(pieces, chunk, 64)
    assert wide[c("import os")] == -1
    assert wide[c('"""Say why')] == wide[c("return 2")] == c("def first")
    assert wide[c("result = 0")] == wide[c("incomplete")] == wide[c("pos += 1")] == c("def decode")
    narrow = block_ids(pieces, chunk, c("pos += 1") - c("while True") - 1)  # too small for `while` and `def`
    assert narrow[c("char = ord")] == c("try:")
    assert narrow[c("incomplete")] == narrow[c("return pos + 1")] == c("except IndexError")
    assert narrow[c("result = 0")] == -1  # its only blocks (`def decode`) are too large
    assert block_ids([], chunk, 4).shape == (0,)
    assert (block_ids(line_pieces("no\nindentation\nhere\n" * 5), chunk, 8) == -1).all()


def test_block_rule_keeps_the_whole_function_of_an_attended_line():
    """The `def decode` line scores high and nothing else of decode does: `border` keeps that line only;
    `block`, at the same budget, keeps every chunk of decode (its body ranks at BLOCK_WEIGHT of the def),
    and never ranks a chunk below `border`."""
    from specq.engine.scoring.blocks import block_ids
    from specq.engine.scoring.selection import BLOCK_MAX_CHUNKS, BLOCK_WEIGHT

    chunk = 32  # decode: 11 of the 13 chunks (within BLOCK_MAX_CHUNKS)
    pieces = line_pieces(CODE)
    n = len(pieces)
    scores = np.full(n, 0.1, dtype=np.float32)
    a = CODE.index("def decode")
    scores[a:a + 10] = 5.0
    b = CODE.index("def first")
    scores[b:b + 12] = 1.0
    kw = dict(doc_start=0, n_prompt=n, protected=[], keep=0.85, chunk=chunk)
    chunks = lambda kept: {i // chunk for i in kept}  # noqa: E731
    body = set(range(chunk_of(CODE, "def decode", chunk), chunk_of(CODE, "pos += 1", chunk) + 1))
    border = chunks(select_kept(scores, rule="border", **kw))
    block = chunks(select_kept(scores, rule="block", pieces=pieces, **kw))
    assert not body <= border and body <= block and len(block) == len(border)
    ids = block_ids(pieces, chunk, BLOCK_MAX_CHUNKS)
    ranks, base = rank_scores(scores, chunk, "block", ids), rank_scores(scores, chunk, "border")
    assert np.all(ranks >= base)
    assert all(ranks[i] >= BLOCK_WEIGHT * base[list(body)].max() - 1e-6 for i in body)
    with pytest.raises(ValueError, match="block ids"):
        rank_scores(scores, chunk, "block")
    with pytest.raises(ValueError, match="block ids for 2 chunks"):
        rank_scores(scores, chunk, "block", np.array([0, 0]))
