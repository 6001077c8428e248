"""What the target saw, in the document's own coordinates: kept spans and chunk scores per job.

Selection works on tokens; people read characters. This module turns a run's kept prompt indices and
its per-token scores into the `selection` object of the result (docs/result.md), in character
offsets into the document string the job was given, so a page can highlight the text directly:

* `kept_spans`: the document text the target prefilled, as sorted, merged `[start, end)` ranges;
* `protected_spans`: document text that was always prefilled whatever its score (e.g. a chat
  request's protected tail); empty for native jobs, whose question and template lie outside the
  document and are always prefilled;
* `chunk_offsets`: where each selection chunk starts (n_chunks + 1 offsets: the last is where the
  last chunk ends), little-endian uint32, base64;
* `chunk_scores`: each chunk's rank score (selection.rank_scores under the run's chunk rule: the
  score the chunks were ranked by, so the kept chunks are the top ones) quantised to uint8 between `score_min` (0) and
  `score_max` (255), base64: 4K chunks of a 128K-token document take 5.5 KB.

Offsets come from the bytes of each document token (`token_to_piece`). For byte-level vocabularies
(Qwen, Llama 3) those concatenate to the document's UTF-8 exactly; a token boundary inside a
multi-byte character is moved to the end of that character. A tokenizer that rewrote the text
(SentencePiece's leading space, normalisation) gets offsets spread by byte share instead, and
`offsets` says `approximate`.
"""

from __future__ import annotations

import base64
from typing import Sequence

import numpy as np

from .selection import DEFAULT_CHUNK_RULE, headers_for, rank_scores

#: the `selection` format; a reader that meets a newer one should not guess
FORMAT_VERSION = 1


def token_char_bounds(pieces: Sequence[bytes], document: str) -> tuple[np.ndarray, bool]:
    """(bounds, exact): bounds[i] is the character offset where token i starts (len(pieces) + 1
    values, non-decreasing); exact is False when the pieces do not spell the document's UTF-8."""
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    byte_bounds = np.concatenate([[0], np.cumsum(lengths)])
    data = document.encode("utf-8")
    joined = b"".join(pieces)
    exact = data.startswith(joined)
    if not exact and joined.startswith(b" ") and data.startswith(joined[1:]):
        byte_bounds = np.maximum(byte_bounds - 1, 0)  # SentencePiece's added leading space
        exact = True
    if not exact:
        total = max(1, int(byte_bounds[-1]))
        byte_bounds = np.minimum(np.round(byte_bounds * (len(data) / total)).astype(np.int64), len(data))
    return _bytes_to_chars(byte_bounds, data), exact


def _bytes_to_chars(byte_offsets: np.ndarray, data: bytes) -> np.ndarray:
    """Character offsets of byte offsets into `data` (UTF-8); an offset inside a character moves to its end."""
    if data.isascii():
        return byte_offsets.astype(np.int64)
    arr = np.frombuffer(data, dtype=np.uint8)
    starts = (arr & 0xC0) != 0x80  # the first byte of each character
    # chars[b] = characters that start before byte b; inside a character that counts it, i.e. its end
    chars = np.concatenate([[0], np.cumsum(starts, dtype=np.int64)])
    return chars[np.clip(byte_offsets, 0, len(data))]


def runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct ints as maximal [start, end) runs of consecutive values."""
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and i == out[-1][1]:
            out[-1] = (out[-1][0], i + 1)
        elif not out or i > out[-1][1]:
            out.append((i, i + 1))
    return out


def char_spans(token_runs: list[tuple[int, int]], bounds: np.ndarray) -> list[list[int]]:
    """Token runs as merged, non-empty character ranges."""
    spans: list[list[int]] = []
    for a, b in token_runs:
        s, e = int(bounds[a]), int(bounds[b])
        if e <= s:
            continue
        if spans and s <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], e)
        else:
            spans.append([s, e])
    return spans


def quantise(values: np.ndarray) -> tuple[bytes, float, float]:
    """uint8 bytes of `values` scaled linearly from their min (0) to their max (255)."""
    if values.size == 0:
        return b"", 0.0, 0.0
    lo, hi = float(values.min()), float(values.max())
    scaled = np.zeros(values.shape) if hi <= lo else (values - lo) / (hi - lo) * 255.0
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8).tobytes(), lo, hi


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def selection_record(
    pieces: Sequence[bytes],
    document: str,
    doc_start: int,
    kept: Sequence[int],
    protected: Sequence[int],
    doc_scores: np.ndarray,
    chunk: int,
    rule: str = DEFAULT_CHUNK_RULE,
) -> dict:
    """The result's `selection` object for one specprefill run.

    pieces: the bytes of each of the prompt's document tokens (prompt[doc_start : doc_start + len(pieces)],
    e.g. `Model.pieces`); kept, protected: sorted prompt indices; doc_scores: one score per document token."""
    n_doc = len(pieces)
    bounds, exact = token_char_bounds(pieces, document)
    in_doc = lambda idx: [i - doc_start for i in idx if doc_start <= i < doc_start + n_doc]  # noqa: E731
    headers = headers_for(rule, pieces, chunk) if n_doc else None
    means = rank_scores(np.asarray(doc_scores, dtype=np.float64), chunk, rule, headers) if n_doc else np.zeros(0)
    scores, lo, hi = quantise(means)
    starts = np.minimum(np.arange(0, len(means) + 1) * chunk, n_doc)
    return {
        "version": FORMAT_VERSION,
        "chunk_tokens": int(chunk),
        "n_chunks": int(len(means)),
        "offsets": "exact" if exact else "approximate",
        "kept_spans": char_spans(runs(in_doc(kept)), bounds),
        "protected_spans": char_spans(runs(in_doc(protected)), bounds),
        "chunk_offsets": b64(bounds[starts].astype("<u4").tobytes()),
        "chunk_scores": b64(scores),
        "score_min": lo,
        "score_max": hi,
    }


def decode_offsets(value: str) -> list[int]:
    return np.frombuffer(base64.b64decode(value), dtype="<u4").astype(int).tolist()


def decode_scores(value: str) -> list[int]:
    return list(base64.b64decode(value))


__all__ = ["selection_record", "token_char_bounds", "runs", "char_spans", "quantise", "decode_offsets",
           "decode_scores", "FORMAT_VERSION"]
