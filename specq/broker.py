"""The Celery app shared by the API (which only sends) and the worker (which also runs the task).

The API enqueues by task name (`RUN_JOB_TASK`) and never imports the worker module, so the API
process never loads llama.cpp. Messages carry only the job id: the document, params and state live in
the job store, and the worker re-reads them (so a redelivered message is harmless).

Brokers:

* Redis (``SPECQ_BROKER_URL=redis://…``): `visibility_timeout` is set above the job time limit, so a
  job that is still running is never handed to a second worker; unacknowledged jobs of a dead worker
  come back after that timeout.
* Embedded (default): kombu's SQLAlchemy transport on ``$SPECQ_HOME/broker.sqlite``. specq uses a
  small subclass of it (`SqliteTransport`) that opens the file in WAL mode with a busy timeout, polls
  every `broker_poll_interval` seconds and deletes delivered rows (kombu keeps them forever). For
  ACTIVE_WINDOW_S after its last delivery or acknowledgement it polls every ACTIVE_POLL_S instead: a
  follow-up question (or an agent's next call) is sent right after the previous answer ended, and half a
  poll interval was the largest part of its wait outside the engine (issue 50); an idle worker goes back
  to the slow poll.
"""

from __future__ import annotations

import socket
import threading
import time
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import sqlalchemy as kombu_sqla

from .settings import RUN_JOB_TASK, ServiceSettings

#: URL scheme prefix our SQLAlchemy transport is registered under (``sqla+`` URLs are rewritten to it)
_SQLA_ALIAS = "specqsqla"
TRANSPORT_ALIASES.setdefault(_SQLA_ALIAS, "specq.broker:SqliteTransport")


class _SqlaChannel(kombu_sqla.Channel):
    def _engine_from_config(self):
        from sqlalchemy import create_engine, event

        url = self.connection.client.hostname
        if not url.startswith("sqlite"):
            return create_engine(url, pool_pre_ping=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):  # pragma: no cover - every connection
            cur = dbapi_connection.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine

    def _get_or_create(self, queue):
        """kombu's, without its race between processes: the API's first send and a starting worker's
        declare both found no row for the queue and both inserted it; the loser's send failed with
        `UNIQUE constraint failed: kombu_queue.name` (a 503 for the first request after `specq up`)."""
        from sqlalchemy.exc import IntegrityError

        try:
            return super()._get_or_create(queue)
        except IntegrityError:
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()

    def basic_ack(self, delivery_tag, multiple=False):
        super().basic_ack(delivery_tag, multiple=multiple)
        self.connection.active_at = time.monotonic()  # a job just ended here: its follow-up comes next


#: seconds between polls of an empty embedded broker within ACTIVE_WINDOW_S of its last delivery or ack
ACTIVE_POLL_S = 0.01
#: ... this long; then `broker_poll_interval` (SPECQ_BROKER_POLL_INTERVAL) again
ACTIVE_WINDOW_S = 10.0


class SqliteTransport(kombu_sqla.Transport):
    """kombu's SQLAlchemy transport with WAL, a busy timeout, a configurable polling interval, and a fast
    poll right after activity (module doc)."""

    Channel = _SqlaChannel
    #: time.monotonic() of the last delivery or acknowledgement (the channels set it on ack)
    active_at = float("-inf")

    def poll_interval(self, now: float) -> float:
        """Seconds to sleep after an empty poll at `now`."""
        slow = self.polling_interval or 0.0
        return min(slow, ACTIVE_POLL_S) if now - self.active_at < ACTIVE_WINDOW_S else slow

    def drain_events(self, connection, timeout=None):
        """kombu's virtual `Transport.drain_events` with the sleep of `poll_interval`."""
        start = time.monotonic()
        while True:
            try:
                self.cycle.get(self._deliver, timeout=timeout)
            except Empty:
                now = time.monotonic()
                if timeout is not None and now - start >= timeout:
                    raise socket.timeout()
                pause = self.poll_interval(now)
                if timeout:
                    pause = min(pause, max(0.0, timeout - (now - start)))
                if pause:
                    time.sleep(pause)
            else:
                self.active_at = time.monotonic()
                return


def _transport_url(url: str) -> str:
    for prefix in ("sqla+", "sqlalchemy+"):
        if url.startswith(prefix):
            return f"{_SQLA_ALIAS}+{url[len(prefix):]}"
    return url


