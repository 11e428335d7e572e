"""The Optimization section: settings into the request, live reasons per device, refusals, provenance, persistence."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.panels.optimization_panel import OptimizationPanel
from engine.optimization.apply import OptimizationConfig
from tests.app.keys import pick
from tests.app.runs import generate

pytestmark = pytest.mark.render


def _panel(generating) -> OptimizationPanel:
    return generating.optimization_panel


def _choose(combo, value) -> None:
    combo.setCurrentIndex(next(i for i in range(combo.count()) if combo.itemData(i) == value))


@pytest.mark.slow
def test_settings_reach_the_request_and_presets_set_them(generating):
    panel = _panel(generating)
    assert not panel.body.isVisible()  # compact by default
    assert panel.current_preset() == "Exact fp32"
    assert generating.state.form.to_request().optimization == OptimizationConfig()

    panel.checks["tf32"].setChecked(True)
    _choose(panel.combos["autocast"], "bf16")
    assert not panel.budget_spin.isEnabled()
    _choose(panel.combos["quantization"], "mixed")
    assert panel.budget_spin.isEnabled()
    panel.budget_spin.setValue(35.0)
    assert panel.current_preset() == "Custom"
    config = generating.state.form.to_request().optimization
    assert config == OptimizationConfig(tf32=True, autocast="bf16", quantization="mixed", psnr_budget_db=35.0)

    panel.apply_preset("Fast (GPU)")
    assert generating.state.form.to_request().optimization == OptimizationConfig(
        tf32=True, channels_last_3d=True, autocast="bf16", attention="sdpa"
    )
    assert panel.current_preset() == "Fast (GPU)"
    panel.preset_box.setCurrentIndex(panel.preset_box.findData("Low memory"))
    panel.preset_box.activated.emit(panel.preset_box.currentIndex())  # as a user's pick does
    assert generating.state.form.to_request().optimization == OptimizationConfig(streamed_decode=True)


@pytest.mark.slow
def test_settings_that_do_not_apply_on_the_cpu_say_why(generating):
    panel = _panel(generating)
    generating.sampling_panel.device_box.setCurrentIndex(generating.sampling_panel.device_box.findData("cpu"))
    panel.set_values({"tf32": True, "quantization": "fp8", "channels_last_3d": True})
    assert panel.marks["tf32"].text() == "\u2013"
    assert "TF32 needs an NVIDIA GPU of compute capability 8.0+" in panel.marks["tf32"].toolTip()
    assert panel.marks["quantization"].text() == "\u2013" and "8.9" in panel.marks["quantization"].toolTip()
    assert panel.marks["channels_last_3d"].text() == "\u2713"
    assert panel.marks["autocast"].text() == ""  # not requested: no mark
    assert "1 of 3 apply on cpu" in panel.summary.text() and "TF32" in panel.summary.text()
    assert generating.sampling_panel.generate_button.isEnabled()  # not applying is not refused


@pytest.mark.parametrize(
    "values, words",
    [
        ({"cuda_graphs": True}, "CUDA graphs need an NVIDIA GPU"),
        ({"quantization": "int8", "autocast": "fp16"}, "use bf16 autocast (or none) with int8"),
    ],
)
@pytest.mark.slow
def test_refused_combinations_show_the_engines_message_and_start_nothing(
    qtbot, generating, error_dialogs, values, words
):
    panel = _panel(generating)
    panel.set_values(values)
    assert panel.refused_label.isVisible() and words in panel.refused_label.text()
    button = generating.sampling_panel.generate_button
    assert not button.isEnabled() and words in button.toolTip()
    assert all(mark.text() == "" for mark in panel.marks.values())
    panel.expand_button.setChecked(False)
    assert panel.refused_label.isVisible()  # the reason stays in sight with the section collapsed
    button.click()
    qtbot.keyClick(generating.host, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)
    assert not generating.generation.running and not generating.services.runner.jobs
    assert "Cannot generate" in generating.host.statusBar().currentMessage() and not error_dialogs
    generating.state.set_job_running(True)  # the block outlives the job switching Generate back on
    generating.state.set_job_running(False)
    assert not button.isEnabled()
    panel.apply_preset("Exact fp32")
    assert button.isEnabled() and not panel.refused_label.isVisible()


@pytest.mark.slow
def test_generation_records_what_applied_in_provenance_and_details(qtbot, generating, screenshot):
    generating.select("tiny-latent")
    panel = _panel(generating)
    panel.expand_button.setChecked(True)
    panel.set_values({"autocast": "bf16", "channels_last_3d": True, "tf32": True})
    assert generate(qtbot, generating, steps=2, click=True) == "finished"
    report = generating.state.shown.provenance["optimization"]["report"]
    assert report["autocast"]["applied"] and report["channels_last_3d"]["applied"]
    assert report["tf32"]["applied"] is False
    details = generating.session_panel.details.text()
    assert "\u2713 Autocast bf16" in details and "\u2713 Channels-last 3D" in details
    assert "\u2013 TF32: TF32 needs an NVIDIA GPU" in details
    # what the panel predicted is what the run reported
    assert {k: e["applied"] for k, e in panel.report.items()} == {k: e["applied"] for k, e in report.items()}

    bar = (
        generating.sampling_panel.scroll_area.verticalScrollBar()
    )  # expanded, the panel scrolls: show its end
    bar.setValue(bar.maximum())
    assert screenshot(generating.host, "08-optimization-panel").stat().st_size > 10_000


@pytest.mark.slow
def test_the_check_waits_for_torch_at_start_up(qtbot, app_services, monkeypatch):
    from tests.app.generating import install_generating

    monkeypatch.setattr("app.panels.optimization_panel._engine_loaded", lambda: False)
    generating = install_generating(app_services)
    # As at start-up: the saved form comes back once the panels are built, then the models load (one is selected).
    generating.state.form.restore({"optimization": {"cuda_graphs": True, "autocast": "bogus"}})
    with qtbot.waitSignal(generating.state.model_selected):
        generating.select("tiny-pixel")
    panel = _panel(generating)
    assert panel.report is None and "once the engine has loaded" in panel.summary.text()
    assert generating.sampling_panel.generate_button.isEnabled()  # not known to be refused yet
    generating.sampling_panel.generate_button.click()  # Generate checks first (importing torch if it must)
    assert "CUDA graphs need an NVIDIA GPU" in panel.refused_label.text()
    assert not generating.sampling_panel.generate_button.isEnabled()
    assert panel.values()["autocast"] is None  # a saved value no control offers is ignored


@pytest.mark.slow
def test_decoder_settings_have_controls_a_preset_and_reach_the_request(generating):
    panel = _panel(generating)
    box = panel.preset_box
    box.setCurrentIndex(box.findData("Fast decode (CPU)"))
    box.activated.emit(box.currentIndex())  # what a pick in the combo box sends
    config = generating.state.form.to_request().optimization
    assert config.streamed_decode and config.decoder_autocast == "bf16" and config.decoder_channels_last
    assert (
        panel.combos["decoder_autocast"].currentData() == "bf16"
        and panel.checks["decoder_channels_last"].isChecked()
    )
    # the decoder's PSNR budget is editable only with mixed decoder quantization
    assert not panel.budget_spins["decoder_psnr_budget_db"].isEnabled()
    _choose(panel.combos["decoder_quantization"], "mixed")
    assert panel.budget_spins["decoder_psnr_budget_db"].isEnabled() and panel.current_preset() == "Custom"
    panel.budget_spins["decoder_psnr_budget_db"].setValue(45.0)
    config = generating.state.form.to_request().optimization
    assert config.decoder_quantization == "mixed" and config.decoder_psnr_budget_db == 45.0


@pytest.mark.slow
def test_presets_come_from_what_was_measured_on_this_machine(qtbot, generating, tmp_path, monkeypatch):
    """First use offers the measurement; Measure now runs `volsynth tune` in the background; the presets then
    say what they measured here, and Fastest here applies the recommendation."""
    from app.generation.tuning import TuneController

    monkeypatch.setenv("VOLSYNTH_TUNE_DIR", str(tmp_path / "tune"))
    monkeypatch.setattr(TuneController, "ROWS", ["preset:Low memory"])  # fp32 + one row: a short test
    monkeypatch.setattr(
        TuneController, "trades", lambda self, spec: []
    )  # tests/app/generation/test_measure_trades.py
    monkeypatch.setattr(TuneController, "BUDGET_S", 1.0)
    panel, measured = _panel(generating), generating.measured
    generating.select("tiny-latent")
    qtbot.waitUntil(lambda: measured.looked_up and measured.model_id == "tiny-latent", timeout=30_000)
    assert not measured.measured
    assert "not measured on this machine" in panel.measured_label.text()
    assert panel.measure_button.isVisible() and panel.measure_button.text() == "Measure now"
    assert "not measured here" in panel.preset_box.itemText(panel.preset_box.findData("Low memory"))

    qtbot.mouseClick(panel.measure_button, Qt.MouseButton.LeftButton)
    assert measured.running and panel.cancel_measure_button.isVisible()
    qtbot.waitUntil(lambda: not measured.running and generating.tuning.job is None, timeout=180_000)
    assert measured.measured and not measured.error, measured.error
    low = panel.preset_box.itemText(panel.preset_box.findData("Low memory"))
    assert "x fp32 here" in low
    tip = panel.preset_box.itemData(panel.preset_box.findData("Low memory"), Qt.ItemDataRole.ToolTipRole)
    assert "Measured on this machine" in tip and "PSNR" in tip
    gpu = panel.preset_box.findData("Fast (GPU)")
    assert "not measured here" in panel.preset_box.itemText(gpu)
    assert "TF32" in panel.preset_box.itemData(gpu, Qt.ItemDataRole.ToolTipRole)
    assert panel.measure_button.text() == "Measure again" and panel.floor_spin.isVisible()

    index = panel.preset_box.findData("Fastest here")
    panel.preset_box.setCurrentIndex(index)
    panel.preset_box.activated.emit(index)
    best = measured.fastest()
    assert best["name"] in ("fp32", "preset:Low memory")
    expected = OptimizationConfig.from_dict(best["config"])
    assert generating.state.form.to_request().optimization == expected


@pytest.mark.slow
def test_measuring_is_reachable_by_shortcut_and_cancel_keeps_nothing(
    qtbot, generating, tmp_path, monkeypatch
):
    from PySide6.QtGui import QKeySequence

    from app.generation.tuning import TUNE_SHORTCUT

    monkeypatch.setenv("VOLSYNTH_TUNE_DIR", str(tmp_path / "tune"))
    measured = generating.measured
    generating.select("tiny-latent")
    qtbot.waitUntil(lambda: measured.looked_up, timeout=30_000)
    assert generating.tuning.action.shortcut() == QKeySequence(TUNE_SHORTCUT)
    qtbot.keyClick(
        generating.host, Qt.Key.Key_M, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )
    assert generating.tuning.job is not None and generating.tuning.cancel_action.isEnabled()
    qtbot.waitUntil(lambda: "preparing" in measured.progress_text, timeout=60_000)
    # Cancel from the keyboard: the Optimization section's Cancel has the focus, Space presses it.
    cancel = _panel(generating).cancel_measure_button
    qtbot.waitUntil(cancel.isVisible, timeout=5_000)
    cancel.setFocus()
    qtbot.keyClick(cancel, Qt.Key.Key_Space)
    assert "cancelling" in measured.progress_text
    qtbot.waitUntil(lambda: generating.tuning.job is None, timeout=60_000)
    assert not measured.running and not measured.measured
    assert generating.host.statusBar().currentMessage() == "Measuring cancelled; nothing was kept"
    assert not any((tmp_path / "tune").rglob("*.json"))


def test_a_preset_too_long_for_the_box_ends_in_an_ellipsis(qtbot, generating):
    """ "Exact fp32 · not measured here" in a narrow box reads "Exact fp32 · not…", not a silent "not meas"."""
    box = _panel(generating).preset_box
    box.setCurrentIndex(box.findData("Exact fp32"))
    full = box.currentText()
    assert "measured here" in full  # what the box says about this machine
    box.setFixedWidth(box.fontMetrics().horizontalAdvance(full) // 2)
    shown = box.shown_text()
    assert shown.endswith("\u2026") and full.startswith(shown[:-1])
    pixels = box.grab()  # the box paints the elided text without complaint
    assert not pixels.isNull()
    box.setFixedWidth(box.fontMetrics().horizontalAdvance(full) + 80)
    assert box.shown_text() == full


def test_switching_models_says_what_it_reset_and_drops_a_quantization_of_the_other_model(qtbot, generating):
    """Steps and conditioning went to the new model's defaults silently, and an int8 setting chosen (and
    measured) for one model stayed on for another not measured here."""
    panel, sampling = _panel(generating), generating.sampling_panel
    pick(qtbot, sampling.model_box, "tiny-latent")
    sampling.steps_spin.setValue(3)
    panel.expand_button.setChecked(True)
    pick(qtbot, panel.combos["quantization"], "int8")
    assert generating.state.form.optimization["quantization"] == "int8"
    with qtbot.waitSignal(generating.state.status) as said:  # the main window's status bar shows what is said
        pick(qtbot, sampling.model_box, "tiny-pixel")
    form = generating.state.form
    assert "quantization" not in form.optimization and form.to_request().optimization.quantization is None
    assert panel.combos["quantization"].currentData() is None  # the control shows it off too
    message = said.args[0]
    assert message.startswith(f"{form.model.spec.name}: steps 3 \u2192 {form.steps}")
    assert "quantization int8 off (it was chosen for another model" in message


def test_the_form_comes_back_after_a_restart(qtbot, themed_app, registry, qt_settings, error_dialogs):
    """The window keeps the Generate form: the Optimization section (and whether it was expanded), the device
    chosen on this computer and the previews, as the next start shows them; a switch of model after the start
    says in the window's status bar what it dropped."""
    from app.window.main_window import MainWindow
    from tests.app.keys import click_item

    first = MainWindow(registry=registry, settings=qt_settings, enable_3d=False, preload_torch=False)
    qtbot.addWidget(first)
    first.resize(1500, 920)
    first.show()
    qtbot.waitExposed(first)
    first.state.select_model(first.state.model_by_id("tiny-latent"))
    _panel(first).set_values(
        {"attention": "sdpa", "streamed_decode": True, "quantization": "mixed", "psnr_budget_db": 33.0}
    )
    _panel(first).expand_button.setChecked(True)
    box = first.sampling_panel.device_box
    qtbot.waitUntil(lambda: box.findData("cpu") >= 0, timeout=60_000)  # the device list has come
    first.activateWindow()
    qtbot.waitUntil(first.isActiveWindow, timeout=5_000)
    pick(qtbot, box, "cpu")
    assert first.state.form.device == "cpu"
    click_item(qtbot, first.sampling_panel.previews_box, "4 per run")
    first.close()

    second = MainWindow(registry=registry, settings=qt_settings, enable_3d=False, preload_torch=False)
    qtbot.addWidget(second)
    second.show()
    qtbot.waitExposed(second)
    panel = _panel(second)
    assert panel.expand_button.isChecked() and panel.current_preset() == "Custom"
    assert second.state.form.to_request().optimization == OptimizationConfig(
        attention="sdpa", streamed_decode=True, quantization="mixed", psnr_budget_db=33.0
    )
    box = second.sampling_panel.device_box
    qtbot.waitUntil(lambda: box.findData("cpu") >= 0, timeout=60_000)
    assert box.currentData() == "cpu" and second.state.form.device == "cpu"
    assert second.sampling_panel.previews_box.currentText() == "4 per run"
    assert second.state.form.preview_interval == -4
    second.state.select_model(second.state.model_by_id("tiny-pixel"))
    message = second.statusBar().currentMessage()
    assert message.startswith(f"{second.state.form.model.spec.name}: ")
    assert "quantization mixed off (it was chosen for another model" in message
    second.close()
