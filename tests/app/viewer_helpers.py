"""Helpers for the viewer's GUI tests: real NIfTI files, typed values, keyboard choices, wheel events, pixels."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QImage, QWheelEvent
from PySide6.QtWidgets import QApplication


def write_volume(path, data, synthetic=False, spacing=(1.0, 1.0, 1.0)):
    """A real NIfTI file (RAS+ affine) for the window to open."""
    from engine.nifti.io import save_volume
    from engine.nifti.volume import Volume

    return save_volume(
        Volume(np.asarray(data, dtype=np.float32), np.diag([*spacing, 1.0]), synthetic=synthetic), path
    )


def open_volume(qtbot, window, path):
    with qtbot.waitSignal(window.volume_opened, timeout=30_000) as blocker:
        window.open_path(path)
    return blocker.args[0]


def pixels(widget) -> np.ndarray:
    """What the widget shows now, as an (h, w, 3) RGB array."""
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    height, width = image.height(), image.width()
    raw = np.frombuffer(image.constBits(), dtype=np.uint8).reshape(height, image.bytesPerLine() // 4, 4)
    return raw[:, :width, 2::-1].astype(int)  # BGRA in memory -> RGB


def type_into(qtbot, spin, text: str) -> None:
    """Click into a field, select what is there, type, press Enter."""
    qtbot.mouseClick(spin.lineEdit(), Qt.MouseButton.LeftButton)
    qtbot.keyClick(spin.lineEdit(), Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(spin.lineEdit(), text)
    qtbot.keyClick(spin.lineEdit(), Qt.Key.Key_Return)


def choose(qtbot, combo, text: str) -> None:
    """Pick an item of a combo box with the keyboard (Home, then Down until it is current)."""
    combo.setFocus()
    qtbot.keyClick(combo, Qt.Key.Key_Home)
    for _ in range(combo.count()):
        if combo.currentText() == text:
            return
        qtbot.keyClick(combo, Qt.Key.Key_Down)
    assert combo.currentText() == text


def wheel(view, pos: QPoint, notches: int, modifiers=Qt.KeyboardModifier.NoModifier) -> None:
    event = QWheelEvent(
        QPointF(pos),
        QPointF(view.mapToGlobal(pos)),
        QPoint(0, 0),
        QPoint(0, 120 * notches),
        Qt.MouseButton.NoButton,
        modifiers,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(view, event)
