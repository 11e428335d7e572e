"""The app, started as a user starts it (models from argv[1], its recovery folder argv[2]), generates one volume,
then ends as argv[3] says:

- ``killed``: tiny-latent, 4 steps, seed 11; prints the volume's name and the sum of its voxels and is killed
  (SIGKILL) once the volume is kept for recovery;
- ``quit``: tiny-pixel, 3 steps; once the volume is kept the event loop is ended (``app.quit()``, as a session
  logout does): the window is never closed.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path

os.environ["QT_QPA_PLATFORM"] = "offscreen"

from PySide6.QtCore import QEventLoop, QSettings, QTimer  # noqa: E402 - after the platform is chosen
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.core.recovery import RecoveryStore  # noqa: E402
from app.window.main_window import MainWindow  # noqa: E402
from engine.models.registry import ModelRegistry  # noqa: E402

ending = sys.argv[3]
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
if ending == "killed":
    window.state.select_model(window.state.model_by_id("tiny-latent"))
    window.sampling_panel.steps_spin.setValue(4)
    window.sampling_panel.seed_spin.setValue(11)
    loop = QEventLoop()
    window.generation.ended.connect(lambda outcome: loop.quit())
    window.sampling_panel.generate_button.click()
    loop.exec()
    while window.runner.jobs:  # the recovery write
        app.processEvents()
    entry = window.state.volumes[-1]
    print(entry.name, float(entry.data.astype("float64").sum()), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
else:
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
