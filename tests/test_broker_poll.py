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


def _send_later(producer, queue, body: str, delay: float, sent: list[float]) -> threading.Thread:
    def go():
        time.sleep(delay)
        sent.append(time.monotonic())
        producer.publish(body, exchange=queue.exchange, routing_key="q", declare=[queue])

    t = threading.Thread(target=go)
    t.start()
    return t


def test_right_after_a_delivery_the_next_message_comes_within_the_fast_poll(conn):
    c, producer, queue, got, broker = conn
    producer.publish("first", exchange=queue.exchange, routing_key="q", declare=[queue])
    c.drain_events(timeout=10)
    assert [b for _, b in got] == ["first"]
    sent: list[float] = []
    t = _send_later(producer, queue, "follow-up", 0.3, sent)
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
