"""Find the files shipped in ``resources/`` wherever the program runs from.

One function for the three ways VolSynth is run: from the source tree, from an installed wheel (resources
are installed as the ``volsynth_resources`` data folder next to the packages), and from a PyInstaller
bundle, where everything is unpacked under ``sys._MEIPASS``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def resources_dir() -> Path:
    """The folder holding the shipped models, icons, stylesheet and default settings.

    ``VOLSYNTH_RESOURCES`` overrides the search (used by tests and by packagers who relocate data).
    """
    override = os.environ.get("VOLSYNTH_RESOURCES")
    if override:
        return Path(override)
    bundle_root = getattr(sys, "_MEIPASS", None)
    if bundle_root:
        return Path(bundle_root) / "resources"
    source_tree = Path(__file__).resolve().parents[2] / "resources"  # engine/files/shipped.py -> repo root
    if source_tree.is_dir():
        return source_tree
    return Path(sys.prefix) / "share" / "volsynth" / "resources"


def resource_path(*parts: str) -> Path:
    """Path of a file under the resources folder (it may not exist; callers check)."""
    return resources_dir().joinpath(*parts)
