"""Imports every module of app/core in a fresh interpreter and fails if any of them pulled in Qt, VTK or torch."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import app.core

for module in pkgutil.iter_modules(app.core.__path__):
    importlib.import_module("app.core." + module.name)
bad = [name for name in ("PySide6", "pyqtgraph", "pyvista", "vtk", "torch") if name in sys.modules]
print(bad)
assert not bad, bad
