"""How `specq api` accepts connections: uvicorn with a request-receipt deadline and a connection limit.

uvicorn has no deadline for receiving a request: its keep-alive timer starts only after a response
and is reset by every byte, so a client that connects and sends nothing (or one header byte every few
seconds) holds its connection forever; 21,000 of them made the API stop answering. `GuardedH11Protocol`
(uvicorn's h11 protocol, subclassed) adds:

* **a receipt deadline** (SPECQ_RECEIPT_TIMEOUT, 60 s): from the moment a connection opens, or its
  previous response ends, the client has that long to send a whole request, headers and body. Past
  it the connection gets `408` (when no request had started) and is closed. The timer is disarmed
  once the request is read, so a long response (an export, an event stream) is never cut by it.
* **a connection limit** (SPECQ_MAX_CONNECTIONS per process): a connection over the limit makes room
  by closing the oldest connection that is still sending its request or idling between requests;
  only when every connection has a request in progress does the new one get `503` and is closed.
  Streams are capped below the limit (SPECQ_MAX_STREAMS, `specq.api.guard.StreamSlots`), so open
  streams can never lock ordinary requests out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..settings import ServiceSettings

log = logging.getLogger("specq.api")

#: file descriptors kept free of connections (the database pool, the broker, log files)
SPARE_FDS = 64


def _raw_response(status: int, reason: str, message: str, type_: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": type_}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n")
    if status == 503:
        head += "retry-after: 5\r\n"
    return head.encode() + b"\r\n" + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a receipt deadline and a connection limit (module docstring).
    `protocol_class(settings)` makes the subclass with the settings' numbers."""

    receipt_timeout: float = 60.0
    max_connections: int = 2048

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._receipt_timer: asyncio.TimerHandle | None = None
        self._waiting_since = 0.0
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._make_room():
            log.warning("connection limit (%d, SPECQ_MAX_CONNECTIONS) reached with every connection busy: "
                        "refusing one", self.max_connections)
            self.transport.write(_raw_response(503, "Service Unavailable", "too many connections "
                                               "(SPECQ_MAX_CONNECTIONS): try again shortly", "unavailable"))
            self.transport.close()
            return
        self._arm()

    # --- the receipt deadline ----------------------------------------------------------------------------
    def _arm(self) -> None:
        self._disarm()
        self._waiting_since = self.loop.time()
        self._receipt_timer = self.loop.call_later(self.receipt_timeout, self._receipt_expired)

    def _disarm(self) -> None:
        if self._receipt_timer is not None:
            self._receipt_timer.cancel()
            self._receipt_timer = None

    @property
    def receiving(self) -> bool:
        """True while the client has not finished sending a request (or idles between requests)."""
        return self._receipt_timer is not None

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.more_body:
            self._disarm()  # the whole request is in: the response may take as long as it needs

    def on_response_complete(self) -> None:
        self._arm()  # the next request on this connection must arrive in time as well
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _receipt_expired(self) -> None:
        self._receipt_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and self.conn.our_state in (h11.IDLE, h11.DONE):
                self.transport.write(_raw_response(408, "Request Timeout", f"the request did not arrive within "
                                                   f"{self.receipt_timeout:g}s (SPECQ_RECEIPT_TIMEOUT)", "request_timeout"))
        self.transport.close()

    # --- the connection limit ----------------------------------------------------------------------------
    def _make_room(self) -> bool:
        """Close the connection that has waited longest for its request; False if none is waiting."""
        waiting = [c for c in self.connections if c is not self and getattr(c, "receiving", False)
                   and not c.transport.is_closing()]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c._waiting_since)
        oldest._disarm()
        oldest.transport.close()
        return True


def protocol_class(settings: ServiceSettings) -> type[GuardedH11Protocol]:
    """GuardedH11Protocol with the settings' deadline and connection limit (the limit capped by the
    process's file descriptor limit)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = settings.max_connections
    if soft != resource.RLIM_INFINITY and limit > soft - SPARE_FDS:
        limit = max(16, soft - SPARE_FDS)
        log.warning("SPECQ_MAX_CONNECTIONS=%d is above the file descriptor limit (ulimit -n %d): using %d",
                    settings.max_connections, soft, limit)
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"receipt_timeout": settings.receipt_timeout, "max_connections": limit})


def serve(app, settings: ServiceSettings, log_level: str = "info", access_log: bool = False) -> None:
    """Run `app` with uvicorn on settings.api_host:api_port, through GuardedH11Protocol."""
    import uvicorn

    uvicorn.run(app, host=settings.api_host, port=settings.api_port, log_level=log_level, access_log=access_log,
                http=protocol_class(settings), backlog=max(2048, settings.max_connections))


__all__ = ["GuardedH11Protocol", "protocol_class", "serve"]
