"""Panels on ``AppServices``: the Generate features installed as the main window installs them."""

from __future__ import annotations

from tests.app.generation.form_helpers import features

__all__ = ["features"]
