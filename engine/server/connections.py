"""Connection limits for the engine server: sockets that send nothing, or send slowly, cannot crowd it out.

uvicorn alone leaves three gaps (measured on uvicorn 0.54 with h11, issue 24):

* ``limit_concurrency`` compares the number of *open connections* with its limit, so ~320 sockets that
  never send a request make every real request answer 503;
* ``timeout_keep_alive`` is armed only after a response: a socket idle before its first request, or one
  that trickles its headers a byte at a time, is never closed (uvicorn issue #157 proposed
  ``--timeout-request-start`` ~10 s and ``--timeout-request-complete`` ~60 s; neither exists);
* nothing bounds how many such sockets one client holds.

This module closes them at the connection level, the way nginx (``client_header_timeout``), Apache
(``mod_reqtimeout``) and Go's ``ReadHeaderTimeout`` do:

* a request's headers must arrive within ``header_timeout_s`` of the connection opening (or of the previous
  response ending), its body within ``body_timeout_s`` of the headers; the clock is not reset by each
  byte, so trickling does not help;
* connections with no request in flight ("idle": waiting for headers or kept alive) are capped per client
  address and overall; beyond the caps the *oldest* idle ones are closed, so a flood of idle sockets evicts
  itself while a real client, whose headers follow its connect within milliseconds, gets through;
* all connections together are capped; at the cap a new connection closes the oldest idle one at once, and
  only when every connection is busy with a request is the new one closed instead;
* in-flight requests are counted by :class:`InFlightLimit` (an ASGI middleware), not connections, and
  answered 503 beyond the limit.

A TLS socket counts from its TCP accept, like a plain one: asyncio's own TLS server hands a connection to
the protocol only once its handshake is done, so sockets that never start one held file descriptors that no
cap saw (1,100 of them at a file limit of 1024 left no request answered). :class:`TlsHandshake` takes the
socket at accept, is counted as an idle connection (evicted like one) and runs the handshake, which must end
within ``header_timeout_s`` (asyncio's ``ssl_handshake_timeout`` is 60 s, and uvicorn does not set it); the
request's own header deadline then starts (:class:`GuardedServer`).
Accept errors under a file-descriptor flood ("Too many open files") are logged once per kind per
``LOG_EVERY_S``, one line each, with a count of those left out (:class:`OncePerKind`): the log stays bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from asyncio import sslproto
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import h11
import uvicorn
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from engine import wire
from engine.server.middleware import ambiguous_framing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    """How many sockets the server keeps, and how long a request may take to arrive."""

    header_timeout_s: float = 10.0  # connect (or end of the last response) -> request headers complete
    body_timeout_s: float = 30.0  # headers -> body complete (bodies are < 64 kB: 2 kB/s at the least)
    max_idle_per_client: int = 16  # sockets of one address with no request in flight; more: its oldest close
    max_idle: int = 128  # idle sockets of all clients; more: the oldest close
    idle_grace_s: float = 2.0  # ... once they have been idle this long (a burst's requests are still unread)
    max_connections: int = 512  # all sockets; one more closes the oldest idle one at once, or itself if none
    max_in_flight_requests: int = 320  # requests being answered (event streams included); more get 503
    # ... of one source address (a single-token server's only defence against one address taking all)
    max_in_flight_per_address: int = 160
    keep_alive_s: int = 10  # an idle kept-alive socket is closed after this (uvicorn's timeout_keep_alive)
    max_header_bytes: int = 16 * 1024  # request line + headers; more: 400 (h11's buffer, and RequestGate)


class GuardedConnection(Protocol):
    """What the guard needs of a connection it counts: a plain one, or a TLS one still in its handshake."""

    loop: asyncio.AbstractEventLoop
    client_host: str

    def close_quietly(self) -> None: ...


class ConnectionGuard:
    """Book-keeping for one server's connections, all on the event loop's thread (no locks needed).

    Idle caps are enforced by a sweep ``idle_grace_s`` after they are exceeded, closing only sockets idle
    for at least that long: a burst of real clients whose requests are already in the socket buffers (the
    event loop accepts a batch of sockets before it reads any of them) is not mistaken for a flood.
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.connections: set[GuardedConnection] = set()
        self.idle: OrderedDict[GuardedConnection, float] = OrderedDict()  # -> idle since; oldest first
        self.idle_by_client: dict[str, OrderedDict[GuardedConnection, float]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self.closed_for_timeout = 0  # counters, for tests and logs
        self.evicted_idle = 0
        self.refused_full = 0
        self.handshakes = 0  # TLS connections still in their handshake (counted in ``connections`` too)

    def opened(self, conn: GuardedConnection) -> bool:
        """Register a new connection; False when it must be closed (the server is full of busy ones)."""
        if len(self.connections) >= self.limits.max_connections and not self._evict_oldest(self.idle, None):
            self.refused_full += 1
            return False
        self.connections.add(conn)
        self.became_idle(conn)
        return True

    def became_idle(self, conn: GuardedConnection) -> None:
        now = conn.loop.time()
        per_client = self.idle_by_client.setdefault(conn.client_host, OrderedDict())
        self.idle[conn] = now
        per_client[conn] = now
        over = len(per_client) > self.limits.max_idle_per_client or len(self.idle) > self.limits.max_idle
        if over and self._sweep is None:
            self._sweep = conn.loop.call_later(self.limits.idle_grace_s, self._sweep_idle, conn.loop)

    def became_busy(self, conn: GuardedConnection) -> None:
        self.idle.pop(conn, None)
        per_client = self.idle_by_client.get(conn.client_host)
        if per_client is not None:
            per_client.pop(conn, None)
            if not per_client:
                del self.idle_by_client[conn.client_host]

    def closed(self, conn: GuardedConnection) -> None:
        self.became_busy(conn)
        self.connections.discard(conn)

    def _sweep_idle(self, loop) -> None:
        self._sweep = None
        old_enough = loop.time() - self.limits.idle_grace_s
        for per_client in list(self.idle_by_client.values()):
            while len(per_client) > self.limits.max_idle_per_client and self._evict_oldest(
                per_client, old_enough
            ):
                pass
        while len(self.idle) > self.limits.max_idle and self._evict_oldest(self.idle, old_enough):
            pass
        still_over = len(self.idle) > self.limits.max_idle or any(
            len(c) > self.limits.max_idle_per_client for c in self.idle_by_client.values()
        )
        if still_over:  # young sockets: look again when they are old enough
            self._sweep = loop.call_later(self.limits.idle_grace_s, self._sweep_idle, loop)

    def _evict_oldest(self, idle: OrderedDict[GuardedConnection, float], idle_before: float | None) -> bool:
        if not idle:
            return False
        oldest, since = next(iter(idle.items()))
        if idle_before is not None and since > idle_before:
            return False
        self.evicted_idle += 1
        oldest.close_quietly()  # also takes it off the idle lists
        return True


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with request deadlines and the idle-connection caps of ``guard``.

    Use :func:`guarded_protocol` to make the class for one server (the guard is a class attribute because
    uvicorn builds a protocol per connection from the class alone).
    """

    guard: ConnectionGuard

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.client_host = "?"
        self._deadline: asyncio.TimerHandle | None = None
        self._request_seen: RequestResponseCycle | None = None  # the cycle whose headers were last counted
        self._waiting_for: str | None = None  # "headers", "body" or None (the request is in)
        self._registered = False
        self.handshake: TlsHandshake | None = None  # the TLS handshake counted for it until now, if any

    def connection_made(self, transport) -> None:
        if self.handshake is not None:  # its handshake is done: it is counted as this connection from now
            self.handshake.finished()
        super().connection_made(transport)
        self.client_host = self.client[0] if self.client else "?"
        if not self.guard.opened(self):
            self.transport.close()  # every connection is busy: no room, and no request read from this one
            return
        self._registered = True
        self._wait_for("headers", self.guard.limits.header_timeout_s)

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._registered:
            self.guard.closed(self)
            self._registered = False
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if not self._registered or self.cycle is None:
            return
        if self.cycle is not self._request_seen:  # a new request's headers arrived
            self._request_seen = self.cycle
            if ambiguous_framing(self.cycle.scope):
                # RFC 9112 section 6.3: the server MUST close the connection after answering such a request,
                # whatever answers it, so bytes after it are never read as another request
                self.cycle.keep_alive = False
            self.guard.became_busy(self)
            self._wait_for("body", self.guard.limits.body_timeout_s)
        if self._waiting_for == "body" and (
            not self.cycle.more_body or self.conn.their_state is not h11.SEND_BODY
        ):
            self._waiting_for = None  # the whole request is in; answering it takes as long as it takes
            self._disarm()

    def on_response_complete(self) -> None:
        if self._registered and not self.transport.is_closing():
            self.guard.became_idle(self)
            self._wait_for("headers", self.guard.limits.header_timeout_s)
        super().on_response_complete()  # may start a pipelined request: handle_events marks it busy

    def close_quietly(self) -> None:
        """Close a connection that has no request in flight (evicted, or past its deadline)."""
        self._disarm()
        if self._registered:
            self.guard.closed(self)
            self._registered = False
        if not self.transport.is_closing():
            self.transport.close()

    def _wait_for(self, what: str, seconds: float) -> None:
        self._disarm()
        self._waiting_for = what
        self._deadline = self.loop.call_later(seconds, self._on_deadline)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _on_deadline(self) -> None:
        self._deadline = None
        self._waiting_for = None
        self.guard.closed_for_timeout += 1
        log.info("closed a connection from %s: its request did not arrive in time", self.client_host)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # a body that never finished: the app sees the client go away
            self.cycle.message_event.set()
        self.close_quietly()


class TlsHandshake(asyncio.Protocol):
    """A TLS connection from its TCP accept to the end of its handshake, counted by the guard as an idle
    connection: capped per address and overall, evicted oldest first like any other, closed if the server is
    full of busy ones.

    asyncio's TLS server (``create_server(ssl=...)``) gives the protocol a connection only after its
    handshake, so the guard never saw sockets that never send a ClientHello, and they held file descriptors
    up to the process's limit. This protocol takes the plain socket instead and hands it to asyncio's own TLS
    layer (``sslproto.SSLProtocol``, as ``create_server`` does) with the handshake deadline; the HTTP
    protocol made by ``app_factory`` gets the TLS transport once the handshake is done and is counted from
    then on (:meth:`finished`).
    """

    def __init__(self, guard: ConnectionGuard, app_factory, sslcontext, timeout_s: float) -> None:
        self.guard = guard
        self.app_factory = app_factory
        self.sslcontext = sslcontext
        self.timeout_s = timeout_s
        self.loop = asyncio.get_running_loop()  # made by the loop's accept callback
        self.client_host = "?"
        self.transport: asyncio.Transport | None = None
        self._registered = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client_host = str(peer[0]) if peer else "?"
        if not self.guard.opened(self):
            transport.close()  # every connection is busy with a request: no room for a new one
            return
        self._registered = True
        self.guard.handshakes += 1
        app = self.app_factory()
        if isinstance(app, GuardedH11Protocol):
            app.handshake = self
        handshake_done = self.loop.create_future()
        handshake_done.add_done_callback(self._on_handshake_done)
        tls = sslproto.SSLProtocol(
            self.loop,
            app,
            self.sslcontext,
            handshake_done,
            server_side=True,
            # Seconds, a float as asyncio's own servers pass it; typeshed says int.
            ssl_handshake_timeout=self.timeout_s,  # type: ignore[arg-type]
        )
        # From now on the socket's bytes go to the TLS layer, which calls app.connection_made after the
        # handshake (before it passes on any request bytes) or closes the socket at the deadline.
        transport.set_protocol(tls)
        tls.connection_made(transport)

    def finished(self) -> None:
        """The handshake is over (done, failed, or the socket closed): no longer counted as this."""
        if self._registered:
            self._registered = False
            self.guard.handshakes -= 1
            self.guard.closed(self)

    def _on_handshake_done(self, handshake_done: asyncio.Future) -> None:
        if not handshake_done.cancelled():
            handshake_done.exception()  # a failed handshake is the client's business: retrieved, not logged
        self.finished()

    def connection_lost(self, exc) -> None:  # only before the TLS layer took the socket
        self.finished()

    def close_quietly(self) -> None:
        """Close a connection still in its handshake (evicted as the oldest idle one)."""
        self.finished()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def within_file_limit(
    limits: ConnectionLimits, file_limit: int, files_open: int
) -> tuple[ConnectionLimits, int]:
    """``limits`` with its connection caps below the process's open-file limit, and the files kept spare.

    Each connection is a file; the files already open (libraries, the listening socket, logs) and a spare
    share (a quarter of the limit, at most 256: a job's model files, the GPU driver, and the sockets asyncio
    accepts in one batch before the caps close the oldest) stay out of the count, so a flood of sockets that
    reaches the cap never takes the files a token holder's connection or a job needs.
    """
    spare = min(256, file_limit // 4)
    most = max(8, file_limit - files_open - spare)
    capped = dataclasses.replace(
        limits,
        max_connections=min(limits.max_connections, most),
        max_idle=min(limits.max_idle, max(4, most // 4)),
    )
    return capped, spare


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` sharing one :class:`ConnectionGuard`."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": ConnectionGuard(limits)})


def uvicorn_options(limits: ConnectionLimits) -> dict:
    """The ``uvicorn.Config``/``uvicorn.run`` keyword arguments that put these limits in place."""
    return {
        "http": guarded_protocol(limits),
        "limit_concurrency": None,  # it counts connections; InFlightLimit counts requests instead
        "timeout_keep_alive": limits.keep_alive_s,
        # headers still incomplete past this: 400 from h11; a complete head over it: 400 from RequestGate
        "h11_max_incomplete_event_size": limits.max_header_bytes,
    }


class InFlightLimit:
    """ASGI middleware: requests being answered at once are bounded over all, per client and per address;
    beyond a bound, 503 at once.

    With several clients (``--tokens-file``) each has its own share, ``limit // clients``: one client's
    requests that hold their slot (headers sent, body never) cannot take the slots of the others. Every
    source address has its share too (``per_address``), so on a single-token server, which is one client,
    one address cannot take every slot; that client's other addresses and the server's own answers go on.
    """

    def __init__(
        self, app, limit: int, clients: int = 1, per_address: int | None = None, retry_after_s=None
    ) -> None:
        self.app = app
        self.limit = limit
        # seconds a 503 asks a client to wait: when the first running job ends and its streams free their
        # slots (JobManager.next_end_s); 5 without a job manager
        self.retry_after_s = retry_after_s or (lambda: 5)
        self.per_client = max(1, limit // clients) if clients > 1 else limit
        self.per_address = max(1, min(limit, per_address or limit))
        self.in_flight = 0
        self.by_client: dict[str, int] = {}
        self.by_address: dict[str, int] = {}
        self.refused = {"all": 0, "client": 0, "address": 0}

    def _full(self, client: str, address: str) -> str | None:
        if self.in_flight >= self.limit:
            return "all"
        if self.by_client.get(client, 0) >= self.per_client:
            return "client"
        if self.by_address.get(address, 0) >= self.per_address:
            return "address"
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = str((scope.get("state") or {}).get("client", ""))
        address = scope["client"][0] if scope.get("client") else "?"
        full = self._full(client, address)
        if full is not None:
            self.refused[full] += 1
            retry_after_s = int(self.retry_after_s())
            message = {
                "all": f"the server is busy; try again in about {retry_after_s} s",
                "client": f"this client has {self.per_client} requests in flight, its share; finish some first",
                "address": f"this address has {self.per_address} requests in flight, its share; finish some first",
            }[full]
            response = JSONResponse(
                wire.error_body(message, "BackendUnavailable"),
                status_code=503,
                headers={"Retry-After": str(retry_after_s)},
            )
            await response(scope, receive, send)
            return
        self.in_flight += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        self.by_address[address] = self.by_address.get(address, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            for counts, key in ((self.by_client, client), (self.by_address, address)):
                counts[key] -= 1
                if not counts[key]:
                    del counts[key]


#: Seconds between two log lines of one kind of accept error (the rest are counted, not logged).
LOG_EVERY_S = 10.0


class OncePerKind(logging.Filter):
    """A logging filter: one line per kind of record per ``every_s``, without its traceback; the next one
    of that kind says how many were left out. Installed on asyncio's logger, whose accept loop logs every
    failed ``accept()`` with a traceback (about 500k of them, 200+ MB, under a TLS socket flood at the file
    limit)."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = str(record.msg)[:80]
        if record.exc_info and record.exc_info[1] is not None:
            kind += " " + type(record.exc_info[1]).__name__ + str(getattr(record.exc_info[1], "errno", ""))
        now = time.monotonic()
        if now - self._last.get(kind, -1e9) < self.every_s:
            self._dropped[kind] = self._dropped.get(kind, 0) + 1
            return False
        self._last[kind] = now
        dropped = self._dropped.pop(kind, 0)
        error = record.exc_info[1] if record.exc_info else None
        text = record.getMessage() + (f": {type(error).__name__}: {error}" if error else "")
        if dropped:
            text += f" ({dropped} more like it in the last {self.every_s:g} s not logged)"
        record.msg, record.args, record.exc_info, record.exc_text = " ".join(text.split()), (), None, None
        return True


def quiet_accept_errors(every_s: float = LOG_EVERY_S) -> OncePerKind:
    """Install :class:`OncePerKind` on asyncio's logger (once) and return it."""
    logger = logging.getLogger("asyncio")
    for existing in logger.filters:
        if isinstance(existing, OncePerKind):
            return existing
    once = OncePerKind(every_s)
    logger.addFilter(once)
    return once


class GuardedServer(uvicorn.Server):
    """``uvicorn.Server`` whose TLS connections are counted from their TCP accept (:class:`TlsHandshake`),
    and whose handshakes must end within ``handshake_timeout_s``: uvicorn leaves asyncio's 60 s, in which
    sockets that never start a handshake hold a file descriptor each."""

    handshake_timeout_s: float = ConnectionLimits.header_timeout_s

    async def startup(self, sockets=None) -> None:
        quiet_accept_errors()
        loop = asyncio.get_running_loop()
        if not self.config.is_ssl:
            await super().startup(sockets)
            return
        original = loop.create_server
        guard = getattr(self.config.http_protocol_class, "guard", None)
        timeout_s = self.handshake_timeout_s

        def create_server(protocol_factory, *args, ssl=None, **kwargs):
            if ssl is None:
                return original(protocol_factory, *args, **kwargs)
            if not isinstance(guard, ConnectionGuard) or not isinstance(loop, asyncio.BaseEventLoop):
                # not our protocol, or a loop with its own TLS layer (uvloop): only the deadline
                return original(protocol_factory, *args, ssl=ssl, ssl_handshake_timeout=timeout_s, **kwargs)
            counted = functools.partial(TlsHandshake, guard, protocol_factory, ssl, timeout_s)
            return original(counted, *args, **kwargs)  # TLS is TlsHandshake's, after the accept

        try:
            loop.create_server = create_server  # type: ignore[method-assign]
        except AttributeError:  # a loop whose methods cannot be replaced: asyncio's own timeout applies
            await super().startup(sockets)
            return
        try:
            await super().startup(sockets)
        finally:
            del loop.create_server  # the instance attribute: the class's method again
