"""The `specq` command line (typer), one module per command group (as simonw/llm lays it out):

    run       specq run                        one job in this process
    run_batch specq run-batch -i in.jsonl -o out.jsonl   an OpenAI batch file in this process
    service   specq worker | reconcile | api | up | down
    logs      specq logs [api|worker] [-f]     the log of the service `specq up` runs
    submit    specq submit                     jobs and batches sent to the API
    jobs      specq status | result | jobs | cancel
    batches   specq batches | batch | results | stats | cancel-batch
    keys      specq keys …        db   specq db upgrade
    evidence  specq evidence [--json] | build   mode auto's quality evidence
    calibrate specq calibrate [--documents F.jsonl] [--service]  evidence rows for your own pair and documents
    calibrations specq calibrations [show ID | cancel ID]  calibrations run by the service's workers
    models    specq models …      bench specq bench …

The helpers they share: `common` (failures, reading FILE or stdin, settings, the HTTP client, waiting),
`output` (terminal-safe text, tables / tab-separated lines / JSON), `render` (a run result),
`logfiles` (where `specq up` writes its API's and worker's logs). Groups
import those, never each other."""

from __future__ import annotations

# the order of these imports is the order of `specq --help`
from . import run, run_batch, service, logs, submit, jobs, batches, keys, db, models, evidence, calibrate, calibrations, bench  # noqa: F401, I001  (they register their commands)
from .app import app


def main() -> None:  # pragma: no cover - console entry
    app()


__all__ = ["app", "main"]
