"""The engine server's wire format: the one codec shared by ``engine.server`` and the remote client.

Everything that crosses the network is encoded and decoded here, so the server and the client
(``engine.backends.remote``) cannot drift apart, and the client never imports the server or FastAPI
(an import-linter contract in pyproject.toml keeps it so).

* Requests: a ``SamplingRequest`` as JSON (``encode_request`` / ``decode_request``).
* Job events: one JSON object per line (``encode_event`` / ``decode_event``). Stored events are numbered
  from 0 and ``GET /jobs/{id}/events?since=N`` resumes at N: ``queued`` (one each time the job's place in
  line changes: ``queued_event``), ``progress`` (with an optional base64 ``.npy`` preview), then one
  terminal event, ``result`` (provenance, affine, the request as run),
  ``error`` (engine error class + message) or ``cancelled``. Two events belong to one stream only and are
  never counted by ``since``: ``keepalive`` (sent while a job is quiet) and ``reconnect`` (the stream ends;
  open a new one with the ``since`` it gives).
* Volumes: a ``.npy`` file, never pickled (``encode_volumes`` / ``decode_volumes``).
* Errors: ``{"detail": message, "error_class": name}`` bodies and ``error`` events, decoded back into the
  same ``EngineError`` subclass on the client.
* TLS: certificate fingerprints (SHA-256 of the DER certificate) in one spelling, ``AB:CD:...``.

Nothing here imports torch, FastAPI or pydantic.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from engine import errors
from engine.api import Progress, SamplingRequest, SamplingResult
from engine.errors import EngineError, InvalidRequest
from engine.formatting import ordinal, rough_duration

QUEUED = "queued"
PROGRESS = "progress"
RESULT = "result"
ERROR = "error"
CANCELLED = "cancelled"
KEEPALIVE = "keepalive"
RECONNECT = "reconnect"
TERMINAL = (RESULT, ERROR, CANCELLED)
STREAM_ONLY = (KEEPALIVE, RECONNECT)  # sent on one stream, never stored, not counted by ``since``
MAX_MESSAGE_CHARS = 500  # error messages on the wire are cut here: a reply never echoes a large input
NDJSON = "application/x-ndjson"
NPY = "application/octet-stream"


class WireError(EngineError):
    """The other side sent something this codec cannot read."""


# -- arrays -------------------------------------------------------------------------------------------


def encode_volumes(array: np.ndarray) -> bytes:
    """An array as the bytes of a ``.npy`` file (no pickle)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def decode_volumes(raw: bytes) -> np.ndarray:
    try:
        return np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise WireError(f"the engine server sent an unreadable volume file ({exc})") from exc


def encode_array(array: np.ndarray) -> str:
    """A small array (a preview) as base64 ``.npy`` text, for JSON events."""
    return base64.b64encode(encode_volumes(array)).decode("ascii")


def decode_array(text: str) -> np.ndarray:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise WireError(f"the engine server sent an unreadable array ({exc})") from exc
    return decode_volumes(raw)


# -- requests -----------------------------------------------------------------------------------------


def encode_request(request: SamplingRequest) -> str:
    return request.to_json()


def decode_request(data: Any) -> SamplingRequest:
    """A ``SamplingRequest`` from decoded JSON; anything malformed is ``InvalidRequest``."""
    if not isinstance(data, Mapping):
        raise InvalidRequest(f"a job request is a JSON object, got {type(data).__name__}")
    try:
        return SamplingRequest.from_dict(data)
    except TypeError as exc:  # e.g. a nested field of the wrong kind
        raise InvalidRequest(f"malformed request: {short(str(exc))}") from exc


# -- events -------------------------------------------------------------------------------------------


def encode_event(event: Mapping[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":")) + "\n"


def decode_event(line: str | bytes) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"the engine server sent a malformed event ({short(str(exc))})") from exc
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise WireError("the engine server sent an event without a type")
    return event


def queued_event(
    place: int | None = None, wait_s: float | None = None, job_s: float | None = None
) -> dict[str, Any]:
    """A ``queued`` event: the job waits to start. The server sends one when the job is queued and another
    each time its place changes: ``place`` (1: the next to start), ``wait_s`` (the server's estimate of the
    seconds until it starts), ``job_s`` (the job time the estimate takes, the median of recent jobs) and a
    ``message`` for people. A server before these fields sent ``{"type": "queued"}`` only."""
    event: dict[str, Any] = {"type": QUEUED}
    if place is not None:
        event["place"] = int(place)
        event["wait_s"] = round(float(wait_s or 0.0), 1)
        if job_s is not None:
            event["job_s"] = round(float(job_s), 1)
        event["message"] = queue_message(place, wait_s or 0.0)
    return event


def queue_message(place: int, wait_s: float) -> str:
    """``queued, 3rd in line, about 2 min``; ``queued, next to start`` when nothing is ahead."""
    if place <= 1 and wait_s < 1:
        return "queued, next to start"
    return f"queued, {ordinal(place)} in line, about {rough_duration(wait_s)}"


def queue_place(event: Mapping[str, Any]) -> tuple[int, float] | None:
    """(place, wait_s) of a ``queued`` event, None for one without them (an older server's)."""
    place, wait_s = event.get("place"), event.get("wait_s", 0.0)
    if isinstance(place, bool) or not isinstance(place, int) or place < 1:
        return None
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not 0 <= wait_s < 1e7:
        return None
    return place, float(wait_s)


def cancelled_event() -> dict[str, Any]:
    return {"type": CANCELLED}


def keepalive_event() -> dict[str, Any]:
    return {"type": KEEPALIVE}


