"""A memo of long texts' tokens (issue 50 item 1): a stored document's next question tokenizes the same
document text again, and llama_tokenize of a 32K-token document takes tens of milliseconds (~0.16 s on
the 2-core CPU) on the path to the first token, before the job even reaches the engine loop.

Exact by construction: a hit needs the same text (equal strings) and the same flags, and llama_tokenize
is a pure function of the vocabulary, the text and the flags. Only texts of at least MIN_CHARS characters
are kept (short ones cost more to look up than to tokenize), as int32 arrays, least recently used out
first beyond BUDGET_TOKENS tokens in all. Thread-safe: the serving loop's submitting threads tokenize
concurrently.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

#: texts shorter than this are tokenized every time
MIN_CHARS = 4096
#: tokens kept in all (4 bytes each: 16 MB), e.g. 128 documents of 32K tokens
BUDGET_TOKENS = 4 << 20


class TokenMemo:
    def __init__(self, budget_tokens: int = BUDGET_TOKENS, min_chars: int = MIN_CHARS) -> None:
        self.budget = int(budget_tokens)
        self.min_chars = int(min_chars)
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, bool, bool], np.ndarray] = OrderedDict()
        self._size = 0
        self.hits = 0
        self.misses = 0

    def tokens(self, text: str, add_special: bool, parse_special: bool,
               tokenize: Callable[[], list[int]]) -> list[int]:
        """`text`'s tokens: remembered, or `tokenize()`'s (then remembered when the text is long)."""
        if len(text) < self.min_chars or self.budget <= 0:
            return tokenize()
        key = (text, bool(add_special), bool(parse_special))
        with self._lock:
            got = self._items.get(key)
            if got is not None:
                self._items.move_to_end(key)
                self.hits += 1
        if got is not None:
            return got.tolist()  # a fresh list: callers may change theirs
        toks = tokenize()
        arr = np.asarray(toks, dtype=np.int32)
        if arr.size > self.budget:
            return toks
        with self._lock:
            self.misses += 1
            if key not in self._items:
                self._items[key] = arr
                self._size += arr.size
            while self._size > self.budget:
                _, old = self._items.popitem(last=False)
                self._size -= old.size
        return toks


__all__ = ["TokenMemo", "MIN_CHARS", "BUDGET_TOKENS"]
