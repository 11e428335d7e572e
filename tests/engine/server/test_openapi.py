"""The engine server's OpenAPI schema as third-party tools read it (issue 36, point 5): valid by
openapi-spec-validator, with the bearer security scheme on every operation, response schemas for the
binary volumes and the event stream, and a client driven by the schema alone (operation ids, the
declared security scheme, the declared content types) running a generation on the tiny model.

Before: no ``securitySchemes`` (generators and UIs did not know a token was needed), ``/docs`` loaded
Swagger UI from a CDN, and ``GET /jobs/{id}/volumes`` had no response schema (a generated client
returned None).
"""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
from openapi_spec_validator import validate

from engine.backends.local import LocalBackend
from engine.server import create_app, new_token
from engine.testing import ServerThread

TOKEN = new_token()


class SchemaClient:
    """Calls operations by id, sending the credentials the way the schema's security scheme says."""

    def __init__(self, url: str, schema: dict, credentials: dict[str, str]) -> None:
        self.http = httpx.Client(base_url=url, timeout=60)
        self.schema = schema
        self.credentials = credentials
        self.operations = {
            op["operationId"]: (path, method, op)
            for path, ops in schema["paths"].items()
            for method, op in ops.items()
            if "operationId" in op
        }

    def _auth(self, operation: dict) -> dict[str, str]:
        headers = {}
        for requirement in operation.get("security", self.schema.get("security", [])):
            for name in requirement:
                scheme = self.schema["components"]["securitySchemes"][name]
                assert scheme["type"] == "http" and scheme["scheme"].lower() == "bearer", scheme
                headers["Authorization"] = f"Bearer {self.credentials[name]}"
        return headers

    def call(self, operation_id: str, body=None, **path_params) -> httpx.Response:
        path, method, operation = self.operations[operation_id]
        response = self.http.request(
            method.upper(), path.format(**path_params), json=body, headers=self._auth(operation)
        )
        assert response.status_code == 200, response.text
        declared = operation["responses"]["200"]["content"]
        media = response.headers["content-type"].split(";")[0]
        assert media in declared and "schema" in declared[media], (operation_id, media, declared)
        return response


def test_the_schema_validates_declares_bearer_security_and_drives_a_generation(registry):
    app = create_app(LocalBackend("cpu", registry), token=TOKEN)
    with ServerThread(app) as url:
        schema = httpx.get(
            f"{url}/openapi.json", headers={"Authorization": f"bearer {TOKEN}"}, timeout=30
        ).json()
        validate(schema)  # openapi-spec-validator: raises on an invalid document
        assert schema["components"]["securitySchemes"]["bearer"] == {
            **schema["components"]["securitySchemes"]["bearer"],
            "type": "http",
            "scheme": "bearer",
        }
        operations = [op for ops in schema["paths"].values() for op in ops.values()]
        assert operations and all(op["security"] == [{"bearer": []}] for op in operations)
        volumes = schema["paths"]["/jobs/{job_id}/volumes"]["get"]["responses"]["200"]["content"]
        assert volumes["application/octet-stream"]["schema"] == {"type": "string", "format": "binary"}
        events = schema["paths"]["/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
        assert events["application/x-ndjson"]["schema"]["type"] == "string"

        client = SchemaClient(url, schema, {"bearer": TOKEN})
        job = client.call("submit", {"model": "tiny-pixel", "steps": 2, "seed": 7}).json()["id"]
        lines = [json.loads(line) for line in client.call("events", job_id=job).text.splitlines() if line]
        assert lines[-1]["type"] == "result", lines[-1]
        array = np.load(io.BytesIO(client.call("volumes", job_id=job).content))
        assert array.dtype == np.float32 and array.shape[:2] == (1, 1) and np.isfinite(array).all()


def test_a_server_without_a_token_declares_no_security(registry):
    with ServerThread(create_app(LocalBackend("cpu", registry))) as url:
        schema = httpx.get(f"{url}/openapi.json", timeout=30).json()
        validate(schema)
        assert "securitySchemes" not in schema.get("components", {})
