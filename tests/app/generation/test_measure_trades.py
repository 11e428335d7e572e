"""Measure now (the Optimization section's button and its tune controller, without the window): step caching
and fewer steps are measured beside the settings, speed and quality side by side, within the stated budget."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.core.measured_settings import MeasuredSettings
from app.generation.tuning import TuneController
from app.panels.optimization_panel import OptimizationPanel


@pytest.mark.slow
def test_measure_now_times_and_judges_step_caching_and_fewer_steps(
    qtbot, app_services, tmp_path, monkeypatch
):
    """Before: Measure now left step caching and fewer steps out, so the panel offered them with no speed and
    no quality cost measured here."""
    monkeypatch.setenv("VOLSYNTH_TUNE_DIR", str(tmp_path / "tune"))
    monkeypatch.setattr(TuneController, "ROWS", ["fp32"])  # the settings' rows are tune's own tests
    monkeypatch.setattr(TuneController, "CACHE_ROWS", ("cache:k3-l1-f",))  # one caching row: a short test
    monkeypatch.setattr(TuneController, "BUDGET_S", 2.0)
    state, measured = app_services.state, MeasuredSettings()
    panel = OptimizationPanel(state, app_services.settings, measured, parent=app_services.parent)
    controller = TuneController(app_services, measured)
    panel.measure_requested.connect(controller.start)
    app_services.add_dock(panel, "Optimization")
    state.select_model(state.model_by_id("tiny-latent"))
    qtbot.waitUntil(lambda: measured.looked_up and measured.model_id == "tiny-latent", timeout=30_000)
    assert (
        "about 4 minutes" in panel.measure_button.toolTip()
        and "step caching" in panel.measure_button.toolTip()
    )
    assert not panel.trades_label.isVisible()

    qtbot.mouseClick(panel.measure_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: controller.job is None and not measured.running, timeout=300_000)
    assert measured.measured and not measured.error, measured.error
    names = {row["name"] for row in measured.result["rows"]}
    assert {"fp32", "cache:k3-l1-f", "steps:2"} <= names
    said = panel.trades_label.text()
    assert panel.trades_label.isVisible() and said.startswith("Trades measured here")
    assert "step caching every 3 (level 1, forecast): " in said and "2 steps instead of 5: " in said
    assert said.count("x fp32") == 2 and said.count(" dB") + said.count("identical to fp32") == 2
    assert measured.setting_label("cache:k3-l1-f").endswith(" here") and "x fp32, " in measured.setting_label(
        "cache:k3-l1-f"
    )
