"""Turning uploaded bytes into a document, or a one-line reason why not.

What is text: UTF-8 (with or without a BOM), and UTF-16 or UTF-32 that starts with its byte-order
mark (what Windows editors and PowerShell's `>` write). Without a BOM, bytes with NULs are refused
as binary: guessing UTF-16 from NUL patterns would also accept binary files.

ANSI escape sequences (colours and cursor codes of a terminal log, `ESC [ 31 m`) are text and are
KEPT: the document is what the user sent, the colours carry meaning a question may be about (red =
error), and the text fed to the model stays the bytes that were uploaded. They do not count towards
the "mostly control characters" refusal. Printing them safely is the job of whoever prints (the CLI
shows them escaped).
"""

from __future__ import annotations

import re

from ..contracts import InputError

#: control characters allowed in a document (tab, newline, carriage return, form feed)
_ALLOWED_CONTROLS = {"\t", "\n", "\r", "\f"}
#: byte-order marks (the UTF-32-LE mark starts with the UTF-16-LE one, so it comes first): codec, name
_BOMS = ((b"\xef\xbb\xbf", "utf-8", "UTF-8"), (b"\xff\xfe\x00\x00", "utf-32-le", "UTF-32"),
         (b"\x00\x00\xfe\xff", "utf-32-be", "UTF-32"), (b"\xff\xfe", "utf-16-le", "UTF-16"),
         (b"\xfe\xff", "utf-16-be", "UTF-16"))
#: one ECMA-48 escape sequence: CSI (ESC [ … final byte), OSC (ESC ] … BEL or ESC \), or a
#: two- or three-character escape (ESC ( B, ESC 7, …)
ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)|[ -/]{0,2}[0-~])")


def decode_document(data: bytes, *, name: str = "input") -> str:
    """The text of `data` (see the module docstring), or InputError: empty, binary (NUL bytes),
    undecodable, mostly control characters."""
    if not data or not data.strip():
        raise InputError(f"{name} is empty")
    bom, codec, shown = next((m for m in _BOMS if data.startswith(m[0])), (b"", "utf-8", "UTF-8"))
    if not bom and b"\x00" in data:
        raise InputError(f"{name} looks binary (it contains NUL bytes); specq reads text: UTF-8, "
                         "or UTF-16/UTF-32 starting with a byte-order mark")
    try:
        text = data[len(bom):].decode(codec)
    except UnicodeDecodeError as e:
        raise InputError(f"{name} is not {shown} text (bad byte at offset {len(bom) + e.start})") from None
    check_text(text, name=name)
    return text


def check_text(text: str, *, name: str = "input") -> None:
    """InputError if `text` is empty, holds a NUL (no text does; PostgreSQL cannot store it) or is
    mostly control characters (those of ANSI escape sequences not counted)."""
    if not text.strip():
        raise InputError(f"{name} is empty")
    if "\x00" in text:
        raise InputError(f"{name} looks binary (it contains NUL characters); specq reads text")
    bare = ANSI_ESCAPE.sub("", text) if "\x1b" in text else text
    if not bare.strip():
        raise InputError(f"{name} is empty (it holds only terminal escape sequences)")
    controls = sum(1 for c in bare if (ord(c) < 32 and c not in _ALLOWED_CONTROLS) or c == "\x7f")
    if controls > max(8, len(text) // 100):
        raise InputError(f"{name} looks binary ({controls} control characters); specq reads text")
