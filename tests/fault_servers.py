"""Throwaway Redis and PostgreSQL servers for the fault tests, on ports of their own.

The shared servers (6379, 5432) are never restarted: these tests start their own, restart or kill
them, and remove them afterwards. Redis keeps its data across restarts in an append-only file synced
on every write (`--appendonly yes --appendfsync always`), like a production Redis configured for a
job queue. PostgreSQL comes from `initdb` + `pg_ctl` (`/usr/lib/postgresql/*/bin`); `initdb` refuses
to run as root, so as root the cluster is made and run as the `postgres` user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from service_helpers import free_port


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.2)
    raise RuntimeError(f"{what} not up after {timeout}s: {last}")


class RedisServer:
    """`redis-server` on its own port and directory, with an append-only file synced on every write."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--appendonly", "yes",
             "--appendfsync", "always", "--save", "", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _wait(self.ping, 30, f"redis-server on port {self.port}")

    def ping(self) -> bool:
        import redis

        return bool(redis.Redis(port=self.port, socket_connect_timeout=1).ping())

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, sig: int = signal.SIGKILL, down_for: float = 0.0) -> float:
        """Stop it (SIGKILL by default: a crash), stay down `down_for` s, start it; seconds it was down."""
        t0 = time.monotonic()
        self.stop(sig)
        time.sleep(down_for)
        self.start()
        self.restarts += 1
        return time.monotonic() - t0


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if found:
        return found[-1]
    exe = shutil.which(name)
    if exe is None:
        raise RuntimeError(f"{name} not found (install PostgreSQL's server binaries)")
    return exe


class PgServer:
    """A PostgreSQL cluster of its own (`initdb`), started and stopped with `pg_ctl`, trust auth."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="specq-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres")
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                  "--no-sync")
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
        full = (["runuser", "-u", "postgres", "--"] if self.as_root else []) + list(cmd)
        r = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} -> {r.returncode}: {r.stdout}{r.stderr}")
        return r

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.root / "pg.log"), "-w",
                  "-t", "60", "start")
        _wait(self.ping, 30, f"PostgreSQL on port {self.port}")

    def ping(self) -> bool:
        import psycopg

        psycopg.connect(self.url, connect_timeout=2).close()
        return True

    def stop(self, mode: str = "fast") -> None:
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "immediate", down_for: float = 0.0) -> float:
        """Stop it (`immediate` by default: a crash, recovered from the WAL on start), stay down
        `down_for` s, start it; seconds it was down."""
        t0 = time.monotonic()
        self.stop(mode)
        time.sleep(down_for)
        self.start()
        self.restarts += 1
        return time.monotonic() - t0

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        pidfile = self.data / "postmaster.pid"
        if pidfile.exists():  # pg_ctl failed: end the postmaster we started by its pid
            with contextlib.suppress(Exception):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def throwaway_redis(workdir: Path):
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)


@contextlib.contextmanager
def throwaway_postgres():
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.remove()


def servers_available() -> str | None:
    """None if redis-server and PostgreSQL's server binaries are installed, else what is missing."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    try:
        _pg_bin("initdb")
        _pg_bin("pg_ctl")
    except RuntimeError as e:
        return str(e)
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: initdb cannot run"
    return None
