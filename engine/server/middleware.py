"""ASGI middleware of the engine server, outermost first:

* :class:`RequestGate`: headers over the limit get 400 and a request without a right token its 401/429,
  on the headers alone: before anything reads its body and before it counts as in flight;
* :class:`engine.server.connections.InFlightLimit` (with the other connection limits): requests of
  token holders being answered, 503 beyond the limit;
* :class:`BodyLimit`: request bodies over the limit are answered 413 before parsing.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from engine import wire
from engine.server.auth import AuthRefusal, TokenGate


def head_bytes(scope) -> int:
    """The size of a request's line and headers as they came (``GET /p?q HTTP/1.1`` + ``name: value``)."""
    size = len(scope.get("method", "")) + len(scope.get("raw_path") or b"") + 12
    size += len(scope.get("query_string") or b"") + 1
    return size + sum(len(name) + len(value) + 4 for name, value in scope.get("headers") or [])


def ambiguous_framing(scope) -> bool:
    """Whether a request carries both ``Content-Length`` and ``Transfer-Encoding`` (h11 takes the latter)."""
    names = {name for name, _ in scope.get("headers") or []}
    return b"content-length" in names and b"transfer-encoding" in names


async def send_refusal(send, status: int, message: str, error_class: str, headers=()) -> None:
    """An ``ErrorBody`` answer that closes the connection: whatever body the request still has is never read."""
    response = JSONResponse(
        wire.error_body(message, error_class),
        status_code=status,
        headers={**dict(headers), "Connection": "close"},
    )
    await send({"type": "http.response.start", "status": status, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


async def _disconnected(receive) -> None:
    """Ends when the client goes away. Only awaited for a wrong guess, whose body is never used: any
    body it sends is dropped here."""
    while (await receive())["type"] != "http.disconnect":
        pass


class RequestGate:
    """ASGI middleware (outermost): the header size limit and the token, judged on the headers alone.

    uvicorn's ``h11_max_incomplete_event_size`` caps only headers still *incomplete* in its buffer: a head
    of any size that arrives in one segment is parsed whole. So the limit is checked here too, on what
    was parsed. The client a request comes from (``TokenGate.admit``) is put in ``scope["state"]["client"]``
    for the routes: jobs belong to it.
    """

    def __init__(self, app, gate: TokenGate, max_header_bytes: int) -> None:
        self.app = app
        self.gate = gate
        self.max_header_bytes = max_header_bytes
        self.refused_headers = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if head_bytes(scope) > self.max_header_bytes:
            self.refused_headers += 1
            await send_refusal(
                send,
                400,
                f"the request's headers are over {self.max_header_bytes // 1024} kB",
                "InvalidRequest",
            )
            return
        if ambiguous_framing(scope):
            # RFC 9112 section 6.3: both framings may be a smuggling attempt (a proxy in front may read the
            # other one); answered here, and the connection closes after it (Connection: close).
            await send_refusal(
                send,
                400,
                "the request has both Content-Length and Transfer-Encoding; send one of them",
                "InvalidRequest",
            )
            return
        authorization = None
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                authorization = value
                break
        host = scope["client"][0] if scope.get("client") else "?"
        verdict = await self.gate.admit(host, authorization, gone=lambda: _disconnected(receive))
        if verdict is None:
            return  # a wrong guess whose client left while it waited: nobody to answer
        if isinstance(verdict, AuthRefusal):
            await send_refusal(send, verdict.status, verdict.message, verdict.error_class, verdict.headers)
            return
        scope.setdefault("state", {})["client"] = verdict
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is answered 413 before anything parses it.

    Bodies are small (a request is < 2 kB), so the body is read here, up to the limit, and replayed.
    """

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        response = JSONResponse(
            wire.error_body(f"the request body is over {self.limit} bytes", "InvalidRequest"),
            status_code=413,
            headers={"Connection": "close"},
        )
        await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})
