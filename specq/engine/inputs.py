"""Turning uploaded bytes into a document, or a one-line reason why not."""

from __future__ import annotations

from ..contracts import InputError

#: control characters allowed in a document (tab, newline, carriage return, form feed)
_ALLOWED_CONTROLS = {"\t", "\n", "\r", "\f"}


def decode_document(data: bytes, *, name: str = "input") -> str:
    """UTF-8 text from `data`, or InputError: empty, binary (NUL bytes), undecodable, mostly controls."""
    if not data or not data.strip():
        raise InputError(f"{name} is empty")
    if b"\x00" in data:
        raise InputError(f"{name} looks binary (it contains NUL bytes); specq reads UTF-8 text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{name} is not UTF-8 text (bad byte at offset {e.start})") from None
    check_text(text, name=name)
    return text


def check_text(text: str, *, name: str = "input") -> None:
    """InputError if `text` is empty, holds a NUL (no text does; PostgreSQL cannot store it) or is
    mostly control characters."""
    if not text.strip():
        raise InputError(f"{name} is empty")
    if "\x00" in text:
        raise InputError(f"{name} looks binary (it contains NUL characters); specq reads UTF-8 text")
    controls = sum(1 for c in text if (ord(c) < 32 and c not in _ALLOWED_CONTROLS) or c == "\x7f")
    if controls > max(8, len(text) // 100):
        raise InputError(f"{name} looks binary ({controls} control characters); specq reads UTF-8 text")
