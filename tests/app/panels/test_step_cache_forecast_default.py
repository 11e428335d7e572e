"""The Optimization section alone: the Cached features choice starts where its tooltip advises (the forecast)."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.core.session import AppState
from app.panels.optimization_panel import OptimizationPanel
from tests.app.keys import pick


def _index(box, value) -> int:
    return box.findData(value)


def test_turning_step_caching_on_starts_the_cached_features_at_the_forecast(qtbot, qt_settings):
    """Before: caching turned on ran with the features held, while the choice's own tooltip (and the docs) say
    the forecast is far closer to the uncached run for the same speed."""
    state = AppState()
    panel = OptimizationPanel(state, qt_settings)
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    panel.activateWindow()
    qtbot.waitUntil(panel.isActiveWindow, timeout=5_000)
    qtbot.mouseClick(panel.expand_button, Qt.MouseButton.LeftButton)
    interval, forecast = panel.combos["step_cache_interval"], panel.combos["step_cache_forecast"]
    assert "far closer to the uncached run" in forecast.toolTip()

    pick(qtbot, interval, _index(interval, 3))
    assert forecast.currentData() is True and forecast.isEnabled()
    assert state.form.optimization == {"step_cache_interval": 3, "step_cache_forecast": True}

    # A choice the user makes stays theirs while caching stays on.
    pick(qtbot, forecast, _index(forecast, False))
    pick(qtbot, panel.combos["step_cache_level"], _index(panel.combos["step_cache_level"], 2))
    assert forecast.currentData() is False
    assert state.form.optimization == {"step_cache_interval": 3, "step_cache_level": 2}

    # Off: the refinement goes back to its default (it means nothing then) and the preset is plain fp32 again.
    pick(qtbot, panel.combos["step_cache_level"], _index(panel.combos["step_cache_level"], 1))
    pick(qtbot, interval, _index(interval, 1))
    assert state.form.optimization == {} and panel.current_preset() == "Exact fp32"
    pick(qtbot, interval, _index(interval, 5))
    assert forecast.currentData() is True
