"""Backends run sampling requests: locally (cpu/cuda/mps), on a remote engine server, or on XLA."""

from engine.backends.local import LocalBackend

__all__ = ["LocalBackend"]
