"""What the server is and has: ``GET /info`` (its backend), ``GET /models`` and ``GET /metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder

from engine.server.allowed_models import registered_sources
from engine.server.schemas import ERRORS, NOT_FOUND, InfoBody, Refused


def add_about_routes(app: FastAPI, backend, metrics_source) -> None:
    """``metrics_source`` (a telemetry ``Sampler``, or None: ``/metrics`` answers 404) is the server's own."""

    @app.get("/info", operation_id="info", response_model=InfoBody, responses={401: ERRORS[401]})
    def info() -> dict[str, Any]:
        details = backend.info()
        return {
            "name": details.name,
            "device": details.device,
            "device_name": details.device_name,
            "details": jsonable_encoder(details.details),
        }

    @app.get("/models", operation_id="models", responses={401: ERRORS[401]})
    def models() -> list[dict[str, Any]]:
        return [source.spec.to_dict() for source in registered_sources(backend) or []]

    @app.get("/metrics", operation_id="metrics", responses={401: ERRORS[401], **NOT_FOUND})
    def metrics() -> dict[str, Any]:
        if metrics_source is None:
            raise Refused(404, "this server does not report metrics")
        sample = metrics_source.latest()
        return sample.to_dict() if sample is not None else {}
