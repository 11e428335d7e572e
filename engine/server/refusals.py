"""How errors are answered: every refusal, HTTP error, engine error and malformed body as an ``ErrorBody``.

Replies are short and never echo a request back (a malformed body is described by where and what only).
"""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from engine import wire
from engine.errors import BackendUnavailable, EngineError
from engine.server.schemas import Refused


def add_error_handlers(app: FastAPI) -> None:
    """Answer ``Refused``, ``HTTPException``, ``EngineError`` and validation errors as ``ErrorBody``."""

    @app.exception_handler(Refused)
    async def refused(_request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse(
            wire.error_body(exc.detail, exc.error_class), exc.status_code, headers=exc.headers
        )

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(wire.error_body(str(exc.detail)), exc.status_code, headers=exc.headers)

    @app.exception_handler(EngineError)
    async def engine_error(_request: Request, exc: EngineError) -> JSONResponse:
        status = 503 if isinstance(exc, BackendUnavailable) else 422
        return JSONResponse(wire.error_body(str(exc), type(exc).__name__), status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # Only where and what, never the input: a reply must not echo a (large) request back.
        problems = []
        for error in exc.errors()[:5]:
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
            if error.get("type") == "extra_forbidden":
                problems.append(f"unknown request field {wire.short(where, 80)!r}")
            else:
                problems.append(f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", "")))
        message = "; ".join(problems) or "the body does not match the schema"
        return JSONResponse(wire.error_body(f"malformed request: {message}", "InvalidRequest"), 422)
