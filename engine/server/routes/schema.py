"""``GET /openapi.json``: the schema, with the bearer security scheme and the models a job may name.

There is no ``/docs`` page. FastAPI's Swagger page loads its scripts from a CDN (nothing offline), and a
browser opening a page sends no bearer token, so behind the token it could not even load; served without
the token it would still need the token to fetch the schema. Any OpenAPI tool given the token reads the
schema instead (``components.securitySchemes.bearer`` says how to send it).
"""

from __future__ import annotations

import contextlib
import copy

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from engine.errors import EngineError
from engine.server.allowed_models import registered_model_ids

#: The security scheme every route is under when the server has a token (RFC 6750 bearer).
BEARER = "bearer"


def add_schema_routes(app: FastAPI, backend, secured: bool) -> None:
    """The schema, served here (not by FastAPI) so that it sits behind the token like every route.

    ``secured``: the server has tokens; every operation then declares the bearer scheme.
    """

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        schema = copy.deepcopy(app.openapi())
        if secured:
            add_bearer_security(schema)
        with contextlib.suppress(EngineError, OSError):  # the schema stays usable without the list
            ids = registered_model_ids(backend)
            if ids:  # the models a job may name, as they are now
                from engine.models.registry import DEFAULT_MODEL_ID

                job_schema = schema["components"]["schemas"]["JobRequest"]
                if DEFAULT_MODEL_ID in ids:
                    job_schema["properties"]["model"]["enum"] = ["", *ids]
                else:  # no default model here: a job must name one (and "" is no default)
                    job_schema["properties"]["model"]["enum"] = ids
                    job_schema["properties"]["model"].pop("default", None)
                    job_schema["required"] = ["model"]
        return JSONResponse(schema)


def add_bearer_security(schema: dict) -> None:
    """Declare the bearer scheme and put every operation under it (the token gate checks them all)."""
    schema.setdefault("components", {}).setdefault("securitySchemes", {})[BEARER] = {
        "type": "http",
        "scheme": "bearer",
        "description": "the server's token (volsynth serve --token, or one line of --tokens-file); "
        "jobs belong to the token that submitted them",
    }
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                operation["security"] = [{BEARER: []}]
