"""The `specq` command line (typer). Each command group lives in its own section below."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="specq: long-prompt LLM jobs made fast (SpecPrefill scoring, sparse prefill, speculative decoding).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


# --------------------------------------------------------------------------- models: pull | list | verify

models_app = typer.Typer(help="The model registry: pull, list and verify GGUF files.", no_args_is_help=True)
app.add_typer(models_app, name="models")


def _models_fail(message: str) -> typer.Exit:
    """Print one line to stderr; the typer.Exit(1) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


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
        TextColumn("{task.description}"),
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

    from .engine import models as m
    from .engine.errors import EngineError

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
        raise _models_fail(str(e)) from None
    except KeyboardInterrupt:
        raise _models_fail("pull interrupted; run it again to resume") from None


@models_app.command("list")
def models_list() -> None:
    """The registry: name, role, size, whether each file is present and verified, and its path."""
    from rich.console import Console
    from rich.table import Table

    from .engine import models as m

    table = Table(box=None, pad_edge=False)
    for col in ("name", "role", "size", "status", "license", "path"):
        table.add_column(col, no_wrap=col != "path", overflow="fold")
    for name in m.registry_names():
        st = m.model_status(name)
        table.add_row(name, st.spec.role, f"{st.spec.size / 1e6:,.1f} MB", st.state, st.spec.license, str(st.path))
    Console().print(table)


@models_app.command("verify")
def models_verify(
    names: list[str] = typer.Argument(None, help="Registry names (default: the default target + speculator pair)."),
) -> None:
    """Re-hash model files against the registry sha256; exit 1 if any is missing or does not match."""
    from .engine import models as m
    from .engine.errors import EngineError

    try:
        specs = [m.get_spec(n) for n in (names or m.DEFAULT_PAIR)]
    except EngineError as e:
        raise _models_fail(str(e)) from None
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


# --------------------------------------------------------------------------- db: upgrade

db_app = typer.Typer(help="The job database (SPECQ_DATABASE_URL, default $SPECQ_HOME/specq.sqlite).", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(
    url: str = typer.Option(None, "--url", help="Database URL (default: SPECQ_DATABASE_URL or $SPECQ_HOME/specq.sqlite)."),
    revision: str = typer.Option("head", "--revision", help="Alembic revision to upgrade to."),
) -> None:
    """Create or migrate the database schema to the newest revision (Alembic); print the URL and revision."""
    from sqlalchemy.exc import SQLAlchemyError

    from .storage import db

    try:
        shown = db.masked_url(url)
    except Exception as e:  # noqa: BLE001 - a malformed URL: say so in one line
        typer.echo(f"error: bad database URL: {type(e).__name__}", err=True)
        raise typer.Exit(1) from None
    try:
        rev = db.upgrade(url, revision)
    except (SQLAlchemyError, RuntimeError) as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        password = db.normalize_url(url).password
        if password:
            reason = reason.replace(str(password), "***")
        typer.echo(f"error: upgrading {shown} failed: {reason}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"database: {shown}")
    typer.echo(f"revision: {rev} (head: {db.head_revision()})")


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
