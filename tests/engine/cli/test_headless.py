"""The engine imports and runs with Qt, pyvista and VTK unavailable (the server and CLI live there)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

_SCRIPT = r"""
import importlib, pkgutil, sys

class Block:
    BLOCKED = ("PySide6", "PyQt5", "PyQt6", "pyvista", "pyvistaqt", "vtk", "vtkmodules", "pyqtgraph", "app")
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.BLOCKED:
            raise ImportError(f"engine must not import {name}")
        return None

sys.meta_path.insert(0, Block())
import engine
failed = []
for info in pkgutil.walk_packages(engine.__path__, "engine."):
    if info.name == "engine.__main__":  # running it would start the CLI
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as exc:
        failed.append(f"{info.name}: {exc}")
print("\n".join(failed) if failed else "ok")
"""


def test_every_engine_module_imports_without_gui_libraries():
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "ok", out.stdout


def test_the_library_versions_are_read_without_importing_monai():
    """The tuner's parent process keys its results by library versions; importing MONAI only for its version
    cost it about 2 s of its budget. The version read from the metadata is the package's own."""
    script = (
        "import sys; from engine.machine.software import library_versions; v = library_versions(); "
        "print(v['monai'], 'monai' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    version, imported = out.stdout.split()
    import monai

    assert (version, imported) == (monai.__version__, "False")
