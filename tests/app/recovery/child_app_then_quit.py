"""The app (models from argv[1], its recovery folder argv[2]) generates one volume (tiny-pixel, 3 steps),
and once it is kept the event loop is ended (``app.quit()``, as a session logout does): the window is never
closed."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ["QT_QPA_PLATFORM"] = "offscreen"

from PySide6.QtCore import QSettings, QTimer  # noqa: E402 - after the platform is chosen
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.core.recovery import RecoveryStore  # noqa: E402
from app.window.main_window import MainWindow  # noqa: E402
from engine.models.registry import ModelRegistry  # noqa: E402

app = QApplication([])
settings = QSettings(str(Path(tempfile.mkdtemp()) / "volsynth-studio.ini"), QSettings.Format.IniFormat)
window = MainWindow(
    registry=ModelRegistry([Path(sys.argv[1])]),
    settings=settings,
    enable_3d=False,
    preload_torch=False,
    recovery=RecoveryStore(Path(sys.argv[2])),
)
window.show()
window.state.select_model(window.state.model_by_id("tiny-pixel"))
window.sampling_panel.steps_spin.setValue(3)


def quit_when_kept() -> None:
    if window.runner.jobs:
        QTimer.singleShot(50, quit_when_kept)
    else:
        app.quit()  # the event loop ends; the window is never closed


window.generation.ended.connect(lambda outcome: QTimer.singleShot(0, quit_when_kept))
QTimer.singleShot(0, window.sampling_panel.generate_button.click)
sys.exit(app.exec())
