"""The app, the form edited, then killed with SIGKILL (test_form_saved_on_change.py): the edits must be on disk."""

# The app's modules are imported once the QApplication exists, as app/__main__.py does.
# ruff: noqa: E402

import os
import signal
import sys
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

app = QApplication(sys.argv[:1])
from app.window.main_window import MainWindow
from engine.models.registry import ModelRegistry

settings = QSettings(sys.argv[2], QSettings.Format.IniFormat)
window = MainWindow(
    registry=ModelRegistry([Path(sys.argv[1])]), settings=settings, enable_3d=False, preload_torch=False
)
window.show()
QTest.qWaitForWindowExposed(window)
steps, seed = window.sampling_panel.steps_spin, window.sampling_panel.seed_spin
for spin, text in ((steps, "10"), (seed, "4242")):
    spin.setFocus()
    spin.selectAll()
    QTest.keyClicks(spin, text)  # typed, as a user types it
    QTest.keyClick(spin, Qt.Key.Key_Tab)
print("typed", steps.value(), seed.value(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no clean exit: nothing more is written
