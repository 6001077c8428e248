"""`specq worker | reconcile | api | up | down`: running the service."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from .app import app
from .common import fail, service_ready_db, service_settings
from .logfiles import log_dir, tee


@app.command("worker")
def worker_cmd(
    gpu: str = typer.Option(None, help="GPU index to run on (sets CUDA_VISIBLE_DEVICES). [env SPECQ_GPU]"),
    speculator_gpu: str = typer.Option(None, help="GPU index for the speculator alone (both GPUs visible, each model whole on its own; for pipelined jobs; not yet measured on two GPUs). [env SPECQ_SPECULATOR_GPU]"),
    queue: str = typer.Option(None, "--queue", "-Q", help="Queue to consume (default specq). [env SPECQ_QUEUE]"),
    concurrency: int = typer.Option(None, help="Processes, each with its own models (default 1; >1 = one slot each). [env SPECQ_CONCURRENCY]"),
    slots: int = typer.Option(None, help="Jobs run at once on one copy of the models (default 8 on a GPU, 1 on the CPU). [env SPECQ_SLOTS]"),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path. [env SPECQ_TARGET]"),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path. [env SPECQ_SPECULATOR]"),
    n_gpu_layers: int = typer.Option(None, help="Layers offloaded to the GPU (-1 = all). [env SPECQ_N_GPU_LAYERS]"),
    n_ctx: int = typer.Option(None, help="Target context per job (0 = model's, capped at 32768; larger values up to the model's). [env SPECQ_N_CTX]"),
    threads: int = typer.Option(None, help="CPU threads (0 = all cores). [env SPECQ_THREADS]"),
    flash_attn: bool = typer.Option(None, "--flash-attn/--no-flash-attn", help="Flash attention. [env SPECQ_FLASH_ATTN]"),
    cuda_graphs: bool = typer.Option(None, "--cuda-graphs/--no-cuda-graphs", help="ggml's CUDA graphs for decodes (off by default: they crashed on the H200, docs/engine.md). [env SPECQ_CUDA_GRAPHS]"),
    warm_up: bool = typer.Option(None, "--warm-up/--no-warm-up", help="Run a two-window specprefill job after loading; ready only after it. [env SPECQ_WARM_UP]"),
    loglevel: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Run a worker: load the models once on one GPU, then run up to --slots jobs from the queue at once."""
    from ..contracts import EngineError

    settings = service_settings(gpu=gpu, speculator_gpu=speculator_gpu, queue=queue, concurrency=concurrency, target=target, speculator=speculator,
                                 n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, threads=threads, flash_attn=flash_attn,
                                 cuda_graphs=cuda_graphs, warm_up=warm_up, slots=slots)
    service_ready_db(upgrade=False)
    from ..worker.main import run_worker

    try:
        run_worker(settings, loglevel=loglevel)
    except EngineError as e:
        raise fail(f"worker could not load its models: {e}") from None


