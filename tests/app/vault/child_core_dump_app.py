"""The app with an unlocked vault, made to dump core (test_locking.py): no plaintext may be in the dump."""

import ctypes
import os
import resource
import sys
import tempfile

os.environ["QT_QPA_PLATFORM"] = "offscreen"
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from app.window.main_window import MainWindow
from engine.models.registry import ModelRegistry
from engine.vault import KdfParams


def state(tag):
    print(tag, resource.getrlimit(resource.RLIMIT_CORE), ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), flush=True)


app = QApplication([])
window = MainWindow(
    registry=ModelRegistry([Path(sys.argv[1])]),
    settings=QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat),
    enable_3d=False,
    preload_torch=False,
)
window.show()
state("BEFORE")
controller = window.vault_controller
controller.session.kdf = KdfParams(memory_kib=1024, iterations=1, lanes=1)
controller.locking.set_vault_path(sys.argv[2])
dialog = controller.locking.request_unlock()
dialog.passphrase_edit.setText("correct horse battery staple")
dialog.confirm_edit.setText("correct horse battery staple")
dialog.ok_button.click()
while not controller.session.is_unlocked:
    app.processEvents()
state("UNLOCKED")
window.close()
