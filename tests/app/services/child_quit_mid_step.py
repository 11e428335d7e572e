"""The app, its run stuck in a step, quit by File > Quit (test_cancel_deadline.py): the process must end."""

# The app's modules are imported once the QApplication exists, as app/__main__.py does.
# ruff: noqa: E402

import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication

app = QApplication(sys.argv[:1])
from app.__main__ import leave
from app.window.main_window import MainWindow
from engine.models.registry import ModelRegistry
from tests.app.stuck_backend import StuckBackend

MainWindow.confirm_quit_during_run = lambda self: True  # the user answers Yes
models, ini = sys.argv[1], sys.argv[2]
window = MainWindow(
    registry=ModelRegistry([Path(models)]),
    settings=QSettings(ini, QSettings.Format.IniFormat),
    enable_3d=False,
    preload_torch=False,
)
stuck = StuckBackend(limit_s=3600)  # never released: only an abandoned run lets this process end
window.backends._backends["auto"] = stuck
window.show()


def quit_when_stuck():
    if stuck.entered.is_set():
        print("stuck in a step; File > Quit", flush=True)
        window.window_actions.quit.trigger()
    else:
        QTimer.singleShot(50, quit_when_stuck)


QTimer.singleShot(0, window.generation.generate_action.trigger)
QTimer.singleShot(0, quit_when_stuck)
code = app.exec()
print("event loop ended", flush=True)
sys.exit(leave(code))
