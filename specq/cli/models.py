"""`specq models pull | list | verify`: the model registry."""

from __future__ import annotations

import typer

from .app import app
from .common import fail
from .output import Column, print_list, print_table, stdout_is_terminal


models_app = typer.Typer(help="The model registry: pull, list and verify GGUF files.", no_args_is_help=True)
app.add_typer(models_app, name="models")


def _models_progress():
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    )


@models_app.command("pull")
def models_pull(
    names: list[str] = typer.Argument(None, help="Registry names (default: the default target + speculator pair)."),
    force: bool = typer.Option(False, "--force", help="Download again even if the file is present and verified."),
) -> None:
    """Download registry models into $SPECQ_HOME/models and verify their sha256."""
    import time

    from ..engine import models as m
    from ..contracts import EngineError

    try:
        specs = [m.get_spec(n) for n in (names or m.DEFAULT_PAIR)]
        for spec in specs:
            t0 = time.monotonic()
            if not force and m.model_status(spec).verified:
                typer.echo(f"{spec.name}: {m.model_path(spec)} (already present and verified)")
                continue
            with _models_progress() as bar:
                task = bar.add_task(spec.name, total=spec.size)
                path = m.pull_model(spec, force=force, progress=lambda done, total: bar.update(task, completed=done, total=total))
            typer.echo(f"{spec.name}: {path} (verified, {time.monotonic() - t0:.1f}s)")
    except EngineError as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:
        raise fail("pull interrupted; run it again to resume") from None


@models_app.command("list")
def models_list(
    as_json: bool = typer.Option(False, "--json", help="Print {object: list, data: [models]} as JSON."),
) -> None:
    """The registry: name, role, size, whether each file is present and verified, and its path.

    Piped (stdout not a terminal): one tab-separated line per model in that order (size in bytes), no header.
    """
    from ..engine import models as m

    states = [m.model_status(name) for name in m.registry_names()]
    if as_json:
        print_list([{"name": st.spec.name, "role": st.spec.role, "size_bytes": st.spec.size, "status": st.state,
                     "license": st.spec.license, "sha256": st.spec.sha256, "path": str(st.path)} for st in states])
        return
    terminal = stdout_is_terminal()
    print_table(["name", "role", Column("size", right=True), "status", "license", Column("path", fold=True)],
                [(st.spec.name, st.spec.role, f"{st.spec.size / 1e6:,.1f} MB" if terminal else st.spec.size, st.state,
                  st.spec.license, str(st.path)) for st in states], terminal=terminal)


@models_app.command("verify")
def models_verify(
    names: list[str] = typer.Argument(None, help="Registry names (default: the default target + speculator pair)."),
) -> None:
    """Re-hash model files against the registry sha256; exit 1 if any is missing or does not match."""
    from ..engine import models as m
    from ..contracts import EngineError

    try:
        specs = [m.get_spec(n) for n in (names or m.DEFAULT_PAIR)]
    except EngineError as e:
        raise fail(str(e)) from None
    failures = 0
    for spec in specs:
        try:
            with _models_progress() as bar:
                task = bar.add_task(f"hashing {spec.name}", total=spec.size)
                path = m.verify_model(spec, progress=lambda done, total: bar.update(task, completed=done, total=total))
            typer.echo(f"{spec.name}: ok ({path})")
        except EngineError as e:
            typer.echo(f"error: {e}", err=True)
            failures += 1
    if failures:
        raise typer.Exit(1)

