"""The root `specq` command; each module of this package adds its group of commands to it."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="specq: long-prompt LLM jobs made fast (SpecPrefill scoring, sparse prefill, speculative decoding).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
