"""Prints MONAI's version as the tuner reads it and whether reading it imported MONAI."""

from __future__ import annotations

import sys

from engine.machine.software import library_versions

versions = library_versions()
print(versions["monai"], "monai" in sys.modules)
