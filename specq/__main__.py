"""`python -m specq …` is the `specq` command (used by `specq up` to start its two processes)."""

from .cli import app

app(prog_name="specq")