@app.command("reconcile")
def reconcile_cmd(
    republish_queued: bool = typer.Option(False, "--republish-queued", help="Also send every queued job to the broker again (after a broker lost its messages, e.g. Redis restarted without persistence); duplicates do nothing."),
) -> None:
    """Requeue (or fail, after max attempts) jobs left running by workers that stopped heartbeating
    for SPECQ_STALE_AFTER seconds, once. Every worker also does this every SPECQ_RECONCILE_INTERVAL seconds."""
    from ..reconciler import reconcile_once, republish_queued as republish

    settings = service_settings()
    service_ready_db(upgrade=False)
    try:
        sweep = reconcile_once(settings)
        if republish_queued:
            sweep.republished = republish(settings).republished
    except Exception as e:  # unreachable store or broker: one line
        raise fail(f"reconcile: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    for name in ("requeued", "failed", "cancelled", "unsent"):
        for job_id in getattr(sweep, name):
            typer.echo(f"{job_id}\t{name}")
    typer.echo(f"reconcile: {sweep.summary()} (stale after {settings.stale_after:g}s)", err=True)


@app.command("api")
def api_cmd(
    host: str = typer.Option(None, help="Address to listen on (default 127.0.0.1). [env SPECQ_API_HOST]"),
    port: int = typer.Option(None, help="Port (default 8178). [env SPECQ_API_PORT]"),
    loglevel: str = typer.Option("info", help="uvicorn log level; at info and debug one line per request (method, path, status)."),
    served_model_name: str = typer.Option(None, help="Other names the OpenAI routes accept for the target, comma-separated (vLLM's --served-model-name); listed in /v1/models. [env SPECQ_SERVED_MODEL_NAME]"),
) -> None:
    """Run the REST API (no models are loaded here; jobs go to the broker for `specq worker`)."""
    settings = service_settings(api_host=host, api_port=port, served_model_name=served_model_name)
    service_ready_db(upgrade=False)
    if settings.auth == "none" and settings.api_host not in ("127.0.0.1", "localhost", "::1"):
        typer.echo(f"specq api: warning: no API keys (SPECQ_AUTH=none) on {settings.api_host}: anyone who reaches "
                   "this port sees every job; set SPECQ_AUTH=keys (docs/security.md)", err=True)
    from ..api.app import create_app
    from ..api.server import serve

    # one line per request (method, path, status) at info and debug, as llama-server and vLLM log them
    serve(create_app(settings), settings, log_level=loglevel.lower(), access_log=loglevel.lower() in ("debug", "info"))


@app.command("up")
def up_cmd(
    host: str = typer.Option(None, help="API address (default 127.0.0.1). [env SPECQ_API_HOST]"),
    port: int = typer.Option(None, help="API port (default 8178). [env SPECQ_API_PORT]"),
    gpu: str = typer.Option(None, help="GPU index for the worker. [env SPECQ_GPU]"),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path. [env SPECQ_TARGET]"),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path. [env SPECQ_SPECULATOR]"),
    n_gpu_layers: int = typer.Option(None, help="Layers offloaded to the GPU (-1 = all). [env SPECQ_N_GPU_LAYERS]"),
    n_ctx: int = typer.Option(None, help="Target context size. [env SPECQ_N_CTX]"),
    served_model_name: str = typer.Option(None, help="Other names the OpenAI routes accept for the target, comma-separated (vLLM's --served-model-name); listed in /v1/models. [env SPECQ_SERVED_MODEL_NAME]"),
    loglevel: str = typer.Option("INFO", help="Worker log level."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start in the background (log: $SPECQ_HOME/up.log), return once the API it started answers (exit 1 with the log's reason if it fails); stop with `specq down`."),
) -> None:
    """The whole service on this machine, in the foreground: migrations, then the API and one worker.

    With nothing set it needs no servers: the job store is SQLite and the broker is kombu's SQLAlchemy
    transport, both files under $SPECQ_HOME. SPECQ_DATABASE_URL / SPECQ_BROKER_URL select PostgreSQL / Redis.

    It prints the API's URL and, once its own API answers there, records it in $SPECQ_HOME/up.url: the
    CLI talks to that URL unless `specq --url` or SPECQ_API_URL says otherwise.
    """
    import secrets
    import signal
    import subprocess
    import sys
    import time

    from ..client import up_url_path
    from ..storage import db

    settings = service_settings(api_host=host, api_port=port, gpu=gpu, target=target, speculator=speculator,
                                 n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, served_model_name=served_model_name)
    if detach:
        _up_detached(settings, sys.argv[1:])
        return
    service_ready_db(upgrade=True)
    env = dict(os.environ)
    # names the API this `up` starts: /healthz answers it, so another API already on the port is not taken for ours
    instance = settings.instance_id or secrets.token_hex(8)
    env["SPECQ_INSTANCE_ID"] = instance
    for name in ("api_host", "api_port", "gpu", "target", "speculator", "n_gpu_layers", "n_ctx", "served_model_name"):
        value = getattr(settings, name)
        if value not in (None, ""):
            env[f"SPECQ_{name.upper()}"] = str(value)
    typer.echo(f"specq up: database {db.masked_url()}", err=True)
    typer.echo(f"specq up: broker {'embedded ' + settings.resolved_broker_url if settings.embedded_broker else 'redis'}"
               f", queue {settings.queue}", err=True)
    typer.echo(f"specq up: API at {settings.api_url} (docs {settings.api_url}/docs); submit with "
               f"`specq submit FILE -q QUESTION --wait`", err=True)
    typer.echo(f"specq up: logs in {log_dir()} (`specq logs [api|worker] [-f]`)", err=True)
    from ..worker.watchdog import EXIT_CODE as WATCHDOG_EXIT

    ready = False
    cmd = [sys.executable, "-m", "specq"]
    env["PYTHONUNBUFFERED"] = "1"  # their lines reach the log files as they are written
    procs = {
        "api": subprocess.Popen(cmd + ["api", "--loglevel", "info"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT),
        "worker": subprocess.Popen(cmd + ["worker", "--loglevel", loglevel], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT),
    }
    pumps = [tee(p.stdout, name) for name, p in procs.items()]

    stopping: set[str] = set()

    def _stop(*_args) -> None:
        for name, p in procs.items():
            if p.poll() is None and name not in stopping:
                stopping.add(name)
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, _stop)
    code = 0
    foreign = None
    try:
        while True:
            for name, p in list(procs.items()):
                rc = p.poll()
                if rc is not None and name == "worker" and rc == WATCHDOG_EXIT and name not in stopping:
                    # its engine thread was stuck (worker/watchdog.py): start it again; the reconciler
                    # runs its jobs again once their heartbeats are SPECQ_STALE_AFTER old
                    typer.echo(f"specq up: the worker's watchdog ended it (status {rc}); starting it again", err=True)
                    procs[name] = subprocess.Popen(cmd + ["worker", "--loglevel", loglevel], env=env,
                                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                    pumps.append(tee(procs[name].stdout, name))
                    continue
                if rc is not None:
                    if rc not in (0, -signal.SIGTERM, -signal.SIGINT):
                        if name == "api" and foreign and not ready:
                            typer.echo(f"specq up: another API (instance {foreign}) already answers at "
                                       f"{settings.api_url}: is the port in use?", err=True)
                        typer.echo(f"specq up: the {name} exited with status {rc}; stopping", err=True)
                        code = 1
                    raise StopIteration
            if not ready:
                answer = healthz_instance(settings.api_url)
                if answer == instance:
                    ready = True
                    _record_url(up_url_path(), settings.api_url)
                    typer.echo(f"specq up: ready; the CLI on this machine talks to {settings.api_url} (recorded in "
                               f"{up_url_path()}; `specq --url` or SPECQ_API_URL override it)", err=True)
                elif answer:
                    foreign = answer
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
    for t in pumps:
        t.join(timeout=5)
    raise typer.Exit(code)


def _up_pidfile() -> Path:
    from ..config import specq_home

    return specq_home() / "up.pid"


def healthz_instance(url: str) -> str | None:
    """The `instance` GET {url}/healthz answers ("?" from an API without one), or None when nothing
    answers 200 there."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
            if r.status != 200:
                return None
            body = json.loads(r.read(65536) or b"{}")
    except (OSError, ValueError):
        return None
    return str(body.get("instance") or "?") if isinstance(body, dict) else "?"


def _record_url(path: Path, url: str) -> None:
    """Write `url` to $SPECQ_HOME/up.url (whole, or not at all). The temporary name carries the pid: a detached
    `specq up` and its foreground child both record the same URL at about the same moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(url + "\n", encoding="utf-8")
    tmp.replace(path)


def log_reason(text: str) -> str:
    """The lines of a `specq up` log that say why it stopped (the OS's error first, e.g. a port in use,
    then the last other errors and exit statuses), at most four, joined; "" when none does."""
    import re

    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # whole words: a warning's source line (`_warn_or_raise_security_error(…`) is no reason
    said = re.compile(r"\berror\b|Errno|in use|exited with status|refused|denied|not found", re.I)
    hits = list(dict.fromkeys(line for line in lines if said.search(line)))
    causes = [line for line in hits if re.search(r"Errno|in use", line)]  # the OS's reason first
    hits = causes[:2] + [line for line in hits if line not in causes][-2:]
    return "; ".join(line[:300] for line in hits)


def _up_detached(settings, argv: list[str]) -> None:
    """Run `specq up` (without --detach) in a new session, logging to $SPECQ_HOME/up.log; return once
    /healthz answers with the instance name it gave that `up` (another API already on the port does
    not count), or exit 1 with the log's reason."""
    import secrets
    import signal
    import subprocess
    import sys
    import time

    from ..client import up_url_path
    from ..config import specq_home

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
    instance = settings.instance_id or secrets.token_hex(8)
    start = log.stat().st_size if log.exists() else 0

    def reason() -> str:
        with open(log, "rb") as f:
            f.seek(start)
            return log_reason(f.read().decode("utf-8", "replace"))

    typer.echo(f"specq up: starting in the background, API at {settings.api_url}", err=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "specq", *args], stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ, SPECQ_INSTANCE_ID=instance))
    pidfile.write_text(str(proc.pid))
    deadline = time.monotonic() + 120
    foreign = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pidfile.unlink(missing_ok=True)
            other = f"; another API (instance {foreign}) answers at {settings.api_url}" if foreign else ""
            why = reason()
            raise fail(f"specq up exited with status {proc.returncode}{': ' + why if why else ''}{other}; see {log}")
        answer = healthz_instance(settings.api_url)
        if answer == instance:
            _record_url(up_url_path(), settings.api_url)
            typer.echo(f"specq up: running in the background (pid {proc.pid}), API at {settings.api_url}, log {log}; "
                       f"the CLI on this machine talks to it (recorded in {up_url_path()}); `specq down` stops it", err=True)
            return
        foreign = answer or foreign
        time.sleep(0.5)
    try:  # not ours within the time: stop what was started rather than leave it half up
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    pidfile.unlink(missing_ok=True)
    if foreign:
        raise fail(f"another API (instance {foreign}), not the one this `specq up` started, answers at {settings.api_url}"
                   f" (is the port in use?){': ' + reason() if reason() else ''}; see {log}")
    raise fail(f"specq up did not answer at {settings.api_url}/healthz within 120 s; see {log}")


@app.command("down")
def down_cmd(
    as_json: bool = typer.Option(False, "--json", help='Print what happened as JSON: {"stopped": true|false, "pid": N|null, "detail": "…"}.'),
) -> None:
    """Stop a service started with `specq up --detach` (waits for the running job's phase to end, up to 60 s)."""
    import signal
    import time

    def said(stopped: bool, pid: int | None, detail: str) -> None:
        if as_json:
            from .output import print_json

            print_json({"stopped": stopped, "pid": pid, "detail": detail})
        else:
            typer.echo(f"specq down: {detail}", err=True)

    pidfile = _up_pidfile()
    if not pidfile.exists():
        return said(False, None, "nothing started with `specq up --detach`")
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (ValueError, ProcessLookupError):
        pidfile.unlink(missing_ok=True)
        return said(False, None, "it had already stopped")
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
    said(True, pid, f"stopped (pid {pid})")
