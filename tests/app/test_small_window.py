"""The window at 1024x700 (a small laptop screen): texts are whole or elide with a tooltip.

Without the 3D view: a second 3D window in one Xvfb process never becomes the active window (see
test_window_shortcuts, which runs its 3D case in a process of its own)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QRect

pytestmark = pytest.mark.render


def _inside(widget, container) -> bool:
    """The whole widget lies inside ``container``'s visible rectangle (nothing cut at its right)."""
    top_left = widget.mapTo(container, QPoint(0, 0))
    return container.rect().contains(QRect(top_left, widget.size()))


def test_at_1024x700_the_model_combo_and_the_status_message_are_whole(qtbot, main_window, screenshot):
    window = main_window
    window.state.select_model(window.state.model_by_id("tiny-latent"))
    window.sampling_panel.steps_spin.setValue(3)
    with qtbot.waitSignal(window.generation.ended, timeout=120_000):
        window.sampling_panel.generate_button.click()
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=10_000)
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024 and window.height() == 700, timeout=10_000)
    panel = window.sampling_panel
    viewport = panel.scroll.viewport()
    # The Generate dock asks for its form's width again when the window narrows (it was left cutting the
    # model combo and its "..." button), and the optimization preset elides instead of widening the form.
    qtbot.waitUntil(lambda: _inside(panel.open_model_button, viewport), timeout=20_000)
    assert _inside(panel.model_box, viewport) and _inside(panel.random_seed_button, viewport)
    box = panel.model_box
    assert box.fontMetrics().horizontalAdvance(box.currentText()) < box.width()  # the name is whole

    status = window.statusBar()
    message = status.currentMessage()
    assert message.startswith("Generated 1 volume(s)") and status.toolTip() == message
    # With a volume shown, the readout, space, voxel size and device fields leave a 1024-px window about 150 px
    # for the message, which is then cut at its right: the tooltip above holds it whole (still open in
    # issue 25: the status fields do not yet give way to the message on narrow windows).
    screenshot(window, "14-window-1024x700")
