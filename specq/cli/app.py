"""The root `specq` command; each module of this package adds its group of commands to it.

Help is plain text (`rich_markup_mode=None`, inherited by every sub-command and group): nothing in a
docstring or a `help=` is read as rich markup, so `[env SPECQ_GPU]` is printed as written and no
command has to escape brackets. tests/test_cli.py checks every option's help of every command.

`--version` prints specq's version; `--install-completion` / `--show-completion` are typer's shell
completion (bash, zsh, fish, PowerShell)."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="specq: long-prompt LLM jobs made fast (SpecPrefill scoring, sparse prefill, speculative decoding).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"specq {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    url: str = typer.Option(None, "--url", metavar="URL", help="The specq API the commands talk to (default: SPECQ_API_URL, "
                            "else the URL the last `specq up` recorded in $SPECQ_HOME/up.url, else http://127.0.0.1:8178)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print specq's version and exit."),
) -> None:
    """specq: long-prompt LLM jobs made fast (SpecPrefill scoring, sparse prefill, speculative decoding).

    Options of every command are given before it: `specq --url http://host:8391 jobs`."""
    from .common import set_api_url

    set_api_url(url)
