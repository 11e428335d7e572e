"""Menu shortcuts typed after a click in the 3D view, in a process of its own (test_window_shortcuts.py)."""

# The app's modules are imported once the QApplication exists, as app/__main__.py does.
# ruff: noqa: E402

import sys
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

app = QApplication(sys.argv[:1])
from app.window.main_window import MainWindow
from engine.models.registry import ModelRegistry
from tests.app.window.test_window_shortcuts import _press_all

window = MainWindow(
    registry=ModelRegistry([Path(sys.argv[1])]),
    settings=QSettings(sys.argv[2], QSettings.Format.IniFormat),
    enable_3d=True,
    preload_torch=False,
)
window.resize(1500, 920)
window.show()


def wait_until(condition, limit=2000):
    for _ in range(limit):
        if condition():
            return
        QTest.qWait(5)
    raise SystemExit("timed out waiting")


wait_until(lambda: window.viewer.view3d.ready, limit=20000)
window.activateWindow()
wait_until(window.isActiveWindow)
interactor = window.viewer.view3d.plotter.interactor


def click_3d():
    QTest.mouseClick(
        interactor, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, interactor.rect().center()
    )


missed = _press_all(window, click_3d, wait_until)
print("missed:", ",".join(missed) or "none", flush=True)
click_3d()
QTest.keySequence(QApplication.focusWidget() or window, "Ctrl+G")
print("generate after a click in 3D:", window.generation.running, flush=True)
QTest.keySequence(QApplication.focusWidget() or window, "Esc")
wait_until(lambda: not window.runner.jobs, limit=60000)
window.close()