def make_celery(settings: ServiceSettings | None = None, *, queue: str | None = None):
    """A Celery app configured from `settings` (default: the environment).

    `queue` is the default queue (the worker's ``--queue``; the API sends to settings.queue).
    """
    from celery import Celery
    from kombu import Queue

    settings = settings or ServiceSettings.from_env()
    queue = queue or settings.queue
    app = Celery("specq", set_as_current=False)
    url = settings.resolved_broker_url
    if settings.embedded_broker:
        _ensure_sqlite_dir(url)
        transport_options: dict[str, Any] = {"polling_interval": settings.broker_poll_interval}
    else:
        transport_options = {"visibility_timeout": int(settings.resolved_visibility_timeout)}
        if url.startswith(("redis", "rediss")):
            transport_options["socket_connect_timeout"] = 5
    app.conf.update(
        broker_url=_transport_url(url),
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=5,
        task_default_queue=queue,
        task_queues=[Queue(queue, routing_key=queue)],
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        # one job at a time per process, acknowledged only when it is finished; a worker that dies
        # mid-job leaves its message unacknowledged, so the broker hands it out again
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # models can take minutes to load in a prefork child (worker_process_init)
        worker_proc_alive_timeout=600,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        # the SQLAlchemy transport has no fanout exchange: no remote control there
        worker_enable_remote_control=not settings.embedded_broker,
    )
    app.specq_settings = settings  # type: ignore[attr-defined]
    return app


def _ensure_sqlite_dir(url: str) -> None:
    from pathlib import Path

    path = url.split(":///", 1)[-1] if ":///" in url else ""
    if path and path != ":memory:":
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)


_sender_lock = threading.Lock()
_senders: dict[tuple, Any] = {}


def sender(settings: ServiceSettings | None = None):
    """A cached Celery app for sending (one per broker URL and queue)."""
    settings = settings or ServiceSettings.from_env()
    key = (settings.resolved_broker_url, settings.queue, settings.broker_poll_interval)
    with _sender_lock:
        app = _senders.get(key)
        if app is None:
            app = _senders[key] = make_celery(settings)
        return app


def enqueue_job(job_id: str, settings: ServiceSettings | None = None, *, queue: str | None = None,
                countdown: float | None = None) -> None:
    """Send job `job_id` to the broker (queue: `queue` or settings.queue), to run no sooner than
    `countdown` seconds from now when given. Raises on broker errors."""
    settings = settings or ServiceSettings.from_env()
    app = sender(settings)
    q = queue or settings.queue
    extra = {"countdown": countdown} if countdown else {}
    app.send_task(
        RUN_JOB_TASK,
        args=[job_id],
        queue=q,
        routing_key=q,
        **extra,
        retry=True,
        retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0},
    )


def check_broker(settings: ServiceSettings | None = None, timeout: float = 2.0) -> None:
    """Raise if the broker cannot be reached within `timeout` seconds."""
    app = sender(settings)
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout)
        conn.default_channel  # Redis: a round trip; embedded: opens the SQLite file


def purge_delivered(settings: ServiceSettings, older_than_s: float = 60.0) -> int:
    """Embedded broker: delete messages already delivered to a worker more than `older_than_s` ago.

    kombu's SQLAlchemy transport marks a delivered message invisible and never deletes it; the job
    store, not the broker, is the record of what ran, so those rows are only clutter.
    """
    if not settings.embedded_broker:
        return 0
    from datetime import datetime, timedelta

    from sqlalchemy import create_engine, text

    url = settings.resolved_broker_url.split("+", 1)[1]
    engine = create_engine(url, connect_args={"timeout": 30} if url.startswith("sqlite") else {})
    try:
        cutoff = datetime.now() - timedelta(seconds=older_than_s)
        with engine.begin() as conn:
            return conn.execute(
                text("DELETE FROM kombu_message WHERE visible = :f AND timestamp < :cutoff"),
                {"f": False, "cutoff": cutoff},
            ).rowcount
    finally:
        engine.dispose()


__all__ = ["purge_delivered", "make_celery", "enqueue_job", "check_broker", "sender", "SqliteTransport", "RUN_JOB_TASK"]
