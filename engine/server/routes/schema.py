"""``GET /openapi.json`` (with the models a job may name, as they are now) and ``GET /docs``."""

from __future__ import annotations

import contextlib
import copy

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from engine.errors import EngineError
from engine.server.allowed_models import registered_model_ids


def add_schema_routes(app: FastAPI, backend) -> None:
    """The schema and its Swagger page, served here (not by FastAPI) so that they sit behind the token."""

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        schema = copy.deepcopy(app.openapi())
        with contextlib.suppress(EngineError, OSError):  # the schema stays usable without the list
            ids = registered_model_ids(backend)
            if ids:  # the models a job may name, as they are now
                from engine.models.registry import DEFAULT_MODEL_ID

                job_schema = schema["components"]["schemas"]["JobRequest"]
                if DEFAULT_MODEL_ID in ids:
                    job_schema["properties"]["model"]["enum"] = ["", *ids]
                else:  # no default model here: a job must name one
                    job_schema["properties"]["model"]["enum"] = ids
                    job_schema["required"] = ["model"]
        return JSONResponse(schema)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="VolSynth engine server")
