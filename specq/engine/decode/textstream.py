"""Decoded tokens as text a client may see: whole UTF-8 characters only, stop strings applied.

The decode loop pushes each emitted token's bytes; `push` returns the text that is now final. Two
things hold text back: a multi-byte character split over tokens (its first bytes wait for the rest),
and a possible start of a stop string at the end of the text (`"Ans"` while `"Answer:"` is a stop
string), released once it can no longer match. When a stop string matches, the text ends just before
it and `stopped` is set: the engine ends the generation there. The texts returned by `push` and
`finish`, joined, are exactly `text` — what the job's result holds and what its stream sent.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        #: characters released so far (`text`)
        self._released = 0
        #: a stop string matched: nothing more is released
        self.stopped = False

    @property
    def text(self) -> str:
        """The text released so far (after `finish`: the whole answer)."""
        return self._text[: self._released]

    def push(self, data: bytes) -> str:
        """Add one token's bytes; return the text that became final (maybe "")."""
        if self.stopped:
            return ""
        self._text += self._decoder.decode(data)
        return self._release(final=False)

    def finish(self) -> str:
        """The generation ended: flush the decoder and release what was held back."""
        if self.stopped:
            return ""
        self._text += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        start = self._released
        # a stop string cannot begin before `start`: released text never holds a possible start of one
        hit = min((i for i in (self._text.find(s, start) for s in self.stop) if i >= 0), default=-1)
        if hit >= 0:
            self.stopped = True
            end = hit
        elif final or not self.stop:
            end = len(self._text)
        else:
            end = len(self._text)
            for j in range(max(start, len(self._text) - self._hold), len(self._text)):
                tail = self._text[j:]
                if any(s.startswith(tail) for s in self.stop):
                    end = j
                    break
        self._released = end
        return self._text[start:end]


__all__ = ["TextStream"]
