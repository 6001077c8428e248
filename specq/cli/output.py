"""How the CLI prints text that came from a server, a file or a model: safe for the terminal, and
lists in the form the reader needs.

* `safe(text)`: C0/C1 control characters, DEL, the Unicode bidi controls and lone surrogates are
  shown escaped (`\\x1b`, `\\u202e`), so an ANSI escape sequence in a file name, an error or an
  answer is printed as inert characters instead of moving the cursor, recolouring, retitling or
  hiding what follows.
* `cell(text)`: a rich `Text` of `safe(text)`: rich reads no markup (`[/x]`, `[link=…]`) in it.
  Every piece of user text given to rich goes through it; plain strings given to rich are markup.
* `print_table(columns, rows)`: a rich table on a terminal; when stdout is not a terminal, one
  tab-separated line per row and no header (`specq jobs | cut -f1`), every cell whole (nothing
  cut at 80 columns) and made one line by `safe`.
* `print_json(obj)`: JSON for scripts (ASCII only: control characters are `\\u` escapes).
* `echo_data(text)`: a file's worth of data (JSONL, CSV): byte for byte into a pipe or file, made
  safe only when it is shown on a terminal.

A command with a list adds `--json`: a list the API returns is printed as the API answered it
(`print_json(page)`), a local one as `{"object": "list", "data": [...]}` (`print_list`), the shape of
the API's lists.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import typer

#: bidi marks, embeddings, overrides and isolates, and lone surrogates (undecodable bytes of a file
#: name or an argument: printing one raises)
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
#: one line: every C0 control, DEL, C1 controls, and the characters above
_UNSAFE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
#: several lines: the same but tab, newline and the CR of a CRLF line end
_UNSAFE = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f{_BIDI}]|\r(?!\n)")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match) -> str:
    c = match.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def safe(text: Any, *, lines: bool = False) -> str:
    """`text` (any value: str() of it) with control characters shown escaped; one line unless
    `lines` (then tabs, newlines and CRLF line ends stay as they are)."""
    s = "" if text is None else str(text)
    return (_UNSAFE if lines else _UNSAFE_LINE).sub(_escape, s)


def cell(text: Any, *, lines: bool = False, style: str = ""):
    """`safe(text)` as a rich Text: printed literally, never read as markup."""
    from rich.text import Text

    return Text(safe(text, lines=lines), style=style)


def num(value: Any, spec: str = ",.1f", unit: str = "") -> str:
    """`value` formatted with `spec` (and `unit`), or "-" when it is missing or not a number (a field an
    older or newer server does not send must not crash a view)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return format(value, spec) + unit


def when(value: Any) -> str:
    """A time the API gives (ISO 8601 UTC, or Unix seconds as OpenAI's objects have them) as
    `YYYY-MM-DD HH:MM:SS UTC`: a date and the zone, whole seconds; "" when missing, anything
    unreadable as it came."""
    from datetime import datetime, timezone

    if value is None or value == "":
        return ""
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            t = datetime.fromtimestamp(value, timezone.utc)
        else:
            t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            t = t.astimezone(timezone.utc) if t.tzinfo else t.replace(tzinfo=timezone.utc)
    except (ValueError, OverflowError, OSError):
        return str(value)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # closed or replaced stdout
        return False


@dataclass(frozen=True)
class Column:
    """One column of `print_table`: its header, `right` for numbers; on a terminal, `fold` lets free
    text (a name, an error, a path) fold onto more lines when the table is too wide, up to `max_width`."""

    name: str
    right: bool = False
    fold: bool = False
    max_width: int | None = None


def print_table(columns: Sequence[Column | str], rows: Iterable[Sequence[Any]], *, terminal: bool | None = None,
                console=None) -> None:
    """A table on a terminal, tab-separated lines otherwise (see the module docstring). On a terminal
    nothing is cut: when the table is too wide the `fold` columns fold (down to 10 characters), and
    if it is still too wide its lines are longer than the terminal and the terminal wraps them."""
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    rows = [[safe(v) for v in row] for row in rows]
    terminal = stdout_is_terminal() if terminal is None else terminal
    if not terminal:
        for row in rows:
            typer.echo("\t".join(row))
        return
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    widths = [max([cell_len(c.name)] + [cell_len(r[i]) for r in rows if i < len(r)]) for i, c in enumerate(cols)]
    needed = sum(min(w, 10) if c.fold else w for c, w in zip(cols, widths)) + 2 * (len(cols) - 1)
    table = Table(box=None, pad_edge=False)
    for c in cols:
        table.add_column(Text(c.name), justify="right" if c.right else "left", no_wrap=not c.fold, overflow="fold",
                         max_width=c.max_width)
    for row in rows:
        table.add_row(*(Text(v) for v in row))
    console = console or Console()
    if console.width < needed:
        console.width = needed
    console.print(table)


def print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2))


def print_list(data: list) -> None:
    """`--json` of a local list (keys, models): `{"object": "list", "data": data}`."""
    print_json({"object": "list", "data": data})


def echo_data(text: str) -> None:
    """Exported data: unchanged into a pipe or a file (not through click.echo, which would strip
    escape sequences from it), with control characters escaped on a terminal."""
    if stdout_is_terminal():
        typer.echo(safe(text, lines=True), nl=False)
        return
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stdout (tests that replace it)
        sys.stdout.write(text)
    else:
        sys.stdout.flush()  # what was echoed before goes first
        out.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.flush()


__all__ = ["safe", "cell", "num", "when", "Column", "print_table", "print_json", "print_list", "echo_data", "stdout_is_terminal"]
