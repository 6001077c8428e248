"""The embedded broker's poll (specq.broker.SqliteTransport): slow while idle, fast right after a delivery,
so a follow-up sent just after the previous answer ended is not held behind SPECQ_BROKER_POLL_INTERVAL.
A real kombu connection on the SQLite file, the consumer loop's drain_events as a Celery worker calls it.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest


@pytest.fixture
def conn(tmp_path):
    from kombu import Connection, Exchange, Queue

    from specq import broker  # registers the transport alias

    c = Connection(f"specqsqla+sqlite:///{tmp_path}/broker.sqlite", transport_options={"polling_interval": 3.0})
    queue = Queue("q", Exchange("q"), routing_key="q")
    got: list[tuple[float, str]] = []

    def on_message(body, message):
        got.append((time.monotonic(), body))
        message.ack()

    consumer = c.Consumer([queue], callbacks=[on_message])
    consumer.consume()
    yield c, c.Producer(serializer="json"), queue, got, broker
    consumer.cancel()
    c.release()


def _send_later(url: str, queue, body: str, delay: float, sent: list[float]) -> threading.Thread:
    """Send `body` after `delay` seconds on a connection of its own (as the API, another process, does)."""
    from kombu import Connection

    def go():
        time.sleep(delay)
        with Connection(url) as c:
            sent.append(time.monotonic())
            c.Producer(serializer="json").publish(body, exchange=queue.exchange, routing_key="q", declare=[queue])

    t = threading.Thread(target=go)
    t.start()
    return t


def test_right_after_a_delivery_the_next_message_comes_within_the_fast_poll(conn):
    c, producer, queue, got, broker = conn
    producer.publish("first", exchange=queue.exchange, routing_key="q", declare=[queue])
    c.drain_events(timeout=10)
    assert [b for _, b in got] == ["first"]
    sent: list[float] = []
    t = _send_later(c.as_uri(include_password=True), queue, "follow-up", 0.3, sent)
    c.drain_events(timeout=10)
    t.join()
    lag = got[-1][0] - sent[0]
    assert got[-1][1] == "follow-up"
    assert lag < 0.5, f"the follow-up waited {lag:.2f}s (idle poll 3 s, fast poll {broker.ACTIVE_POLL_S}s)"


def test_an_idle_consumer_polls_at_the_slow_interval(conn):
    c, producer, queue, got, broker = conn
    transport = c.transport
    assert transport.poll_interval(time.monotonic()) == 3.0  # nothing delivered yet
    transport.active_at = time.monotonic() - broker.ACTIVE_WINDOW_S - 1
    assert transport.poll_interval(time.monotonic()) == 3.0
    transport.active_at = time.monotonic()
    assert transport.poll_interval(time.monotonic()) == broker.ACTIVE_POLL_S
    with pytest.raises(socket.timeout):  # an empty queue still ends drain_events at its timeout
        c.drain_events(timeout=0.2)


def test_two_processes_declaring_the_queue_at_once_both_succeed(tmp_path):
    """The API's first send and a starting worker's queue declare raced: each found no `kombu_queue` row
    and inserted one, and the loser's send failed (UNIQUE constraint failed: kombu_queue.name), seen as
    a 503 on the first request after `specq up`. Here the other side's insert lands right between this
    channel's read and its insert (a hook on the real SQLite connection), and the send still succeeds."""
    import sqlite3

    from kombu import Connection, Exchange, Queue
    from sqlalchemy import event

    from specq import broker  # noqa: F401  (registers the transport alias)

    path = tmp_path / "broker.sqlite"
    c = Connection(f"specqsqla+sqlite:///{path}")
    channel = c.default_channel
    engine = channel.session.get_bind()
    fired = []

    @event.listens_for(engine, "before_cursor_execute")
    def other_process_declares(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO KOMBU_QUEUE") and not fired:
            fired.append(True)
            other = sqlite3.connect(path, timeout=30)
            other.execute("INSERT INTO kombu_queue (name) VALUES ('q')")
            other.commit()
            other.close()

    try:
        queue = Queue("q", Exchange("q"), routing_key="q")
        c.Producer(serializer="json").publish("hello", exchange=queue.exchange, routing_key="q", declare=[queue])
        assert fired
        got = []
        consumer = c.Consumer([queue], callbacks=[lambda body, m: (got.append(body), m.ack())])
        consumer.consume()
        c.drain_events(timeout=5)
        assert got == ["hello"]
    finally:
        event.remove(engine, "before_cursor_execute", other_process_declares)
        c.release()
