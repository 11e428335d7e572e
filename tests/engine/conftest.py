"""Engine fixtures shared by the test files of this folder and the ones under it."""

from __future__ import annotations

import pytest


@pytest.fixture
def backend(registry):
    """The local backend on the CPU over the tiny test models (a file that needs another defines its own)."""
    from engine.backends.local import LocalBackend

    return LocalBackend("cpu", registry)
