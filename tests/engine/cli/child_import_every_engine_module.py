"""Imports every engine module in a fresh interpreter, refusing Qt, pyvista and VTK (test_headless.py)."""

import importlib
import pkgutil
import sys


class Block:
    BLOCKED = ("PySide6", "PyQt5", "PyQt6", "pyvista", "pyvistaqt", "vtk", "vtkmodules", "pyqtgraph", "app")

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.BLOCKED:
            raise ImportError(f"engine must not import {name}")
        return None


sys.meta_path.insert(0, Block())
import engine  # noqa: E402 - after the blocker is in place

failed = []
for info in pkgutil.walk_packages(engine.__path__, "engine."):
    if info.name == "engine.__main__":  # running it would start the CLI
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as exc:
        failed.append(f"{info.name}: {exc}")
print("\n".join(failed) if failed else "ok")
