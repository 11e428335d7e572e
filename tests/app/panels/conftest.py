"""Panels on ``AppServices``: the Generate side installed as the main window installs them."""

from __future__ import annotations

from tests.app.generating import generating

__all__ = ["generating"]