def reconnect_event(since: int) -> dict[str, Any]:
    return {"type": RECONNECT, "since": since}


def progress_event(progress: Progress) -> dict[str, Any]:
    event = {
        "type": PROGRESS,
        "stage": progress.stage,
        "step": progress.step,
        "total": progress.total,
        "elapsed_s": progress.elapsed_s,
        "message": progress.message,
    }
    if progress.preview is not None:
        event["preview"] = encode_array(progress.preview)
        event["preview_stride"] = int(progress.preview_stride)
    return event


def progress_from_event(event: Mapping[str, Any]) -> Progress:
    try:
        preview = decode_array(event["preview"]) if "preview" in event else None
        return Progress(
            str(event["stage"]),
            int(event["step"]),
            int(event["total"]),
            float(event["elapsed_s"]),
            str(event.get("message", "")),
            preview,
            max(1, int(event.get("preview_stride", 1))),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"the engine server sent a malformed progress event ({exc!r})") from exc


def result_event(result: SamplingResult) -> dict[str, Any]:
    """The result without its volumes (those travel as ``.npy``: ``GET /jobs/{id}/volumes``)."""
    return {
        "type": RESULT,
        "provenance": result.provenance,
        "affine": np.asarray(result.affine, dtype=np.float64).tolist(),
        "request": result.request.to_dict(),
        "shape": list(result.volumes.shape),
    }


def result_from_event(event: Mapping[str, Any], volumes: np.ndarray, server: str) -> SamplingResult:
    """The client's ``SamplingResult``: the server's record, marked as run remotely on ``server``."""
    try:
        affine = np.asarray(event["affine"], dtype=np.float64)
        provenance = dict(event["provenance"])
        request = SamplingRequest.from_dict(event["request"])
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"the engine server sent a malformed result ({short(str(exc))})") from exc
    if affine.shape != (4, 4):
        raise WireError(f"the engine server sent an affine of shape {affine.shape}, not 4x4")
    expected = event.get("shape")
    if expected is not None and list(volumes.shape) != list(expected):
        raise WireError(f"the engine server sent volumes of shape {volumes.shape}, announced {expected}")
    names = provenance.get("label_channels")
    if names is not None and (
        not isinstance(names, list) or len(names) + 1 != (volumes.shape[1] if volumes.ndim > 1 else 0)
    ):
        raise WireError(
            f"the engine server named {len(names) if isinstance(names, list) else 'malformed'} tissue maps "
            f"for volumes of {volumes.shape[1]} channels"
        )
    # What ran the job on the server (local torch or xla) stays on record beside how it was reached.
    if "backend" in provenance:
        provenance["server_backend"] = provenance["backend"]
    provenance["backend"] = "remote"
    provenance["server"] = server
    return SamplingResult(volumes=volumes, affine=affine, request=request, provenance=provenance)


def error_event(exc: BaseException) -> dict[str, Any]:
    """An ``error`` event: the engine error's class and message; anything else is reported, not raised."""
    if isinstance(exc, EngineError):
        return {"type": ERROR, "error_class": type(exc).__name__, "message": short(str(exc))}
    return {
        "type": ERROR,
        "error_class": "EngineError",
        "message": short(f"the engine server failed: {type(exc).__name__}: {exc}"),
    }


def error_class(name: Any) -> type[EngineError]:
    """The ``EngineError`` subclass called ``name``; the base class for anything else."""
    cls = getattr(errors, str(name), EngineError)
    return cls if isinstance(cls, type) and issubclass(cls, EngineError) else EngineError


def error_from_event(event: Mapping[str, Any]) -> EngineError:
    message = short(str(event.get("message", "the server reported an error")))
    return error_class(event.get("error_class"))(f"{message} (on the engine server)")


def error_body(message: str, error_class_name: str = "EngineError") -> dict[str, str]:
    """The JSON body of every refusal the server sends (4xx)."""
    return {"detail": short(message), "error_class": error_class_name}


def detail_of(body: Any) -> str:
    """The message of an error body, whatever shape it came in (ours, FastAPI's, or none)."""
    detail = body.get("detail") if isinstance(body, Mapping) else None
    if isinstance(detail, str):
        return short(detail)
    if isinstance(detail, list):  # FastAPI's validation list: "loc: msg" per problem
        parts = []
        for item in detail[:5]:
            if isinstance(item, Mapping):
                loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
                parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
        return short("; ".join(parts)) or "the server refused the request"
    return "the server refused the request"


def short(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


# -- addresses and TLS certificate fingerprints ------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1: traffic that never leaves this machine (no name is resolved)."""
    host = str(host).strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def certificate_fingerprint(der: bytes) -> str:
    """SHA-256 of a DER certificate as ``AB:CD:...`` (what ``volsynth serve`` prints and clients pin)."""
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def normalise_fingerprint(text: str) -> str:
    """``ab:cd...``, ``ABCD...``, ``sha256:AB CD ...`` -> ``AB:CD:...``; anything else is refused."""
    hex_digits = re.sub(r"[\s:]", "", str(text).strip().removeprefix("sha256:").removeprefix("SHA256:"))
    if not re.fullmatch(r"[0-9a-fA-F]{64}", hex_digits):
        raise InvalidRequest(
            "a certificate fingerprint is the SHA-256 that `volsynth serve` prints: 64 hex digits, "
            "e.g. 3F:A2:...; copy it from the server's output"
        )
    hex_digits = hex_digits.upper()
    return ":".join(hex_digits[i : i + 2] for i in range(0, 64, 2))
