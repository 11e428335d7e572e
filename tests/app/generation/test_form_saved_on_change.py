"""The Generate form is on disk as soon as it is edited: a kill -9 right after typing keeps it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

pytestmark = pytest.mark.render
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_settings_typed_before_a_kill_come_back(qtbot, themed_app, tiny_models_dir, tmp_path, error_dialogs):
    from app.window.main_window import MainWindow
    from engine.models.registry import ModelRegistry

    ini = tmp_path / "volsynth-studio.ini"
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_DATA_HOME": str(tmp_path / "data")}
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("child_type_then_kill.py")),
            str(tiny_models_dir),
            str(ini),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert "typed 10 4242" in done.stdout

    window = MainWindow(
        registry=ModelRegistry([tiny_models_dir]),
        settings=QSettings(str(ini), QSettings.Format.IniFormat),
        enable_3d=False,
        preload_torch=False,
    )
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    assert window.sampling_panel.steps_spin.value() == 10  # not the default 50
    assert window.sampling_panel.seed_spin.value() == 4242
    assert window.state.form.steps == 10
    window.close()
