"""The API's connection handling (specq.api.server, specq.api.guard.StreamSlots) on a real uvicorn
server with real sockets: a small ASGI app stands in for the API routes, so the timings are exact.

* a client that connects and sends nothing, or sends its headers a byte at a time, gets 408 and is
  disconnected at SPECQ_RECEIPT_TIMEOUT; a keep-alive connection idle past it is closed as well;
* a response that streams for longer than that deadline is not cut (the deadline covers receiving
  the request only);
* over SPECQ_MAX_CONNECTIONS, the connection waiting longest for its request makes room;
* at most SPECQ_MAX_STREAMS responses stream at once; one more gets 503 + Retry-After, an ordinary
  request still answers.
(1,000 slow clients against a real `specq api`: tests/test_api_hardening.py.)
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from service_helpers import free_port
from specq.api.guard import StreamSlots
from specq.api.server import protocol_class
from specq.settings import ServiceSettings

TIMEOUT = 1.5


async def app(scope, receive, send):
    """/stream: 5 chunks, 0.6 s apart (3 s in all, twice the receipt deadline); anything else: `ok`."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/jsonl")]})
        for i in range(5):
            await send({"type": "http.response.body", "body": b'{"n": %d}\n' % i, "more_body": True})
            await asyncio.sleep(0.6)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def server():
    settings = ServiceSettings(receipt_timeout=TIMEOUT, max_connections=32, max_streams=2)
    port = free_port()
    config = uvicorn.Config(StreamSlots(app, limit=settings.resolved_max_streams), host="127.0.0.1", port=port,
                            http=protocol_class(settings), log_level="warning", timeout_keep_alive=30)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield port
    srv.should_exit = True
    thread.join(10)


def _read_all(sock: socket.socket, limit: float = 10.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed (seconds after the call)."""
    t0 = time.monotonic()
    sock.settimeout(limit)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data, time.monotonic() - t0
        data += chunk


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_silent_client_gets_408_at_the_deadline(server):
    with _connect(server) as s:
        data, after = _read_all(s)
    assert data.startswith(b"HTTP/1.1 408 ") and b"SPECQ_RECEIPT_TIMEOUT" in data, data
    assert TIMEOUT - 0.2 <= after <= TIMEOUT + 1.5, after


def test_headers_a_byte_at_a_time_do_not_extend_the_deadline(server):
    request = b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    with _connect(server) as s:
        t0 = time.monotonic()
        closed = None
        for byte in request:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed = time.monotonic() - t0
                break
            s.settimeout(0.2)
            try:
                if s.recv(65536) == b"":
                    closed = time.monotonic() - t0
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = time.monotonic() - t0
                break
        assert closed is not None and closed <= TIMEOUT + 1.5, closed


def test_keep_alive_connection_idle_past_the_deadline_is_closed(server):
    with _connect(server) as s:
        s.sendall(b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(5)
        first = b""
        while not first.endswith(b"ok"):
            first += s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        data, after = _read_all(s)  # no second request: the deadline runs again from the response
    assert after <= TIMEOUT + 1.5 and data.startswith(b"HTTP/1.1 408 "), (after, data)


def test_a_long_stream_is_not_cut_by_the_deadline(server):
    with _connect(server) as s:
        s.sendall(b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data, after = _read_all(s, limit=20)
    assert after >= 2 * TIMEOUT, after
    assert data.startswith(b"HTTP/1.1 200 ") and all(b'{"n": %d}' % i in data for i in range(5)), data


def test_over_the_connection_limit_the_longest_waiting_makes_room(server):
    idle = [_connect(server) for _ in range(40)]  # over the limit of 32: the oldest idle ones are closed
    try:
        with _connect(server) as s:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data, _ = _read_all(s)
        assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"ok")
        closed = 0
        for c in idle[:8]:
            c.settimeout(2)
            try:
                closed += c.recv(65536) == b""
            except (TimeoutError, ConnectionResetError):
                closed += 1
        assert closed == 8  # the first eight (the oldest) were evicted
    finally:
        for c in idle:
            c.close()


def test_streams_beyond_max_streams_get_503_and_ordinary_requests_still_answer(server):
    streams = []
    try:
        for _ in range(2):
            s = _connect(server)
            s.sendall(b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            s.settimeout(5)
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
            streams.append(s)
        with _connect(server) as s:
            s.sendall(b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            third, _ = _read_all(s)
        assert third.startswith(b"HTTP/1.1 503 ") and b"retry-after:" in third.lower() and b"SPECQ_MAX_STREAMS" in third
        with _connect(server) as s:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            ordinary, _ = _read_all(s)
        assert ordinary.startswith(b"HTTP/1.1 200 ")
    finally:
        for s in streams:
            _read_all(s, limit=20)
            s.close()
