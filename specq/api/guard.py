"""What every request passes before a route sees it (ASGI middleware).

* `RequestGuard`:
  - **Host and Origin, in no-auth mode** (SPECQ_AUTH=none). Without keys, anything that can make the
    user's browser send a request could use the API: a web page posting cross-origin (CSRF), or a
    name the attacker controls resolving to 127.0.0.1 (DNS rebinding). So the `Host` header must name
    this machine by a loopback name (localhost, 127.0.0.1, ::1), the address the API listens on, or a
    name in SPECQ_ALLOWED_HOSTS (400 otherwise; listening on 0.0.0.0 adds this machine's host name and
    addresses), and a request with an `Origin` header must come from
    the same origin (a page specq itself serves, e.g. /ui) or from a host in SPECQ_ALLOWED_HOSTS (403
    otherwise; `Origin: null` is refused). /healthz, /health and /readyz are exempt (probes use bare IPs).
    With keys on, a key is needed anyway and browsers cannot attach one by themselves.
  - **NUL in the path or query string**: 400 (PostgreSQL cannot compare text with a NUL in it).
  - **HEAD** is answered wherever GET is: the GET route runs and its body is dropped.
* `BodyLimit`: bodies over SPECQ_MAX_REQUEST_BYTES (batches, files: SPECQ_MAX_BATCH_BYTES) are refused with
  413 before they are read whole.
* `StreamSlots`: at most SPECQ_MAX_STREAMS responses stream at once (exports, event streams); one
  more answers 503 with Retry-After, so long streams cannot take every connection
  (SPECQ_MAX_CONNECTIONS, `specq.api.server`) from ordinary requests.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..ascii_numbers import ascii_int
from ..settings import ServiceSettings
from .errors import ApiError, error_response

#: names of this machine every no-auth API accepts in Host
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: paths exempt from the Host/Origin check: health probes (they say nothing about jobs)
PROBE_PATHS = ("/healthz", "/health", "/readyz")
#: response media types that count as streams for StreamSlots
STREAM_TYPES = (b"text/event-stream", b"application/jsonl", b"application/x-ndjson", b"text/csv")


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def host_name(netloc: str) -> str:
    """The host of a `Host` header or URL netloc, lower case, without port or brackets."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1:].split("]", 1)[0]
    if netloc.count(":") > 1:  # a bare IPv6 address
        return netloc
    return netloc.rsplit(":", 1)[0] if ":" in netloc else netloc


def allowed_hosts(settings: ServiceSettings) -> tuple[set[str], bool]:
    """(names accepted in Host, whether any name is); from the defaults, the listen address and
    SPECQ_ALLOWED_HOSTS."""
    extra = [h.strip().lower() for h in settings.allowed_hosts.split(",") if h.strip()]
    names = set(LOOPBACK_NAMES) | {host_name(h) for h in extra if h != "*"}
    listen = settings.api_host.strip().lower()
    if listen and listen not in ("0.0.0.0", "::"):
        names.add(host_name(listen))
    elif listen:
        names |= own_names()  # listening everywhere: this machine's own names and addresses
    return names, "*" in extra


def own_names() -> set[str]:
    """This machine's host name, FQDN and the addresses they resolve to (never an attacker's name:
    DNS rebinding sends a name the attacker owns)."""
    import socket

    names: set[str] = set()
    try:
        for name in {socket.gethostname(), socket.getfqdn()}:
            names.add(name.lower())
            names |= {str(info[4][0]).lower() for info in socket.getaddrinfo(name, None)}
    except OSError:
        pass
    return names


