"""LayoutFence: a widget's text changes at every step of a run without laying out the window, and still gets
the room it needs when it no longer fits."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication, QBoxLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.panels.layout_fence import LayoutFence
from app.widgets.eliding_label import ElidingLabel


class _LayoutRequests(QObject):
    def __init__(self, widget: QWidget) -> None:
        super().__init__()
        self.count = 0
        widget.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.LayoutRequest:
            self.count += 1
        return False


def _panel(qtbot, label: QLabel, width: int = 300, layout_type=QVBoxLayout) -> tuple[QWidget, LayoutFence]:
    """``label`` fenced in a panel's box layout, the rest of the box a stretch (as in a status bar)."""
    panel = QWidget()
    qtbot.addWidget(panel)
    layout: QBoxLayout = layout_type(panel)
    fence = LayoutFence(label)
    layout.addWidget(fence)
    layout.addStretch(1)
    panel.resize(width, 200)
    panel.show()
    qtbot.waitExposed(panel)
    return panel, fence


def test_a_step_s_text_does_not_lay_out_the_panel_and_a_longer_one_gets_its_lines(qtbot):
    label = QLabel("Step 1/50 \u00b7 3.4 it/s \u00b7 ETA 0:14")
    label.setWordWrap(True)
    panel, fence = _panel(qtbot, label)
    QApplication.processEvents()
    one_line = label.height()
    requests = _LayoutRequests(panel)
    for step in range(2, 40):
        label.setText(f"Step {step}/50 \u00b7 {3 + step / 10:.1f} it/s \u00b7 ETA 0:{50 - step:02d}")
        QApplication.processEvents()
    assert requests.count == 0 and label.height() == one_line and fence.fits()

    label.setText("planning the best split of the model over 8 XLA devices (v5e:2x4): at most 120 s, " * 3)
    qtbot.waitUntil(lambda: label.height() > 2 * one_line, timeout=5_000)
    assert requests.count > 0 and label.height() == label.heightForWidth(label.width()) and fence.fits()


def test_a_one_line_label_widens_for_a_wider_text(qtbot):
    label = ElidingLabel("Starting...", max_width=420)
    panel, fence = _panel(qtbot, label, width=600, layout_type=QHBoxLayout)
    QApplication.processEvents()
    narrow = fence.width()
    label.setText("Step 12/50 \u00b7 3.4 it/s \u00b7 ETA 0:11")
    qtbot.waitUntil(lambda: label.shown_text() == label.text(), timeout=5_000)
    assert fence.width() > narrow and fence.fits()
