"""Qt-free side of engine-server connections: check a server, describe it, poll its metrics."""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from app.core.generation_form import REMOTE_PREFIX
from app.core.plan_table import xla_device_summary, xla_devices_of
from engine.errors import InvalidRequest

log = logging.getLogger(__name__)
METRICS_INTERVAL_S = 1.0


def normalise_url(text: str) -> str:
    """``host:8765`` -> ``http://host:8765``; refuses what cannot be an engine server's address."""
    text = text.strip().rstrip("/")
    if not text:
        raise InvalidRequest("enter the engine server's address, e.g. http://gpu-box:8765")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"{text!r} is not an http(s) address; use e.g. http://gpu-box:8765")
    if parts.path or parts.query or parts.fragment:
        raise InvalidRequest(
            f"{text!r} has a path; give only the scheme, host and port, e.g. http://gpu-box:8765"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
    except ValueError:
        raise InvalidRequest(f"{text!r} has an invalid port") from None
    return text


@dataclass
class ServerConnection:
    """What the app knows of a connected engine server."""

    url: str
    token: str | None
    device: str  # the server's device, e.g. "cuda:0"
    device_name: str
    model_ids: list[str] = field(default_factory=list)
    model_specs: list[dict] = field(default_factory=list)  # the server's specs (GET /models), as sent
    fingerprint: str | None = None  # the pinned SHA-256 of an https server's certificate
    details: dict = field(default_factory=dict)  # GET /info's details: versions, xla_devices, xla_topology...

    @property
    def device_id(self) -> str:
        return REMOTE_PREFIX + self.url

    @property
    def xla_devices(self) -> list[dict]:
        """The XLA devices of a ``volsynth serve --device xla`` server (id, platform, kind, coords); else []."""
        return xla_devices_of(self.details)

    @property
    def xla_topology(self) -> str | None:
        """The TPU slice the server's devices form, as the planner names it (``v5e:2x4``); else None."""
        value = self.details.get("xla_topology")
        return value if isinstance(value, str) and value else None

    @property
    def device_summary(self) -> str:
        """``xla:tpu TPU v5 lite ×8 (v5e:2x4)`` for an XLA server, ``cuda:0 NVIDIA H100`` for a torch one."""
        return xla_device_summary(self.xla_devices, self.xla_topology) or f"{self.device} {self.device_name}"

    @property
    def label(self) -> str:
        host = urlsplit(self.url).netloc
        return f"{host}  \u2013  {self.device_summary}".rstrip()


def check_connection_settings(url: str, token: str | None, fingerprint: str | None) -> tuple[str, str | None]:
    """The normalised address and fingerprint, or ``InvalidRequest`` with the client's refusal (a token over
    plain http to another machine, a fingerprint for an http address, a malformed fingerprint). Sends nothing.
    """
    from engine.backends.remote import check_connection

    return check_connection(normalise_url(url), token or None, fingerprint or None)


def probe_server(url: str, token: str | None, fingerprint: str | None = None) -> ServerConnection:
    """Ask the server who it is and which models it has (worker thread: it waits on the network).

    Raises ``BackendUnavailable`` (unreachable, refused token, certificate not the pinned one) or
    ``InvalidRequest`` (bad address, a token the client refuses to send in clear) with a message that
    says what to check.
    """
    from engine.backends import connect_server

    url, fingerprint = check_connection_settings(url, token, fingerprint)
    backend = connect_server(url, token=token or None, timeout_s=10.0, fingerprint=fingerprint)
    try:
        info = backend.info()
        models = backend.models()
    finally:
        backend.close()
    match = re.search(r"\(([^()]*)\)\s*$", info.device)  # "http://host:port (cuda:0)"
    return ServerConnection(
        url=url,
        token=token or None,
        device=match.group(1) if match else info.device,
        device_name=info.device_name,
        model_ids=[str(m.get("id", "")) for m in models],
        model_specs=[m for m in models if isinstance(m, dict)],
        fingerprint=fingerprint,
        details=dict(info.details) if isinstance(info.details, dict) else {},
    )


@dataclass(eq=False)
class RemoteModelSource:
    """A model that only an engine server has: listed in the model picker, run only on that server.

    Looks like ``engine.models.source.ModelSource`` where the app reads one (``id``, ``spec``, ``path``,
    ``model_card()``); it has no weights here. The spec's name says where the model lives.
    """

    spec: Any  # engine.models.spec.ModelSpec, as the server described it
    url: str

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def path(self) -> str:
        return self.url

    def model_card(self) -> str:
        return (
            f"# {self.spec.name}\n\nThis model is installed on the engine server {self.url}, not on this "
            f"computer; its model card is there (`volsynth models` on the server).\n\n{self.spec.description}"
        )


def remote_model_sources(
    connection: ServerConnection, local_ids: set[str]
) -> tuple[list[RemoteModelSource], list[str]]:
    """The server's models that this computer does not have, and the problems of specs that could not be read."""
    from dataclasses import replace

    from engine.errors import EngineError
    from engine.models.spec import ModelSpec

    host = urlsplit(connection.url).netloc
    sources, problems = [], []
    for data in connection.model_specs:
        if str(data.get("id", "")) in local_ids:
            continue  # the same id here: the server runs its copy, the picker shows ours
        try:
            spec = ModelSpec.from_dict(data)
        except (EngineError, KeyError, TypeError, ValueError) as exc:
            problems.append(f"{data.get('id', '?')}: {exc}")
            continue
        sources.append(RemoteModelSource(replace(spec, name=f"{spec.name} (on {host})"), connection.url))
    return sources, problems


class MetricsFeed:
    """Polls a server's ``GET /metrics`` on a daemon thread and feeds the samples to a ``FeedSource``.

    The Metrics dock reads the ``FeedSource`` from its own GUI-thread timer, so no Qt object crosses threads.
    A server that does not report metrics, or is unreachable for a while, leaves ``error`` set and is asked
    again at the next interval.
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        interval_s: float = METRICS_INTERVAL_S,
        fingerprint: str | None = None,
    ) -> None:
        from engine.telemetry import FeedSource

        self.url, self.token, self.interval_s, self.fingerprint = url, token, interval_s, fingerprint
        self.source = FeedSource(interval_s=interval_s)
        self.error: str | None = None
        self.fed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"metrics {self.url}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _run(self) -> None:
        from engine.backends import connect_server

        backend = connect_server(
            self.url,
            token=self.token,
            timeout_s=max(2.0, 2 * self.interval_s),
            fingerprint=self.fingerprint,
        )
        last_seq = None
        try:
            while not self._stop.is_set():
                sample = backend.metrics()
                if sample is None:
                    self.error = "the engine server does not report metrics, or cannot be reached"
                elif sample and sample.get("seq") != last_seq:
                    try:
                        # Named after the server: its clock is not ours (the dock places run marks by it).
                        self.source.feed({**sample, "source": self.url})
                        self.fed += 1
                        self.error = None
                    except InvalidRequest as exc:
                        self.error = str(exc)
                    last_seq = sample.get("seq")
                self._stop.wait(self.interval_s)
        except Exception:  # noqa: BLE001 - metrics must never take the app down
            log.warning("metrics feed from %s stopped", self.url, exc_info=True)
        finally:
            backend.close()
