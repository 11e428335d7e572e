"""Build a backend from a device name or a server address: the one place that knows which class serves what.

``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` and ``"auto"`` (or None) run in this process with torch
(:class:`~engine.backends.local.LocalBackend`); ``"xla"`` and ``"tpu"`` run the networks as XLA programs
(:class:`~engine.backends.xla.XlaBackend`, which needs the ``xla`` extra); a server URL (with its token and
certificate pin) is an engine server (:class:`~engine.backends.remote.RemoteBackend`). The classes are
imported only when built: the local one pulls in torch, the XLA one JAX, the remote one httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.api import Backend
from engine.errors import BackendUnavailable

if TYPE_CHECKING:  # the class is imported only when built (httpx); its name is needed for the return type
    from engine.backends.remote import RemoteBackend

XLA_DEVICES = ("xla", "tpu")


def is_xla_device(device: str | None) -> bool:
    """Whether ``device`` names the XLA backend rather than a torch device."""
    return (device or "").strip().lower() in XLA_DEVICES


def make_backend(
    device: str | None = "auto",
    *,
    registry=None,
    server: str | None = None,
    token: str | None = None,
    fingerprint: str | None = None,
    timeout_s: float | None = None,
    xla_precision: str = "highest",
    xla_devices: int | None = None,
    xla_topology: str | None = None,
) -> Backend:
    """The backend for ``device`` on this machine, or for the engine server at ``server`` when one is given.

    ``registry`` (a :class:`~engine.models.registry.ModelRegistry`) is where local and XLA backends find
    models; ``token``, ``fingerprint`` and ``timeout_s`` are the server's; ``xla_precision``, ``xla_devices``
    (how many devices plans may use; None = all) and ``xla_topology`` (what plans are costed against) the
    XLA one's.
    """
    if server:
        return connect_server(server, token=token, fingerprint=fingerprint, timeout_s=timeout_s)
    if is_xla_device(device):
        try:
            from engine.backends.xla import XlaBackend, first_devices

            options: dict[
                str, Any
            ] = {}  # only what was asked for: XlaBackend's defaults are "all devices, their slice"
            if xla_devices is not None:
                options["devices"] = first_devices(xla_devices)
            if xla_topology:
                options["topology"] = xla_topology
            return XlaBackend(registry=registry, precision=xla_precision, **options)
        except ModuleNotFoundError as exc:
            raise BackendUnavailable(
                f"--device xla needs JAX ({exc.name} is missing): pip install 'volsynth-studio[xla]'"
            ) from exc
    from engine.backends.local import LocalBackend

    return LocalBackend(device=device, registry=registry)


def connect_server(
    url: str, *, token: str | None = None, fingerprint: str | None = None, timeout_s: float | None = None
) -> RemoteBackend:
    """The client of the engine server at ``url``: a backend with the server's own calls besides
    (``models``, ``metrics``, ``plan``, ``close``), for code that talks to a server rather than to any device.
    ``timeout_s`` None keeps the client's default."""
    from engine.backends.remote import RemoteBackend

    if timeout_s is None:
        return RemoteBackend(url, token=token, fingerprint=fingerprint)
    return RemoteBackend(url, token=token, fingerprint=fingerprint, timeout_s=timeout_s)