class RequestGuard:
    def __init__(self, app, settings: ServiceSettings) -> None:
        self.app = app
        self.check_origin = settings.auth == "none"
        self.hosts, self.any_host = allowed_hosts(settings)
        self.extra_hosts = {host_name(h) for h in settings.allowed_hosts.split(",") if h.strip() and h.strip() != "*"}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if "\x00" in scope.get("path", "") or b"%00" in scope.get("query_string", b"") \
                or b"\x00" in scope.get("query_string", b""):
            return await error_response(400, "the URL contains a NUL character", "invalid_request")(scope, receive, send)
        if self.check_origin and scope.get("path") not in PROBE_PATHS:
            refusal = self._refusal(scope)
            if refusal is not None:
                return await refusal(scope, receive, send)
        if scope.get("method") == "HEAD":
            return await _head(self.app, dict(scope, method="GET"), receive, send)
        return await self.app(scope, receive, send)

    def _refusal(self, scope):
        host = _header(scope, b"host")
        if host is not None and not self.any_host and host_name(host) not in self.hosts:
            return error_response(400, f"Host {host[:100]!r} is not allowed: without API keys (SPECQ_AUTH=none) "
                                       "the API answers only to this machine's loopback names and SPECQ_ALLOWED_HOSTS "
                                       "(docs/security.md)", "invalid_host")
        origin = _header(scope, b"origin")
        if origin is None:
            return None
        netloc = urlsplit(origin).netloc.lower() if origin != "null" else ""
        same = bool(netloc) and host is not None and netloc == host.strip().lower()
        listed = bool(netloc) and (self.any_host or host_name(netloc) in self.extra_hosts)
        if same or listed:
            return None
        return error_response(403, f"cross-origin request from {origin[:100]!r} refused: without API keys "
                                   "(SPECQ_AUTH=none) only this API's own pages and SPECQ_ALLOWED_HOSTS may call it "
                                   "from a browser (docs/security.md)", "forbidden")


class _HeadDone(Exception):
    pass


async def _head(app, scope, receive, send):
    """Run the GET route; send its status and headers, no body."""
    done = False

    async def send_head(message):
        nonlocal done
        if done:
            raise _HeadDone
        if message["type"] == "http.response.start":
            return await send(message)
        if message["type"] == "http.response.body":
            done = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if message.get("more_body"):
                raise _HeadDone  # a stream: stop producing it
            return None
        return await send(message)

    try:
        await app(scope, receive, send_head)
    except _HeadDone:
        pass


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, before reading them whole."""

    def __init__(self, app, limit: int, batch_limit: int | None = None) -> None:
        self.app = app
        self.limit = limit
        #: batch uploads (POST /v1/batches) carry many documents: their own, larger limit
        self.batch_limit = batch_limit or limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        batch = scope.get("path", "").startswith(("/v1/batches", "/v1/files"))
        limit = self.batch_limit if batch else self.limit
        var = "SPECQ_MAX_BATCH_BYTES" if batch else "SPECQ_MAX_REQUEST_BYTES"
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                size = ascii_int(value.strip(), max_digits=19)  # int() would take b'+5' and b'1_0'
                if size is None:
                    return await error_response(400, "bad Content-Length header", "invalid_request")(scope, receive, send)
                if size > limit:
                    resp = error_response(413, f"request body is {size} bytes, over the limit of {limit} bytes "
                                               f"({var})", "too_large")
                    return await resp(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise ApiError(413, f"request body is over the limit of {limit} bytes ({var})", "too_large")
            return message

        return await self.app(scope, limited_receive, send)


class _NoSlot(Exception):
    pass


class StreamSlots:
    """At most `limit` streaming responses at once (0 = no limit); one over it answers 503."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.active = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.limit <= 0:
            return await self.app(scope, receive, send)
        holding = False
        started = False

        async def send_counted(message):
            nonlocal holding, started
            if message["type"] == "http.response.start":
                ctype = dict(message.get("headers", ())).get(b"content-type", b"").split(b";")[0].strip()
                if ctype in STREAM_TYPES:
                    if self.active >= self.limit:
                        raise _NoSlot
                    self.active += 1
                    holding = True
                started = True
            return await send(message)

        try:
            await self.app(scope, receive, send_counted)
        except _NoSlot:
            if not started:
                await error_response(503, f"{self.limit} responses are streaming already (SPECQ_MAX_STREAMS): try "
                                          "again shortly", "unavailable")(scope, receive, send)
        finally:
            if holding:
                self.active -= 1


__all__ = ["RequestGuard", "BodyLimit", "StreamSlots", "allowed_hosts", "host_name", "LOOPBACK_NAMES"]
