"""The engine imports and runs with Qt, pyvista and VTK unavailable (the server and CLI live there)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_every_engine_module_imports_without_gui_libraries():
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("child_import_every_engine_module.py"))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "ok", out.stdout


@pytest.mark.slow
def test_the_library_versions_are_read_without_importing_monai():
    """The tuner's parent process keys its results by library versions; importing MONAI only for its version
    cost it about 2 s of its budget. The version read from the metadata is the package's own."""
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("child_library_versions.py"))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    version, imported = out.stdout.split()
    import monai

    assert (version, imported) == (monai.__version__, "False")
