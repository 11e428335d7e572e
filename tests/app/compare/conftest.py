"""Compare Settings on ``AppServices``: the Generate side installed as the main window installs them, and
the Compare window opened from them as a user opens it (Ctrl+Shift+G)."""

from __future__ import annotations

import pytest

from tests.app.compare.runs import open_compare
from tests.app.generating import generating

__all__ = ["generating"]


@pytest.fixture
def compare(qtbot, generating):
    """Compare Settings over tiny-latent, 6 steps, opened and on screen."""
    window = open_compare(qtbot, generating, "tiny-latent", 6)
    qtbot.waitExposed(window)
    yield window
    window.close()
