"""Compare Settings on ``AppServices``: the Generate features installed as the main window installs them, and
the Compare window opened from them as a user opens it (Ctrl+Shift+G)."""

from __future__ import annotations

import pytest

from tests.app.compare.runs import open_compare
from tests.app.generation.form_helpers import features

__all__ = ["features"]


@pytest.fixture
def compare(qtbot, features):
    """Compare Settings over tiny-latent, 6 steps, opened and on screen."""
    window = open_compare(qtbot, features, "tiny-latent", 6)
    qtbot.waitExposed(window)
    yield window
    window.close()
