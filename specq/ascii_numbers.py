"""Whole numbers in text from outside (headers, form fields, settings) parsed with ASCII patterns.

`str.isdigit()` is true for '²' and '٣', and `int()` takes '٣', '+5', ' 7 ' and '1_000': a check with
one and a parse with the other either lets other digits through or raises where the caller expected
none (`Last-Event-ID: ²` was a 500). Every number the service reads from a request, a response or the
environment goes through `ascii_int` (or is refused before `int()`/`float()` sees non-ASCII text).
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"[+-]?[0-9]+")


def ascii_int(text: str | bytes | None, *, max_digits: int = 18, signed: bool = False) -> int | None:
    """The whole number `text` spells in ASCII digits 0-9 (with `signed`, an optional + or - first), or
    None: anything else, including other scripts' digits, superscripts, underscores, spaces and more
    than `max_digits` digits."""
    if text is None:
        return None
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not (_SIGNED if signed else _DIGITS).fullmatch(text) or len(text.lstrip("+-")) > max_digits:
        return None
    return int(text)


__all__ = ["ascii_int"]
