"""Run requests on a VolSynth engine server (``volsynth serve``) over HTTP.

The generator contract is the same as the local backend's: iterate for ``Progress``, get the
``SamplingResult`` from ``StopIteration``; closing the generator cancels the job on the server.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Generator
from typing import Any

import numpy as np

from engine import errors
from engine.api import BackendInfo, Progress, SamplingRequest, SamplingResult
from engine.errors import BackendUnavailable, EngineError


def _error_from_event(event: dict[str, Any]) -> EngineError:
    cls = getattr(errors, str(event.get("error_class", "")), EngineError)
    if not (isinstance(cls, type) and issubclass(cls, EngineError)):
        cls = EngineError
    return cls(f"{event.get('message', 'the server reported an error')} (on the engine server)")


class RemoteBackend:
    name = "remote"

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0):
        import httpx

        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, **kwargs):
        import httpx

        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(
                f"cannot reach the engine server at {self.url} ({exc}); check the address "
                "and that `volsynth serve` is running"
            ) from exc
        if response.status_code == 401:
            raise BackendUnavailable(f"the engine server at {self.url} refused the token; check --token")
        if response.status_code == 422:
            raise errors.InvalidRequest(response.json().get("detail", "the server refused the request"))
        if response.status_code >= 400:
            raise BackendUnavailable(
                f"the engine server answered {response.status_code}: {response.text[:200]}"
            )
        return response

    def info(self) -> BackendInfo:
        data = self._call("GET", "/info").json()
        return BackendInfo(
            name=self.name,
            device=f"{self.url} ({data['device']})",
            device_name=data["device_name"],
            details=data.get("details", {}),
        )

    def models(self) -> list[dict[str, Any]]:
        return self._call("GET", "/models").json()

    def metrics(self) -> dict[str, Any] | None:
        try:
            return self._call("GET", "/metrics").json()
        except BackendUnavailable:
            return None

    def sample(self, request: SamplingRequest) -> Generator[Progress, None, SamplingResult]:
        import httpx

        from engine.server import decode_array

        job_id = self._call("POST", "/jobs", content=request.to_json()).json()["id"]
        finished = False
        try:
            try:
                with self._client.stream("GET", f"/jobs/{job_id}/events", timeout=None) as stream:
                    for line in stream.iter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        kind = event["type"]
                        if kind == "progress":
                            preview = decode_array(event["preview"]) if "preview" in event else None
                            yield Progress(
                                event["stage"],
                                event["step"],
                                event["total"],
                                event["elapsed_s"],
                                event.get("message", ""),
                                preview,
                            )
                        elif kind == "error":
                            finished = True
                            raise _error_from_event(event)
                        elif kind == "cancelled":
                            finished = True
                            raise errors.Cancelled("the job was cancelled on the engine server")
                        elif kind == "result":
                            finished = True
                            result_event = event
                            break
            except httpx.HTTPError as exc:
                raise BackendUnavailable(
                    f"lost the connection to the engine server at {self.url} ({exc})"
                ) from exc
            if not finished:
                raise BackendUnavailable(f"the engine server at {self.url} closed the job stream early")
            raw = self._call("GET", f"/jobs/{job_id}/volumes").content
            volumes = np.load(io.BytesIO(raw), allow_pickle=False)
            provenance = dict(result_event["provenance"])
            provenance["backend"] = "remote"
            provenance["server"] = self.url
            return SamplingResult(
                volumes=volumes,
                affine=np.asarray(result_event["affine"], dtype=np.float64),
                request=SamplingRequest.from_dict(result_event["request"]),
                provenance=provenance,
            )
        finally:
            if not finished:  # closed by the caller (cancel) or failed mid-way: stop the server's work too
                with contextlib.suppress(httpx.HTTPError):
                    self._client.delete(f"/jobs/{job_id}")
