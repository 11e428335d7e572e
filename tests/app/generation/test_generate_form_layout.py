"""Expanding the Optimization section's "All settings" leaves every control of the Generate form inside the
panel (none cut off at the right), at once, not after a later resize."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QAbstractButton, QAbstractSpinBox, QComboBox

pytestmark = pytest.mark.render


def _cut_off(panel) -> list[str]:
    """Value controls and buttons whose right edge lies beyond what can be seen: the scroll area's visible
    width (unless it scrolls sideways) or the dock's edge."""
    viewport = panel.scroll_area.viewport()
    dock = panel.parentWidget()
    cut = []
    if viewport.mapTo(dock, QPoint(viewport.width(), 0)).x() > dock.width() + 1:
        cut.append(f"the scroll area ends beyond the dock ({dock.width()} px)")
    if panel.scroll_area.horizontalScrollBar().isVisible():
        return cut  # every control can be scrolled to
    right = viewport.width()
    widgets = [
        w
        for kind in (QAbstractButton, QComboBox, QAbstractSpinBox)
        for w in panel.form_widget.findChildren(kind)
    ]
    for widget in widgets:
        if not widget.isVisibleTo(panel.form_widget):
            continue
        edge = widget.mapTo(viewport, QPoint(widget.width(), 0)).x()
        if edge > right + 1:
            cut.append(
                f"{type(widget).__name__} {widget.objectName() or widget.toolTip()[:30]!r}: {edge} > {right}"
            )
    return cut


@pytest.mark.parametrize("size", [(1024, 700), (1500, 920)])
def test_all_settings_expands_without_clipping_the_form(qtbot, main_window, screenshot, size):
    window = main_window
    window.resize(*size)
    qtbot.waitUntil(lambda: window.width() == size[0], timeout=5_000)
    panel = window.sampling_panel
    button = window.optimization_panel.expand_button
    qtbot.waitUntil(lambda: not _cut_off(panel), timeout=5_000)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)  # "All settings"
    assert button.isChecked()
    qtbot.waitUntil(lambda: not _cut_off(panel), timeout=5_000)  # relaid out by events, no resize needed

    def scrolls_when_taller() -> bool:  # a form taller than the panel gets its scroll bar
        taller = panel.form_widget.minimumSizeHint().height() > panel.scroll_area.viewport().height()
        return panel.scroll_area.verticalScrollBar().isVisible() == taller and not _cut_off(panel)

    qtbot.waitUntil(scrolls_when_taller, timeout=5_000)
    screenshot(window, f"generate-all-settings-{size[0]}x{size[1]}")
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert not button.isChecked()
    qtbot.waitUntil(lambda: not _cut_off(panel), timeout=5_000)
