"""``POST /plan``: how a model's denoising step splits over a multi-device topology (engine.xla.planning)."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder

from engine.server.allowed_models import check_model
from engine.server.schemas import ERRORS, ErrorBody, PlanRequest, Refused


def add_plan_route(app: FastAPI, backend) -> None:
    """One plan at a time per server; a second is answered 429 while the first runs."""
    planning = threading.Lock()  # one plan at a time: each compiles several programs on the server's CPUs

    @app.post(
        "/plan",
        operation_id="plan",
        responses={**ERRORS, 503: {"model": ErrorBody, "description": "no JAX on this server"}},
    )
    def plan(body: PlanRequest) -> dict[str, Any]:
        from engine.xla.planning import BUNDLE_MODEL, plan_model

        if body.model != BUNDLE_MODEL:
            check_model(backend, body.model)
        if not planning.acquire(blocking=False):
            raise Refused(
                429, "the engine server is planning already; try again when it finishes", "BackendUnavailable"
            )
        try:
            result = plan_model(
                body.model,
                body.topology,
                batch=body.batch,
                cfg=body.cfg,
                compile_top=body.compile_top,
                time_limit_s=body.time_limit_s,
                whole_compile=body.whole_compile,
                registry=getattr(backend, "registry", None),
            )
        finally:
            planning.release()
        return jsonable_encoder(result.to_dict())
