"""Backends run sampling requests: locally (cpu/cuda/mps), on a remote engine server, or on XLA.

``make_backend`` (:mod:`engine.backends.factory`) builds the right one from a device name or server address;
``connect_server`` the engine server's client, with the calls only a server has.
"""

from engine.backends.factory import XLA_DEVICES, connect_server, is_xla_device, make_backend
from engine.backends.local import LocalBackend

__all__ = ["XLA_DEVICES", "LocalBackend", "connect_server", "is_xla_device", "make_backend"]
