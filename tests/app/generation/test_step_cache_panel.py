"""The Optimization section offers step caching: a user opens the section, picks an interval and a level, and the
request carries them, with the engine's prediction beside the control."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from engine.optimization.apply import OptimizationConfig
from tests.app.generating import install_generating
from tests.app.runs import generate

pytestmark = pytest.mark.render


def test_step_caching_is_chosen_with_the_keyboard_and_reaches_the_request(qtbot, app_services):
    generating = install_generating(app_services)
    panel = generating.optimization_panel
    generating.sampling_panel.device_box.setCurrentIndex(generating.sampling_panel.device_box.findData("cpu"))
    if not panel.body.isVisible():
        qtbot.mouseClick(panel.expand_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(panel.body.isVisible, timeout=5_000)

    interval = panel.combos["step_cache_interval"]
    assert interval.currentData() == 1 and "DeepCache" in interval.toolTip()
    assert not panel.combos["step_cache_level"].isEnabled()  # no level to choose while caching is off
    assert not panel.combos["step_cache_forecast"].isEnabled()
    interval.setFocus()
    for _ in range(2):  # Off -> every 2 -> every 3 steps
        qtbot.keyClick(interval, Qt.Key.Key_Down)
    assert interval.currentText() == "Full pass every 3 steps"
    level = panel.combos["step_cache_level"]
    assert level.isEnabled()
    level.setFocus()
    qtbot.keyClick(level, Qt.Key.Key_Down)
    forecast = panel.combos["step_cache_forecast"]
    # Caching turned on starts at the forecast, as the choice's tooltip advises.
    assert forecast.isEnabled() and forecast.currentText() == "Forecast from the last two"

    assert generating.state.form.to_request().optimization == OptimizationConfig(
        step_cache_interval=3, step_cache_level=2, step_cache_forecast=True
    )
    assert panel.current_preset() == "Custom"
    qtbot.waitUntil(lambda: panel.marks["step_cache_interval"].text() != "", timeout=30_000)
    mark_tip = panel.marks["step_cache_interval"].toolTip()
    assert (
        mark_tip.startswith("Applies") and "every 3 steps" in mark_tip and "last two full passes" in mark_tip
    )

    # Back to Off: nothing is requested and the mark goes.
    interval.setFocus()
    for _ in range(2):
        qtbot.keyClick(interval, Qt.Key.Key_Up)
    assert generating.state.form.to_request().optimization.step_cache_interval == 1
    qtbot.waitUntil(lambda: panel.marks["step_cache_interval"].text() == "", timeout=30_000)
    assert not level.isEnabled() and not forecast.isEnabled()


def test_a_cached_run_is_named_in_the_session_as_compare_names_its_row(qtbot, app_services):
    """A run with step caching was listed as "seed 0 · 3+step_cache_forecast"; Compare's row is cache:k3-l1-f."""
    from tests.app.keys import pick

    generating = install_generating(app_services)
    panel = generating.optimization_panel
    pick(qtbot, generating.sampling_panel.device_box, "cpu")
    if not panel.body.isVisible():
        qtbot.mouseClick(panel.expand_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(panel.body.isVisible, timeout=5_000)
    pick(qtbot, panel.combos["step_cache_interval"], 2)  # an index: Off, every 2, every 3 steps
    pick(qtbot, panel.combos["step_cache_forecast"], 1)  # Forecast from the last two
    generating.host.activateWindow()
    qtbot.waitUntil(generating.host.isActiveWindow, timeout=5_000)
    assert generate(qtbot, generating, steps=4) == "finished"
    name = generating.state.shown.name
    assert name.endswith(" \u00b7 cache:k3-l1-f"), name
    assert generating.session_panel.list.currentItem().text() == name
