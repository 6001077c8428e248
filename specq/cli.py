"""The `specq` command line (typer). Each command group lives in its own section below."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="specq: long-prompt LLM jobs made fast (SpecPrefill scoring, sparse prefill, speculative decoding).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
