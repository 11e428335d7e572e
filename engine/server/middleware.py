"""ASGI middleware of the engine server: request bodies over the limit are answered 413 before parsing.

(The in-flight request limit is :class:`engine.server.connections.InFlightLimit`, with the other
connection limits.)
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from engine import wire


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
