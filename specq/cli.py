"""The `specq` command line (typer). Each command group lives in its own section below."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help="specq: long-prompt LLM jobs made fast (SpecPrefill scoring, sparse prefill, speculative decoding).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


# --------------------------------------------------------------------------- run: one job, in process


def _fail(message: str) -> typer.Exit:
    """Print one line to stderr; return the typer.Exit(1) to raise (no traceback for users)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def read_document(path: Path) -> str:
    """A document file as text, or an InputError with a one-line reason."""
    from .engine.errors import InputError
    from .engine.inputs import decode_document

    if not path.exists():
        raise InputError(f"file not found: {path}")
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a file")
    return decode_document(path.read_bytes(), name=str(path))


@app.command("run")
def run_cmd(
    file: Path = typer.Argument(..., help="A long document or code file (UTF-8 text)."),
    question: str = typer.Option("", "-q", "--question", help="The question asked about FILE."),
    mode: str = typer.Option("baseline", help="baseline (prefill every token) or specprefill (score, keep the top chunks)."),
    positions: str = typer.Option("original", help="original (kept tokens keep their position ids) or compressed."),
    keep: float = typer.Option(0.3, help="Fraction of the document's chunks kept by specprefill."),
    scorer: str = typer.Option("windowed", help="windowed, sliding or full."),
    lookahead: int = typer.Option(8, help="Lookahead query rows for scoring."),
    chunk: int = typer.Option(32, help="Tokens per selection chunk."),
    max_keep: int = typer.Option(0, help="Cap on kept document tokens (0 = none)."),
    min_tokens: int = typer.Option(-1, help="Shorter prompts run baseline (-1 = engine default)."),
    pool: int = typer.Option(13, help="Average-pool kernel over scores (odd)."),
    window: int = typer.Option(0, help="Document tokens per scoring window (0 = auto)."),
    max_tokens: int = typer.Option(256, help="Tokens to generate at most."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_k: int = typer.Option(0, help="0 = off."),
    top_p: float = typer.Option(1.0, help="1 = off."),
    seed: int = typer.Option(-1, help="Sampling seed (-1 = random)."),
    draft: str = typer.Option("none", help="Speculative decoding drafter: none, ngram, model or auto."),
    n_draft: int = typer.Option(4, help="Tokens drafted per verification batch."),
    draft_min: int = typer.Option(1, help="Skip drafts shorter than this."),
    p_min: float = typer.Option(0.0, help="Model drafts stop below this top probability (0 = off)."),
    ngram: int = typer.Option(2, help="N-gram size for the ngram drafter."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator/drafter model: registry name or GGUF path."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    n_ctx: int = typer.Option(0, help="Target context size (0 = model's, capped at 32768)."),
    flash_attn: bool = typer.Option(True, "--flash-attn/--no-flash-attn", help="Flash attention."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    batch_invariant: str = typer.Option("auto", help="Batch-invariant target numerics (greedy output identical with every drafter): auto (on for a CPU target), on, off."),
    as_json: bool = typer.Option(False, "--json", help="Print the run result object as JSON."),
) -> None:
    """Answer QUESTION about FILE in this process (no service needed) and print the phase timings."""
    import json

    from .engine.errors import EngineError
    from .engine.options import EngineOptions, RunParams

    try:
        params = RunParams.from_dict(
            dict(question=question, mode=mode, positions=positions, keep=keep, scorer=scorer, lookahead=lookahead,
                 chunk=chunk, max_keep=max_keep, min_tokens=min_tokens, pool=pool, window=window, max_tokens=max_tokens,
                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft=draft, n_draft=n_draft,
                 draft_min=draft_min, p_min=p_min, ngram=ngram)
        )
        document = read_document(file)
        if batch_invariant not in ("auto", "on", "off"):
            raise _fail(f"--batch-invariant must be auto, on or off, not {batch_invariant!r}")
        opts = EngineOptions(n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, flash_attn=flash_attn, n_threads=threads,
                             batch_invariant=batch_invariant)
        if target:
            opts.target = target
        if speculator:
            opts.speculator = speculator
        from .engine.pipeline import Engine

        engine = Engine(opts)
        result = engine.run(document, params).to_dict()
    except EngineError as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted") from None
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        from .render import print_result

        print_result(result)


# --------------------------------------------------------------------------- models: pull | list | verify

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
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("pull interrupted; run it again to resume") from None


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
        raise _fail(str(e)) from None
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


# --------------------------------------------------------------------------- keys: create | list | revoke

keys_app = typer.Typer(
    help="API keys, stored hashed in the job database (SPECQ_DATABASE_URL). The API checks them when it "
         "runs with SPECQ_AUTH=keys; each key sees only its tenant's jobs and batches, admin keys see all.",
    no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Option(..., "--tenant", help="The tenant the key acts for (letters, digits, . _ -)."),
    admin: bool = typer.Option(False, "--admin", help="May read every tenant's jobs and batches, and /metrics."),
    name: str = typer.Option(None, "--name", help="A note shown by `specq keys list`."),
) -> None:
    """Make a key and print it once (only its hash is kept): clients send it as `Authorization: Bearer KEY`,
    the CLI reads it from SPECQ_API_KEY."""
    from .storage import db, keys

    _service_ready_db(upgrade=db.is_sqlite())
    try:
        with db.session() as s:
            row, secret = keys.create_key(s, tenant, admin=admin, name=name)
    except ValueError as e:
        raise _fail(str(e)) from None
    typer.echo(secret)
    typer.echo(f"{row.id}: {'admin ' if admin else ''}key of tenant {tenant}, shown once (only its hash is stored); "
               "the CLI sends it from SPECQ_API_KEY", err=True)


@keys_app.command("list")
def keys_list(
    tenant: str = typer.Option(None, "--tenant", help="Only this tenant's keys."),
    revoked: bool = typer.Option(False, "--revoked", help="Also show revoked keys."),
) -> None:
    """The keys: id, tenant, admin, the key's first characters, created, revoked."""
    from rich.console import Console
    from rich.table import Table

    from .storage import db, keys

    _service_ready_db(upgrade=db.is_sqlite())
    with db.session() as s:
        rows = keys.list_keys(s, tenant=tenant, include_revoked=revoked)
    table = Table(box=None)
    for col in ("id", "tenant", "admin", "key", "name", "created", "revoked"):
        table.add_column(col)
    for r in rows:
        d = r.to_dict()
        table.add_row(d["id"], d["tenant"], "yes" if d["admin"] else "", d["prefix"] + "…", d["name"] or "",
                      d["created_at"], d["revoked_at"] or "")
    Console().print(table)


@keys_app.command("revoke")
def keys_revoke(ref: str = typer.Argument(..., help="The key's id (key_…) or its first characters as listed.")) -> None:
    """Revoke a key: the API refuses it (401) from its next request on."""
    from .storage import db, keys

    _service_ready_db(upgrade=db.is_sqlite())
    try:
        with db.session() as s:
            row = keys.revoke_key(s, ref.rstrip("…"))
    except ValueError as e:
        raise _fail(str(e)) from None
    if row is None:
        raise _fail(f"no key {ref}")
    typer.echo(f"{row.id} ({row.prefix}…, tenant {row.tenant}) revoked at {row.to_dict()['revoked_at']}")


# --------------------------------------------------------------------------- service: up | api | worker



def _service_settings(**overrides):
    from .settings import ServiceSettings, SettingsError

    try:
        return ServiceSettings.from_env(**overrides)
    except SettingsError as e:
        raise _fail(str(e)) from None


def _service_ready_db(upgrade: bool) -> None:
    """Migrate (`upgrade`) or check the job store's schema; one-line errors."""
    from .storage import db
    from .storage.ready import SchemaNotReady, ensure_schema

    try:
        if upgrade:
            db.upgrade()
        else:
            ensure_schema()
    except SchemaNotReady as e:
        raise _fail(str(e)) from None
    except Exception as e:  # unreachable server, bad URL
        raise _fail(f"database {db.masked_url()}: {str(e).splitlines()[0]}") from None


@app.command("worker")
def worker_cmd(
    gpu: str = typer.Option(None, help="GPU index to run on (sets CUDA_VISIBLE_DEVICES). [env SPECQ_GPU]"),
    queue: str = typer.Option(None, "--queue", "-Q", help="Queue to consume (default specq). [env SPECQ_QUEUE]"),
    concurrency: int = typer.Option(None, help="Processes, each with its own models (default 1 = one job at a time). [env SPECQ_CONCURRENCY]"),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path. [env SPECQ_TARGET]"),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path. [env SPECQ_SPECULATOR]"),
    n_gpu_layers: int = typer.Option(None, help="Layers offloaded to the GPU (-1 = all). [env SPECQ_N_GPU_LAYERS]"),
    n_ctx: int = typer.Option(None, help="Target context size (0 = model's, capped at 32768). [env SPECQ_N_CTX]"),
    threads: int = typer.Option(None, help="CPU threads (0 = all cores). [env SPECQ_THREADS]"),
    flash_attn: bool = typer.Option(None, "--flash-attn/--no-flash-attn", help="Flash attention. [env SPECQ_FLASH_ATTN]"),
    warm_up: bool = typer.Option(None, "--warm-up/--no-warm-up", help="Run one tiny job after loading. [env SPECQ_WARM_UP]"),
    loglevel: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Run a worker: load the models once on one GPU, then run jobs from the queue one at a time."""
    from .engine.errors import EngineError

    settings = _service_settings(gpu=gpu, queue=queue, concurrency=concurrency, target=target, speculator=speculator,
                                 n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, threads=threads, flash_attn=flash_attn,
                                 warm_up=warm_up)
    _service_ready_db(upgrade=False)
    from .worker.main import run_worker

    try:
        run_worker(settings, loglevel=loglevel)
    except EngineError as e:
        raise _fail(f"worker could not load its models: {e}") from None


@app.command("reconcile")
def reconcile_cmd(
    republish_queued: bool = typer.Option(False, "--republish-queued", help="Also send every queued job to the broker again (after a broker lost its messages, e.g. Redis restarted without persistence); duplicates do nothing."),
) -> None:
    """Requeue (or fail, after max attempts) jobs left running by workers that stopped heartbeating
    for SPECQ_STALE_AFTER seconds, once. Every worker also does this every SPECQ_RECONCILE_INTERVAL seconds."""
    from .reconciler import reconcile_once, republish_queued as republish

    settings = _service_settings()
    _service_ready_db(upgrade=False)
    try:
        sweep = reconcile_once(settings)
        if republish_queued:
            sweep.republished = republish(settings).republished
    except Exception as e:  # unreachable store or broker: one line
        raise _fail(f"reconcile: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    for name in ("requeued", "failed", "cancelled", "unsent"):
        for job_id in getattr(sweep, name):
            typer.echo(f"{job_id}\t{name}")
    typer.echo(f"reconcile: {sweep.summary()} (stale after {settings.stale_after:g}s)", err=True)


@app.command("api")
def api_cmd(
    host: str = typer.Option(None, help="Address to listen on (default 127.0.0.1). [env SPECQ_API_HOST]"),
    port: int = typer.Option(None, help="Port (default 8178). [env SPECQ_API_PORT]"),
    loglevel: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """Run the REST API (no models are loaded here; jobs go to the broker for `specq worker`)."""
    import uvicorn

    settings = _service_settings(api_host=host, api_port=port)
    _service_ready_db(upgrade=False)
    if settings.auth == "none" and settings.api_host not in ("127.0.0.1", "localhost", "::1"):
        typer.echo(f"specq api: warning: no API keys (SPECQ_AUTH=none) on {settings.api_host}: anyone who reaches "
                   "this port sees every job; set SPECQ_AUTH=keys (docs/security.md)", err=True)
    from .api.app import create_app

    uvicorn.run(create_app(settings), host=settings.api_host, port=settings.api_port, log_level=loglevel.lower(),
                access_log=loglevel.lower() == "debug")


@app.command("up")
def up_cmd(
    host: str = typer.Option(None, help="API address (default 127.0.0.1). [env SPECQ_API_HOST]"),
    port: int = typer.Option(None, help="API port (default 8178). [env SPECQ_API_PORT]"),
    gpu: str = typer.Option(None, help="GPU index for the worker. [env SPECQ_GPU]"),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path. [env SPECQ_TARGET]"),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path. [env SPECQ_SPECULATOR]"),
    n_gpu_layers: int = typer.Option(None, help="Layers offloaded to the GPU (-1 = all). [env SPECQ_N_GPU_LAYERS]"),
    n_ctx: int = typer.Option(None, help="Target context size. [env SPECQ_N_CTX]"),
    loglevel: str = typer.Option("INFO", help="Worker log level."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start in the background (log: $SPECQ_HOME/up.log), return once the API answers; stop with `specq down`."),
) -> None:
    """The whole service on this machine, in the foreground: migrations, then the API and one worker.

    With nothing set it needs no servers: the job store is SQLite and the broker is kombu's SQLAlchemy
    transport, both files under $SPECQ_HOME. SPECQ_DATABASE_URL / SPECQ_BROKER_URL select PostgreSQL / Redis.
    """
    import os
    import signal
    import subprocess
    import sys
    import time

    from .storage import db

    settings = _service_settings(api_host=host, api_port=port, gpu=gpu, target=target, speculator=speculator,
                                 n_gpu_layers=n_gpu_layers, n_ctx=n_ctx)
    if detach:
        _up_detached(settings, sys.argv[1:])
        return
    _service_ready_db(upgrade=True)
    env = dict(os.environ)
    for name in ("api_host", "api_port", "gpu", "target", "speculator", "n_gpu_layers", "n_ctx"):
        value = getattr(settings, name)
        if value not in (None, ""):
            env[f"SPECQ_{name.upper()}"] = str(value)
    typer.echo(f"specq up: database {db.masked_url()}", err=True)
    typer.echo(f"specq up: broker {'embedded ' + settings.resolved_broker_url if settings.embedded_broker else 'redis'}"
               f", queue {settings.queue}", err=True)
    typer.echo(f"specq up: API at {settings.api_url} (docs {settings.api_url}/docs); submit with "
               f"`specq submit FILE -q QUESTION --wait`", err=True)
    cmd = [sys.executable, "-m", "specq"]
    procs = {
        "api": subprocess.Popen(cmd + ["api", "--loglevel", "warning"], env=env),
        "worker": subprocess.Popen(cmd + ["worker", "--loglevel", loglevel], env=env),
    }

    stopping: set[str] = set()

    def _stop(*_args) -> None:
        for name, p in procs.items():
            if p.poll() is None and name not in stopping:
                stopping.add(name)
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, _stop)
    code = 0
    try:
        while True:
            for name, p in procs.items():
                rc = p.poll()
                if rc is not None:
                    if rc not in (0, -signal.SIGTERM, -signal.SIGINT):
                        typer.echo(f"specq up: the {name} exited with status {rc}; stopping", err=True)
                        code = 1
                    raise StopIteration
            time.sleep(0.2)
    except (StopIteration, KeyboardInterrupt):
        pass
    _stop()
    deadline = time.monotonic() + 30
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    raise typer.Exit(code)


def _up_pidfile() -> Path:
    from .config import specq_home

    return specq_home() / "up.pid"


def _up_detached(settings, argv: list[str]) -> None:
    """Run `specq up` (without --detach) in a new session, logging to $SPECQ_HOME/up.log; wait for /healthz."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    from .config import specq_home

    pidfile = _up_pidfile()
    if pidfile.exists():
        try:
            old = int(pidfile.read_text().strip())
            os.kill(old, 0)
            typer.echo(f"specq up: already running (pid {old}); `specq down` stops it", err=True)
            return
        except (ValueError, ProcessLookupError, PermissionError):
            pidfile.unlink(missing_ok=True)
    home = specq_home()
    home.mkdir(parents=True, exist_ok=True)
    log = home / "up.log"
    args = [a for a in argv if a not in ("--detach", "-d")]
    if "up" not in args:
        args = ["up"] + args
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "specq", *args], stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    pidfile.write_text(str(proc.pid))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pidfile.unlink(missing_ok=True)
            raise _fail(f"specq up exited with status {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(settings.api_url + "/healthz", timeout=2) as r:
                if r.status == 200:
                    typer.echo(f"specq up: running in the background (pid {proc.pid}), API at {settings.api_url}, log {log}; "
                               "`specq down` stops it", err=True)
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise _fail(f"specq up did not answer at {settings.api_url}/healthz within 120 s; see {log}")


@app.command("down")
def down_cmd() -> None:
    """Stop a service started with `specq up --detach` (waits for the running job's phase to end, up to 60 s)."""
    import os
    import signal
    import time

    pidfile = _up_pidfile()
    if not pidfile.exists():
        typer.echo("specq down: nothing started with `specq up --detach`", err=True)
        return
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (ValueError, ProcessLookupError):
        pidfile.unlink(missing_ok=True)
        typer.echo("specq down: it had already stopped", err=True)
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    typer.echo(f"specq down: stopped (pid {pid})", err=True)


# --------------------------------------------------------------------------- jobs over HTTP: submit | status | result | jobs | cancel


def _client():
    from .client import Client

    return Client()


def _api_call(fn):
    """Run fn(client); ApiError -> one line on stderr, exit 1."""
    from .client import ApiError

    try:
        with _client() as c:
            return fn(c)
    except ApiError as e:
        raise _fail(str(e)) from None


def _print_job(job: dict) -> None:
    from .client import progress_text

    lines = [f"{job['id']}  {job['status']}"]
    if job["status"] == "running":
        lines.append(f"  progress   {progress_text(job)}")
    lines.append(f"  attempts   {job.get('attempts')}/{job.get('max_attempts')}")
    for key in ("created_at", "started_at", "finished_at"):
        if job.get(key):
            lines.append(f"  {key[:-3]:<10} {job[key]}")
    if job.get("queue_wait_ms") is not None:
        lines.append(f"  queue wait {job['queue_wait_ms']:.0f} ms")
    inp = job.get("input") or {}
    if inp:
        lines.append(f"  input      {inp.get('filename') or '-'} ({inp.get('size_bytes')} bytes)")
    if job.get("error"):
        lines.append(f"  error      {job['error']}")
    result = job.get("result")
    if result:
        total = (result.get("timings_ms") or {}).get("total")
        lines.append(f"  result     {len(result.get('text', ''))} chars, {total:,.0f} ms total (`specq result {job['id']}`)")
    typer.echo("\n".join(lines))


def _wait_with_progress(client, job_id: str) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .client import progress_text

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"{job_id} queued", total=None)

        def update(job: dict) -> None:
            p = job.get("progress") or {}
            total = p.get("total") or 0
            bar.update(task, description=f"{job_id} {progress_text(job)}", completed=p.get("done") or 0,
                       total=total if total > 1 else None)

        return client.wait(job_id, on_update=update)


def _finish_job(job: dict, as_json: bool) -> None:
    """Print a finished job's result (or fail with its error)."""
    import json

    if job["status"] == "succeeded":
        if as_json:
            typer.echo(json.dumps(job["result"], indent=2))
        else:
            from .render import print_result

            print_result(job["result"])
        return
    if job["status"] == "failed":
        raise _fail(f"job {job['id']} failed: {job.get('error') or 'no message'}")
    if job["status"] == "cancelled":
        raise _fail(f"job {job['id']} was cancelled")
    from .client import progress_text

    raise _fail(f"job {job['id']} is {progress_text(job)}: no result yet (wait with `specq status {job['id']}`)")


@app.command("submit")
def submit_cmd(
    files: list[Path] = typer.Argument(None, help="Documents or code files (UTF-8 text); several make a batch."),
    question: str = typer.Option(None, "-q", "--question", help="The question asked about FILE."),
    jsonl: Path = typer.Option(None, "--jsonl", help="A batch as JSONL: one {custom_id, text, question, params} per line."),
    batch_name: str = typer.Option(None, "--batch", help="Submit as a batch with this name (`specq results NAME`)."),
    mode: str = typer.Option(None, help="baseline or specprefill."),
    positions: str = typer.Option(None, help="original or compressed."),
    keep: float = typer.Option(None, help="Fraction of the document's chunks kept by specprefill."),
    scorer: str = typer.Option(None, help="windowed, sliding or full."),
    lookahead: int = typer.Option(None, help="Lookahead query rows for scoring."),
    chunk: int = typer.Option(None, help="Tokens per selection chunk."),
    max_keep: int = typer.Option(None, help="Cap on kept document tokens (0 = none)."),
    min_tokens: int = typer.Option(None, help="Shorter prompts run baseline (-1 = engine default)."),
    pool: int = typer.Option(None, help="Average-pool kernel over scores (odd)."),
    window: int = typer.Option(None, help="Document tokens per scoring window (0 = auto)."),
    max_tokens: int = typer.Option(None, help="Tokens to generate at most."),
    temperature: float = typer.Option(None, help="0 = greedy."),
    top_k: int = typer.Option(None, help="0 = off."),
    top_p: float = typer.Option(None, help="1 = off."),
    seed: int = typer.Option(None, help="Sampling seed (-1 = random)."),
    draft: str = typer.Option(None, help="Speculative decoding drafter: none, ngram, model or auto."),
    n_draft: int = typer.Option(None, help="Tokens drafted per verification batch."),
    draft_min: int = typer.Option(None, help="Skip drafts shorter than this."),
    p_min: float = typer.Option(None, help="Model drafts stop below this top probability (0 = off)."),
    ngram: int = typer.Option(None, help="N-gram size for the ngram drafter."),
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait for the answer with a progress bar, then print it."),
    as_json: bool = typer.Option(False, "--json", help="With --wait: print the run result object as JSON."),
) -> None:
    """Submit FILE + QUESTION as a job to the specq API (SPECQ_API_URL); print its id, or with --wait its answer.

    Several FILEs, --jsonl or --batch submit a batch (one job per file or line): its id is printed;
    --wait shows the batch's progress; then `specq results BATCH --format csv`.

    Options not given take the server's defaults (those of `specq run`). Model options (target, speculator,
    GPU layers, context) belong to the worker: `specq worker --help`.
    """
    from .engine.errors import InputError

    given = dict(mode=mode, positions=positions, keep=keep, scorer=scorer, lookahead=lookahead, chunk=chunk,
                 max_keep=max_keep, min_tokens=min_tokens, pool=pool, window=window, max_tokens=max_tokens,
                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft=draft, n_draft=n_draft,
                 draft_min=draft_min, p_min=p_min, ngram=ngram)
    params = {k: v for k, v in given.items() if v is not None}
    files = list(files or [])
    if jsonl is not None or batch_name is not None or len(files) > 1:
        return _submit_batch(files, jsonl, question, params, batch_name, wait)  # the batches section below
    if not files:
        raise _fail("give a FILE to submit (or several, or --jsonl FILE for a batch)")
    file = files[0]
    try:  # the server's checks, before uploading
        read_document(file)
    except InputError as e:
        raise _fail(str(e)) from None

    def go(c):
        job = c.submit_file(file, question=question, params=params)
        if not wait:
            typer.echo(job["id"])
            typer.echo(f"queued: `specq status {job['id']}` or `specq result {job['id']}`", err=True)
            return
        try:
            done = _wait_with_progress(c, job["id"])
        except KeyboardInterrupt:
            raise _fail(f"stopped waiting; job {job['id']} keeps running (`specq status {job['id']}`)") from None
        _finish_job(done, as_json)

    _api_call(go)


@app.command("status")
def status_cmd(
    job_id: str = typer.Argument(..., help="A job id (job_…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the job object as JSON."),
) -> None:
    """A job's status, progress, attempts and error."""
    import json

    job = _api_call(lambda c: c.job(job_id))
    if as_json:
        typer.echo(json.dumps(job, indent=2))
    else:
        _print_job(job)


@app.command("result")
def result_cmd(
    job_id: str = typer.Argument(..., help="A job id (job_…)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run result object as JSON."),
) -> None:
    """A finished job's answer and phase table (exit 1 if it failed, was cancelled or is not done)."""
    job = _api_call(lambda c: c.job(job_id))
    _finish_job(job, as_json)


@app.command("jobs")
def jobs_cmd(
    status: str = typer.Option(None, help="Only these statuses (comma-separated): queued, running, succeeded, failed, cancelled."),
    limit: int = typer.Option(20, help="How many, newest first."),
) -> None:
    """Recent jobs with their status and progress."""
    from rich.console import Console
    from rich.table import Table

    from .client import progress_text

    page = _api_call(lambda c: c.jobs(status=status, limit=limit))
    table = Table(box=None, pad_edge=False)
    for col in ("id", "status", "progress", "created (UTC)", "queue wait"):
        table.add_column(col, no_wrap=True)
    table.add_column("error", overflow="fold")
    for j in page["data"]:
        wait = f"{j['queue_wait_ms']:.0f} ms" if j.get("queue_wait_ms") is not None else "-"
        created = (j.get("created_at") or "").replace("T", " ")[:19]
        table.add_row(j["id"], j["status"], progress_text(j) if j["status"] == "running" else "", created,
                      wait, (j.get("error") or "")[:120])
    Console().print(table)
    typer.echo(f"{len(page['data'])} of {page['total']} jobs", err=True)


@app.command("cancel")
def cancel_cmd(job_id: str = typer.Argument(..., help="A job id (job_…).")) -> None:
    """Cancel a queued job now, or a running job at its next phase, window or token."""
    job = _api_call(lambda c: c.cancel(job_id))
    state = "cancelled" if job["status"] == "cancelled" else "cancel requested (it stops at its next step)"
    typer.echo(f"{job_id}: {state}")


# --------------------------------------------------------------------------- batches over HTTP: submit FILE… | batches | results | stats | cancel-batch


def _submit_batch(files: list, jsonl, question, params: dict, name, wait: bool) -> None:
    """`specq submit` with several files, --jsonl or --batch: one batch; prints its id."""
    from .engine.errors import InputError

    if jsonl is not None and files:
        raise _fail("give either FILEs or --jsonl FILE, not both")
    if jsonl is None and not files:
        raise _fail("give the FILEs of the batch, or --jsonl FILE")
    try:  # the server's checks, before uploading
        if jsonl is not None and not jsonl.is_file():
            raise InputError(f"file not found: {jsonl}" if not jsonl.exists() else f"{jsonl} is not a file")
        for f in files:
            read_document(f)
    except InputError as e:
        raise _fail(str(e)) from None
    metadata = {"name": name} if name else None

    def go(c):
        if jsonl is not None:
            batch = c.submit_batch_jsonl(jsonl, params=params, question=question, metadata=metadata)
        else:
            batch = c.submit_batch_files(files, question=question, params=params, metadata=metadata)
        if batch["status"] == "failed":
            _batch_fail(batch)
        typer.echo(batch["id"])
        total = batch["request_counts"]["total"]
        if not wait:
            typer.echo(f"{total} requests queued: `specq batches`, `specq results {batch['id']}`", err=True)
            return
        try:
            done = _wait_batch_with_progress(c, batch)
        except KeyboardInterrupt:
            raise _fail(f"stopped waiting; batch {batch['id']} keeps running (`specq batches`)") from None
        counts = done["request_counts"]
        typer.echo(f"batch {done['id']} {done['status']}: {counts['completed']}/{counts['total']} completed, "
                   f"{counts['failed']} failed; `specq results {done['id']} --format csv`", err=True)
        if done["status"] != "completed" or counts["failed"]:
            raise typer.Exit(1)

    _api_call(go)


def _batch_fail(batch: dict) -> None:
    errors = (batch.get("errors") or {}).get("data") or []
    for e in errors[:20]:
        typer.echo(f"error: {e.get('message')}", err=True)
    if len(errors) > 20:
        typer.echo(f"error: … and {len(errors) - 20} more", err=True)
    raise _fail(f"batch {batch['id']} failed validation: nothing was queued")


def _wait_batch_with_progress(client, batch: dict) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"{batch['id']} {batch['status']}", total=batch["request_counts"]["total"] or None)

        def update(b: dict) -> None:
            c = b["request_counts"]
            failed = f", {c['failed']} failed" if c["failed"] else ""
            bar.update(task, description=f"{b['id']} {b['status']}{failed}", completed=c["completed"] + c["failed"],
                       total=c["total"] or None)

        return client.wait_batch(batch["id"], on_update=update)


@app.command("batches")
def batches_cmd(
    status: str = typer.Option(None, help="Only these statuses (comma-separated): in_progress, completed, failed, cancelled, …"),
    limit: int = typer.Option(20, help="How many, newest first."),
) -> None:
    """Recent batches with their status and request counts."""
    from rich.console import Console
    from rich.table import Table

    page = _api_call(lambda c: c.batches(status=status, limit=limit))
    table = Table(box=None, pad_edge=False)
    for col in ("id", "name", "status", "done", "failed", "total", "created (UTC)"):
        table.add_column(col, no_wrap=True)
    for b in page["data"]:
        c = b["request_counts"]
        table.add_row(b["id"], str((b.get("metadata") or {}).get("name") or ""), b["status"], str(c["completed"]),
                      str(c["failed"]), str(c["total"]), (b.get("created_at") or "").replace("T", " ")[:19])
    Console().print(table)


@app.command("results")
def results_cmd(
    batch: str = typer.Argument(..., help="A batch id (batch_…) or the name given with `submit --batch NAME`."),
    fmt: str = typer.Option("table", "--format", "-f", help="jsonl (run result objects), csv (usage and phase timings as columns) or table."),
    errors: bool = typer.Option(False, "--errors", help="The failed and cancelled requests instead (JSONL)."),
) -> None:
    """The answers of a batch's finished requests, one per request in submission order."""
    if fmt not in ("jsonl", "csv", "table"):
        raise _fail(f"--format must be jsonl, csv or table, not {fmt!r}")

    def go(c):
        b = c.resolve_batch(batch)
        if errors:
            return b, c.batch_export(b["id"], "errors"), None
        return b, c.batch_export(b["id"], "results", "csv" if fmt == "csv" else "jsonl"), None

    b, text, _ = _api_call(go)
    if errors or fmt in ("jsonl", "csv"):
        typer.echo(text, nl=False)
    else:
        _print_results_table(text)
    c = b["request_counts"]
    if b["status"] not in ("completed", "failed", "cancelled", "expired"):
        typer.echo(f"batch {b['id']} is {b['status']}: {c['completed']}/{c['total']} completed so far", err=True)
    elif c["failed"] and not errors:
        typer.echo(f"{c['failed']} request(s) failed or were cancelled: `specq results {b['id']} --errors`", err=True)


def _print_results_table(text: str) -> None:
    import json

    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col, kw in (("custom_id", {"no_wrap": True}), ("answer", {"overflow": "fold", "max_width": 60}),
                    ("prompt", {"justify": "right"}), ("kept", {"justify": "right"}), ("ttft ms", {"justify": "right"}),
                    ("decode ms", {"justify": "right"}), ("total ms", {"justify": "right"})):
        table.add_column(col, **kw)
    for line in text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        r = row["result"]
        t, u = r.get("timings_ms") or {}, r.get("usage") or {}
        answer = " ".join((r.get("text") or "").split())
        table.add_row(str(row["custom_id"]), answer[:200], str(u.get("prompt_tokens")), str(u.get("kept_tokens")),
                      f"{t.get('ttft', 0):,.1f}", f"{t.get('decode', 0):,.1f}", f"{t.get('total', 0):,.1f}")
    Console().print(table)


@app.command("stats")
def stats_cmd(
    batch: str = typer.Argument(..., help="A batch id (batch_…) or the name given with `submit --batch NAME`."),
    as_json: bool = typer.Option(False, "--json", help="Print the stats object as JSON."),
) -> None:
    """Per-phase p50/p95 of a batch's finished requests, mean kept ratio and throughput (computed in SQL)."""
    import json

    from rich.console import Console
    from rich.table import Table

    st = _api_call(lambda c: c.batch_stats(c.resolve_batch(batch)["id"]))
    if as_json:
        typer.echo(json.dumps(st, indent=2))
        return
    c = st["request_counts"]
    typer.echo(f"{st['batch_id']}  {st['status']}  {c['completed']}/{c['total']} completed, {c['failed']} failed")
    if st.get("kept_ratio_mean") is not None:
        typer.echo(f"  kept ratio (mean)   {st['kept_ratio_mean']:.3f}   prompt tokens (mean) {st['prompt_tokens_mean']:.1f}")
    if st.get("wall_s"):
        typer.echo(f"  wall                {st['wall_s']:.1f} s   throughput {st['jobs_per_s']:.2f} jobs/s")
    table = Table(box=None, pad_edge=False)
    for col in ("phase", "count", "p50 ms", "p95 ms", "mean ms", "max ms"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for phase, p in st["phases"].items():
        table.add_row(phase, str(p["count"]), f"{p['p50']:,.1f}", f"{p['p95']:,.1f}", f"{p['mean']:,.1f}", f"{p['max']:,.1f}")
    Console().print(table)


@app.command("cancel-batch")
def cancel_batch_cmd(batch: str = typer.Argument(..., help="A batch id (batch_…) or name.")) -> None:
    """Cancel a batch: queued requests at once, running ones at their next step; finished results stay."""
    b = _api_call(lambda c: c.cancel_batch(c.resolve_batch(batch)["id"]))
    c = b["request_counts"]
    typer.echo(f"{b['id']}: {b['status']} ({c['completed']} completed results kept)")


# --------------------------------------------------------------------------- bench: decode

bench_app = typer.Typer(help="Benchmarks on this machine (not timed tests).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("decode")
def bench_decode(
    methods: str = typer.Option("none,ngram,model", help="Comma-separated drafters to compare (none first)."),
    jobs: str = typer.Option("rename,quote,explain", help="Comma-separated jobs: rename, quote (copy-heavy), explain (free-form)."),
    max_tokens: int = typer.Option(128, help="Tokens to generate per run."),
    n_draft: int = typer.Option(4, help="Tokens drafted per verification batch."),
    draft_min: int = typer.Option(1, help="Skip drafts shorter than this."),
    p_min: float = typer.Option(0.0, help="Model drafts stop below this top probability (0 = off)."),
    ngram: int = typer.Option(2, help="N-gram size for the ngram drafter."),
    repeat: int = typer.Option(1, help="Runs per job and method (the median decode time counts)."),
    mode: str = typer.Option("baseline", help="Prefill mode: baseline or specprefill."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator/drafter model: registry name or GGUF path."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    batch_invariant: str = typer.Option("auto", help="Batch-invariant target numerics: auto (on for a CPU target), on, off."),
    repack: bool = typer.Option(True, "--repack/--no-repack", help="CPU weight repacking for the target (with --batch-invariant off)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """Decode tokens/s for none / ngram / model drafting, side by side, on copy-heavy and free-form jobs."""
    import json

    from .bench_decode import default_jobs, run_bench
    from .engine.errors import EngineError
    from .engine.options import EngineOptions

    if batch_invariant not in ("auto", "on", "off"):
        raise _fail(f"--batch-invariant must be auto, on or off, not {batch_invariant!r}")
    opts = EngineOptions(n_gpu_layers=n_gpu_layers, n_threads=threads, repack=repack, batch_invariant=batch_invariant)
    if target:
        opts.target = target
    if speculator:
        opts.speculator = speculator
    wanted = [j.strip() for j in jobs.split(",") if j.strip()]
    by_name = {j.name: j for j in default_jobs()}
    unknown = [j for j in wanted if j not in by_name]
    if unknown:
        raise _fail(f"unknown job(s): {', '.join(unknown)} (known: {', '.join(by_name)})")
    header = f"{'job':8} {'kind':10} {'method':11} {'tokens':>6} {'decode ms':>10} {'tok/s':>7} {'ratio':>6} {'accept':>7} {'mean acc':>8} {'batches':>7}  same"

    def show(row) -> None:
        if not as_json:
            same = "-" if row.same_as_none is None else ("yes" if row.same_as_none else "NO")
            typer.echo(f"{row.job:8} {row.kind:10} {row.method:11} {row.tokens:6d} {row.decode_ms:10.1f} {row.tokens_per_s:7.2f} "
                       f"{row.ratio:5.2f}x {row.accept_rate:7.3f} {row.mean_accepted_len:8.2f} {row.verify_batches:7d}  {same}")

    if not as_json:
        typer.echo(header)
    try:
        rows = run_bench(
            opts, methods=[m.strip() for m in methods.split(",") if m.strip()], jobs=[by_name[j] for j in wanted],
            max_tokens=max_tokens, n_draft=n_draft, draft_min=draft_min, p_min=p_min, ngram=ngram, repeat=repeat,
            mode=mode, on_row=show,
        )
    except EngineError as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted") from None
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in rows], indent=2))


# --------------------------------------------------------------------------- bench: ttft, make-model


@bench_app.command("ttft")
def bench_ttft(
    lengths: str = typer.Option("4000", help="Comma-separated prompt lengths in tokens, e.g. 8000,32000,65000,131000."),
    keep: float = typer.Option(0.3, help="Fraction of the document's chunks kept."),
    scorer: str = typer.Option("windowed", help="windowed, sliding or full."),
    lookahead: int = typer.Option(8, help="Lookahead query rows."),
    window: int = typer.Option(0, help="Document tokens per scoring window (0 = auto)."),
    reps: int = typer.Option(3, help="Rounds per length after the dropped warm-up (median counts)."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path."),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    n_ctx: int = typer.Option(0, help="Target context (0 = the largest length + 1024)."),
    n_batch: int = typer.Option(4096, help="Largest batch handed to llama_decode."),
    n_ubatch: int = typer.Option(0, help="Micro-batch (0 = 2048 on GPU, 512 on CPU)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    n_parallel: int = typer.Option(0, help="Scoring windows run together (0 = 8 on GPU, 1 on CPU)."),
    score_math: str = typer.Option("auto", help="Where score math runs: auto, numpy (host) or torch (on the speculator's device)."),
    batch_invariant: str = typer.Option("auto", help="Batch-invariant target numerics: auto (on for a CPU target), on, off."),
    out: Path = typer.Option(None, help="Write the report as JSON here."),
    plot: Path = typer.Option(None, help="Write a PNG plot here (needs matplotlib: pip install 'specq[bench]')."),
) -> None:
    """TTFT of baseline vs specprefill, alternating in one run, with the phase split and ratio."""
    from .engine.errors import EngineError
    from .engine.options import EngineOptions

    try:
        sizes = [int(x.replace("_", "")) for x in lengths.split(",") if x.strip()]
    except ValueError:
        raise _fail(f"bad --lengths {lengths!r}: comma-separated token counts") from None
    if not sizes or min(sizes) < 64 or reps < 1:
        raise _fail("--lengths must be token counts >= 64 and --reps >= 1")
    if score_math not in ("auto", "numpy", "torch"):
        raise _fail(f"--score-math must be auto, numpy or torch (got {score_math!r})")
    if batch_invariant not in ("auto", "on", "off"):
        raise _fail(f"--batch-invariant must be auto, on or off, not {batch_invariant!r}")
    opts = EngineOptions(n_gpu_layers=n_gpu_layers, n_ctx=n_ctx or max(sizes) + 1024, n_batch=n_batch, n_ubatch=n_ubatch,
                         n_threads=threads, n_parallel=n_parallel, score_math=score_math, batch_invariant=batch_invariant)
    if target:
        opts.target = target
    if speculator:
        opts.speculator = speculator
    try:
        from .bench_ttft import print_report, run_ttft_bench, write_outputs
        from .engine.pipeline import Engine

        engine = Engine(opts)
        report = run_ttft_bench(engine, sizes, keep=keep, scorer=scorer, lookahead=lookahead, window=window, reps=reps,
                                say=lambda m: typer.echo(m, err=True), on_report=lambda r: write_outputs(r, out, None))
    except EngineError as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted") from None
    print_report(report)
    write_outputs(report, out, plot)
    if out:
        typer.echo(f"wrote {out}")
    if plot:
        typer.echo(f"wrote {plot}")


@bench_app.command("make-model")
def bench_make_model(
    shape: str = typer.Option(..., help="tiny, 0.5b, 1.5b, 7b or 14b (real Qwen2 shapes)."),
    out: Path = typer.Option(..., help="Where to write the GGUF."),
    vocab: str = typer.Option("bytes", help="'bytes' (tiny byte vocabulary) or a vocab-only GGUF, e.g. llama.cpp's ggml-vocab-qwen2.gguf."),
    seed: int = typer.Option(0, help="Weight seed."),
    n_ctx: int = typer.Option(0, help="Training context written into the file (0 = the shape's)."),
    n_layer: int = typer.Option(0, help="Override the number of layers (0 = the shape's)."),
) -> None:
    """Write a random-weight Qwen2 GGUF of a real shape (for speed measurements: timing does not depend on weights)."""
    import time as _time

    from .engine.synthetic import write_qwen2_gguf

    overrides = {}
    if n_ctx:
        overrides["n_ctx"] = n_ctx
    if n_layer:
        overrides["n_layer"] = n_layer
    t0 = _time.perf_counter()
    try:
        path = write_qwen2_gguf(out, shape, vocab=vocab, seed=seed, **overrides)
    except (ValueError, OSError) as e:
        raise _fail(str(e)) from None
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB, {_time.perf_counter() - t0:.1f} s)")


@bench_app.command("prefill")
def bench_prefill(
    model: str = typer.Option("qwen2.5-coder-1.5b-instruct-q4_k_m", help="Registry name or GGUF path."),
    tokens: int = typer.Option(4000, help="Prompt length."),
    keep: float = typer.Option(0.3, help="Share of tokens in the gapped / compressed prefill."),
    decode_tokens: int = typer.Option(32, help="Single-token decode steps timed after a full prefill."),
    reps: int = typer.Option(3, help="Rounds after a dropped warm-up (median counts)."),
    n_gpu_layers: int = typer.Option(-1, help="Layers offloaded to the GPU (-1 = all)."),
    threads: int = typer.Option(0, help="CPU threads (0 = all cores)."),
    n_batch: int = typer.Option(4096, help="Largest batch handed to llama_decode."),
    n_ubatch: int = typer.Option(512, help="Micro-batch."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Prefill and decode tokens/s of one model; gapped (original positions) vs contiguous prefill of the same count."""
    import json
    import os

    from .engine.errors import EngineError
    from .engine.models import resolve_model

    if tokens < 64 or not 0 < keep <= 1 or reps < 1:
        raise _fail("--tokens must be >= 64, --keep in (0, 1], --reps >= 1")
    try:
        from .bench_prefill import run_prefill_bench

        path = resolve_model(model)
        report = run_prefill_bench(str(path), n_tokens=tokens, keep=keep, decode_tokens=decode_tokens, reps=reps,
                                   n_gpu_layers=n_gpu_layers, n_threads=threads or (os.cpu_count() or 1),
                                   n_batch=n_batch, n_ubatch=n_ubatch, say=lambda m: typer.echo(m, err=True))
    except EngineError as e:
        raise _fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    r = report
    typer.echo(f"{r['model']}: {r['prompt_tokens']} tokens")
    typer.echo(f"  full prefill        {r['full_s']:8.3f} s  {r['full_tok_s']:8.1f} tok/s")
    typer.echo(f"  gapped ({r['kept_tokens']} tokens) {r['gapped_s']:8.3f} s  {r['gapped_tok_s']:8.1f} tok/s  (original positions)")
    typer.echo(f"  compressed (same)   {r['compressed_s']:8.3f} s  {r['compressed_tok_s']:8.1f} tok/s  -> gapped/compressed {r['gapped_vs_compressed']:.3f}")
    typer.echo(f"  decode              {r['decode_tok_s']:8.2f} tok/s")


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
