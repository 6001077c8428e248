"""`python -m specq.cli …` is the `specq` command too."""

from . import app

app(prog_name="specq")
