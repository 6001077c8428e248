"""What the broker side of the service can tell `/metrics`: queue depth and worker heartbeats.

* **Queue depth**: messages waiting in a queue (Redis: the length of the queue's lists, one per
  priority step kombu uses; embedded broker: visible rows of the queue in kombu's message table).
* **Worker heartbeats**: every worker process writes a small JSON record every
  `HEARTBEAT_INTERVAL` seconds (its name, queue, GPU, jobs done, the job it is running). With Redis
  it is a key `specq:worker:<host:pid>` that expires after `HEARTBEAT_TTL`; with the embedded broker
  (one machine) a file `$SPECQ_HOME/workers/<host:pid>.json`, ignored once older than the TTL.
  A worker that stops cleanly deletes its record; one that dies simply stops refreshing it.

Nothing heavy is imported: the API reads these without loading the worker or llama.cpp.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .config import specq_home
from .settings import ServiceSettings

log = logging.getLogger("specq.monitor")

#: seconds between a worker's heartbeats
HEARTBEAT_INTERVAL = 5.0
#: a heartbeat older than this means the worker is gone
HEARTBEAT_TTL = 30.0
_REDIS_PREFIX = "specq:worker:"
#: kombu's Redis transport keeps one list per priority step: `queue`, then `queue\x06\x16<step>`
_PRIORITY_SEP = "\x06\x16"


def _redis(settings: ServiceSettings):
    import redis

    return redis.Redis.from_url(settings.resolved_broker_url, socket_connect_timeout=3, socket_timeout=3)


def _embedded_dir() -> Path:
    return specq_home() / "workers"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.:@" else "_" for c in name)


# --- queue depth --------------------------------------------------------------------------------------


def queue_depth(settings: ServiceSettings, queue: str | None = None) -> int:
    """Messages waiting in `queue` (default settings.queue). Raises if the broker is unreachable."""
    queue = queue or settings.queue
    if settings.embedded_broker:
        from sqlalchemy import create_engine, text

        url = settings.resolved_broker_url.split("+", 1)[1]
        engine = create_engine(url, connect_args={"timeout": 5} if url.startswith("sqlite") else {})
        try:
            with engine.connect() as conn:
                try:
                    return int(conn.execute(text(
                        "SELECT count(*) FROM kombu_message m JOIN kombu_queue q ON m.queue_id = q.id "
                        "WHERE q.name = :q AND m.visible"), {"q": queue}).scalar() or 0)
                except Exception:  # no table yet: nothing was ever sent
                    return 0
        finally:
            engine.dispose()
    r = _redis(settings)
    try:
        keys = [queue] + [f"{queue}{_PRIORITY_SEP}{step}" for step in range(1, 10)]
        pipe = r.pipeline()
        for k in keys:
            pipe.llen(k)
        return int(sum(pipe.execute()))
    finally:
        r.close()


# --- heartbeats ---------------------------------------------------------------------------------------


def write_heartbeat(settings: ServiceSettings, record: dict[str, Any]) -> None:
    record = dict(record, ts=time.time())
    name = record["name"]
    if settings.embedded_broker:
        d = _embedded_dir()
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{_safe(name)}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, d / f"{_safe(name)}.json")
        return
    r = _redis(settings)
    try:
        r.set(_REDIS_PREFIX + name, json.dumps(record), ex=int(HEARTBEAT_TTL))
    finally:
        r.close()


def remove_heartbeat(settings: ServiceSettings, name: str) -> None:
    if settings.embedded_broker:
        (_embedded_dir() / f"{_safe(name)}.json").unlink(missing_ok=True)
        return
    r = _redis(settings)
    try:
        r.delete(_REDIS_PREFIX + name)
    finally:
        r.close()


def read_heartbeats(settings: ServiceSettings) -> list[dict[str, Any]]:
    """The live workers' latest heartbeat records (each with `ts`, unix seconds), by name."""
    now = time.time()
    out: list[dict[str, Any]] = []
    if settings.embedded_broker:
        d = _embedded_dir()
        for path in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if now - float(rec.get("ts", 0)) <= HEARTBEAT_TTL:
                out.append(rec)
        return out
    r = _redis(settings)
    try:
        keys = sorted(r.scan_iter(match=_REDIS_PREFIX + "*", count=500))
        for raw in r.mget(keys) if keys else []:
            if raw:
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    continue
    finally:
        r.close()
    return sorted(out, key=lambda rec: str(rec.get("name")))


class Heartbeat(threading.Thread):
    """A worker process's heartbeat: `state()` -> the record to write, every HEARTBEAT_INTERVAL."""

    def __init__(self, settings: ServiceSettings, state: Callable[[], dict[str, Any]],
                 interval: float = HEARTBEAT_INTERVAL) -> None:
        super().__init__(name="specq-heartbeat", daemon=True)
        self.settings = settings
        self.state = state
        self.interval = interval
        self._stop_event = threading.Event()
        self._name: str | None = None

    def beat(self) -> None:
        try:
            record = self.state()
            self._name = record["name"]
            write_heartbeat(self.settings, record)
        except Exception as e:  # the broker is briefly unreachable: the next beat tries again
            log.warning("worker heartbeat failed: %s", e)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.beat()

    def start(self) -> None:
        self.beat()  # at once: a worker shows up as soon as it is ready
        super().start()

    def stop(self) -> None:
        self._stop_event.set()
        if self._name:
            try:
                remove_heartbeat(self.settings, self._name)
            except Exception:
                pass


__all__ = ["queue_depth", "read_heartbeats", "write_heartbeat", "remove_heartbeat", "Heartbeat",
           "HEARTBEAT_INTERVAL", "HEARTBEAT_TTL"]
