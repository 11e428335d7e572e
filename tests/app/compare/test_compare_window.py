"""Compare Settings on AppServices (the Generate side it reads installed as the main window installs them),
under Xvfb: run, linked views, numbers, kernels, cancel, errors, save."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.compare import difference_window
from app.compare.window import CSV_DIR_KEY, PANEL_SETTINGS
from tests.app.compare.runs import open_compare, wait_compared
from tests.app.conftest import SCREENSHOTS

pytestmark = [pytest.mark.render, pytest.mark.filterwarnings("ignore::UserWarning")]


def _panel_bf16(generating):
    panel = generating.optimization_panel
    panel.set_values({**panel.values(), "autocast": "bf16"})


@pytest.mark.slow
def test_fp32_against_bf16_shows_volumes_numbers_and_kernels(qtbot, generating, compare):
    _panel_bf16(generating)
    assert compare.choice(compare.a_box) == "Exact fp32" and compare.choice(compare.b_box) == PANEL_SETTINGS
    generating.sampling_panel.seed_spin.setValue(77)
    assert "seed 77" in compare.source_label.text() and "6 steps" in compare.source_label.text()
    assert compare.start()
    assert generating.state.job_running and not generating.sampling_panel.generate_button.isEnabled()
    assert wait_compared(qtbot, compare) == "finished"
    assert not generating.state.job_running and generating.sampling_panel.generate_button.isEnabled()
    result = compare.comparison
    assert result.a.applied() == [] and result.b.applied() == ["autocast"]
    assert result.a.result.request.seed == generating.sampling_panel.seed_spin.value()
    assert result.a.result.request.batch_size == 1 and result.a.result.request.steps == 6
    for side in ("a", "b", "diff"):
        assert compare.views[side]["axial"].current_pixels() is not None
    diff = compare.states["diff"].shown.data
    assert np.allclose(diff, result.b.result.volume() - result.a.result.volume())
    assert compare.states["diff"].window == pytest.approx(difference_window(diff))
    assert compare.states["diff"].window[1] == 0.0
    assert compare.titles["b"].text().endswith("bf16") and "max |B" in compare.titles["diff"].text()
    # bf16 autocast reaches the U-Net and the decoder: the headline is the whole loop
    assert "PSNR" in compare.summary_label.text()
    assert compare.summary_label.text().startswith("<b>End to end (sampling loop incl. decode)</b>")
    labels = [compare.table.verticalHeaderItem(r).text() for r in range(compare.table.rowCount())]
    assert labels[0] == "Step (median)" and "Applied" in labels
    applied_row = labels.index("Applied")
    assert compare.table.item(applied_row, 1).text() == "Autocast"  # the panel's name, not the field's
    for side in ("a", "b"):
        table = compare.kernel_tables[side]
        assert table.rowCount() > 0 and table.item(0, 3).text().startswith("aten::")
        assert "steps 2\u20133" in compare.kernel_titles[side].text()
    assert compare.add_button.isEnabled() and compare.save_button.isEnabled()


@pytest.mark.slow
def test_views_are_linked_and_the_difference_keeps_its_own_window(qtbot, generating, compare):
    _panel_bf16(generating)
    compare.start()
    assert wait_compared(qtbot, compare) == "finished"
    view_a = compare.views["a"]["axial"]
    rect = view_a.image_rect()
    qtbot.mouseClick(
        view_a,
        Qt.MouseButton.LeftButton,
        pos=rect.topLeft().toPoint() + (rect.center() - rect.topLeft()).toPoint() / 2,
    )
    moved = compare.states["a"].crosshair_ras
    assert not np.allclose(moved, compare.states["a"].shown.center_ras())
    for side in ("b", "diff"):
        assert np.allclose(compare.states[side].crosshair_ras, moved)
    diff_window = compare.states["diff"].window
    compare.states["a"].set_window(0.3, 0.2)
    assert compare.states["b"].window == (0.3, 0.2) and compare.states["diff"].window == diff_window
    qtbot.keyClick(compare, Qt.Key.Key_2)
    assert compare.plane_box.currentText() == "Coronal"
    assert all(compare.stacks[s].currentWidget() is compare.views[s]["coronal"] for s in ("a", "b", "diff"))


@pytest.mark.slow
def test_same_settings_compare_identical(qtbot, generating, compare):
    compare.b_box.setCurrentIndex(compare.b_box.findData("Exact fp32"))
    compare.profile_spin.setValue(0)
    compare.start()
    assert wait_compared(qtbot, compare) == "finished"
    assert compare.comparison.max_abs_err == 0.0
    assert (
        "identical" in compare.titles["diff"].text() and "identical volumes" in compare.summary_label.text()
    )
    assert (
        compare.kernel_tables["a"].rowCount() == 0
        and "no kernel profile" in compare.kernel_titles["a"].text()
    )


@pytest.mark.slow
def test_cancel_with_escape_leaves_the_app_usable(qtbot, generating, compare):
    generating.select("tiny-pixel")
    generating.sampling_panel.steps_spin.setValue(1000)
    compare.start()
    qtbot.waitUntil(lambda: compare.progress_bar.value() >= 1, timeout=60_000)
    compare.activateWindow()
    qtbot.waitUntil(compare.isActiveWindow, timeout=5_000)
    qtbot.keyClick(compare, Qt.Key.Key_Escape)
    assert wait_compared(qtbot, compare) == "cancelled"
    assert compare.progress_label.text() == "Cancelled" and compare.comparison is None
    assert not generating.state.job_running and compare.run_button.isEnabled()
    generating.sampling_panel.steps_spin.setValue(3)
    generating.sampling_panel.generate_button.click()
    with qtbot.waitSignal(generating.generation.ended, timeout=60_000) as ended:
        pass
    assert ended.args[0] == "finished"


@pytest.mark.slow
def test_errors_reach_a_dialog_and_nothing_is_left_running(qtbot, generating, compare, error_dialogs):
    generating.sampling_panel.device_box.addItem("cuda", "cuda")
    generating.sampling_panel.device_box.setCurrentIndex(generating.sampling_panel.device_box.count() - 1)
    assert compare.start()
    assert wait_compared(qtbot, compare) == "failed"
    title, message = error_dialogs[-1]
    assert title == "Comparison failed" and "cuda" in message.lower() and "Traceback" not in message
    assert not generating.state.job_running and compare.run_button.isEnabled()


@pytest.mark.slow
def test_refused_while_a_generation_runs(qtbot, generating, compare, error_dialogs):
    generating.select("tiny-pixel")
    generating.sampling_panel.steps_spin.setValue(1000)
    generating.sampling_panel.generate_button.click()
    assert not compare.run_button.isEnabled()
    assert not compare.start()
    assert "generation is running" in error_dialogs[-1][1]
    with qtbot.waitSignal(generating.generation.ended, timeout=60_000):
        generating.generation.cancel_action.trigger()  # Generate > Cancel Generation
    assert compare.run_button.isEnabled()


@pytest.mark.slow
def test_add_to_session_and_save(qtbot, generating, compare, tmp_path):
    _panel_bf16(generating)
    compare.start()
    assert wait_compared(qtbot, compare) == "finished"
    compare.add_to_session()
    names = [v.name for v in generating.state.volumes]
    assert names[-2:] == [
        f"seed {generating.sampling_panel.seed_spin.value()} \u00b7 fp32",
        f"seed {generating.sampling_panel.seed_spin.value()} \u00b7 bf16",
    ]
    assert generating.state.volumes[-1].provenance["optimization"]["requested"]["autocast"] == "bf16"
    folder = tmp_path / "cmp"
    compare.save_to(folder)
    qtbot.waitUntil(
        lambda: (folder / "compare.json").is_file() and not generating.services.runner.jobs, timeout=30_000
    )
    assert sorted(p.name for p in folder.iterdir()) == [
        "a.json",
        "a.nii.gz",
        "b.json",
        "b.nii.gz",
        "compare.json",
        "difference.nii.gz",
    ]
    record = json.loads((folder / "compare.json").read_text())
    assert record["b"]["applied"] == ["autocast"] and "Saved 6 files" in compare.progress_label.text()


@pytest.mark.slow
def test_named_settings_on_both_sides_and_the_choice_is_remembered(qtbot, generating, compare):

    compare.a_box.setCurrentText("bf16")
    compare.b_box.setCurrentText("bf16+sdpa")
    compare.profile_spin.setValue(1)
    assert compare.start()
    assert wait_compared(qtbot, compare) == "finished"
    assert compare.comparison.a.applied() == ["autocast"]
    assert set(compare.comparison.b.applied()) == {"autocast", "attention"}
    assert compare.titles["a"].text().endswith("bf16") and compare.titles["b"].text().endswith("bf16+sdpa")
    again = generating.compare.make_window()  # the next time the window is built (e.g. next start)
    assert again.a_box.currentText() == "bf16" and again.b_box.currentText() == "bf16+sdpa"
    again.close()


@pytest.mark.slow
def test_a_is_shown_as_soon_as_its_run_is_done(qtbot, generating, compare):
    _panel_bf16(generating)
    events: list[str] = []
    compare.side_shown.connect(events.append)
    compare.comparison_ended.connect(events.append)
    assert compare.views["b"]["axial"].empty_text.startswith("Run the comparison")  # not "Generate a volume"
    qtbot.mouseClick(compare.run_button, Qt.MouseButton.LeftButton)
    assert "waiting for A" in compare.titles["b"].text()
    # The empty views say what is happening, not "Run the comparison" while it runs.
    assert compare.views["b"]["axial"].empty_text == "B runs once A is done"
    with qtbot.waitSignal(compare.side_shown, timeout=120_000):
        pass
    assert compare.views["b"]["axial"].empty_text == "B is running..."
    # B runs now: A's volume and step time are on screen, B's view is empty and its title says it runs.
    assert compare.comparison is None and compare._job is not None
    assert compare.views["a"]["axial"].current_pixels() is not None
    assert compare.states["b"].shown is None and compare.titles["b"].text().endswith("running...")
    assert compare.titles["b"].toolTip() == compare.titles["b"].text()  # the whole header, however narrow
    assert "ms/step" in compare.titles["a"].text() and "running B" in compare.summary_label.text()
    assert wait_compared(qtbot, compare) == "finished"
    assert events == ["a", "finished"]
    assert compare.views["b"]["axial"].current_pixels() is not None
    assert compare.views["b"]["axial"].empty_text.startswith("Run the comparison")


@pytest.mark.slow
def test_difference_map_is_diverging_with_a_colour_bar(qtbot, generating, compare, screenshot):
    _panel_bf16(generating)
    bar = compare.colour_bar
    assert bar.labels() == ("", "", "")  # no placeholder numbers before there is a difference
    qtbot.keyClick(compare, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert wait_compared(qtbot, compare) == "finished"
    window, level = compare.states["diff"].window
    # The title says what the bar spans against the maximum, and that beyond it colours are clipped.
    title = compare.titles["diff"].text()
    assert (
        f"max |B\u2212A| {compare.comparison.max_abs_err:.3g}; the bar spans \u00b1{window / 2:.3g}" in title
    )
    assert "larger differences show at its end colours" in title
    assert bar.isVisible() and bar.limits() == pytest.approx((level - window / 2, level + window / 2))
    assert bar.labels()[0] == f"{level + window / 2:+.3g}" and bar.labels()[2] == f"{level - window / 2:+.3g}"
    # The difference is drawn in colour (blue below zero, orange above), A and B in grey
    diff_pixels = compare.views["diff"]["axial"].grab().toImage()
    a_pixels = compare.views["a"]["axial"].grab().toImage()

    def colourful(image) -> int:
        rect = image.rect()
        count = 0
        for y in range(0, rect.height(), 4):
            for x in range(0, rect.width(), 4):
                colour = image.pixelColor(x, y)
                count += abs(colour.red() - colour.blue()) > 40
        return count

    # (A's view has a little colour too: the crosshair and the orientation letters.)
    assert colourful(diff_pixels) > 5 * max(20, colourful(a_pixels))
    compare.resize(1400, 900)
    qtbot.waitUntil(lambda: compare.table.rowCount() > 0, timeout=5_000)
    screenshot(compare, "compare-colour-bar")
    # The bar follows the difference view's window (a right-drag there changes it).
    compare.states["diff"].set_window(0.02, 0.0)
    assert bar.labels() == ("+0.01", "0", "-0.01")


@pytest.mark.slow
def test_decoder_only_setting_headlines_the_decode(qtbot, generating, compare):
    # A decoder setting leaves the U-Net alone: its per-step ratio is noise, so the bold line is the decode.
    panel = generating.optimization_panel
    panel.set_values({**panel.values(), "decoder_channels_last": True})
    compare.profile_spin.setValue(0)
    qtbot.mouseClick(compare.run_button, Qt.MouseButton.LeftButton)
    assert wait_compared(qtbot, compare) == "finished"
    measured = compare.comparison
    summary = compare.summary_label.text()
    assert summary.startswith("<b>Decode</b> (B's settings change only the decoder): <b>too few samples")
    assert "per step" not in summary and "faster" not in summary and "slower" not in summary
    assert "press Repeat" in summary and "volsynth bench" not in summary  # a button here, not a command
    assert f"End to end (sampling loop incl. decode): A {measured.a.loop_s:.2f} s" in summary
    labels = [compare.table.verticalHeaderItem(r).text() for r in range(compare.table.rowCount())]
    row = labels.index("Decode")
    assert compare.table.item(row, 0).text() == f"{measured.a.decode_s:.2f} s"
    assert compare.table.item(row, 1).text() == f"{measured.b.decode_s:.2f} s"
    assert compare.table.item(row, 2).text().endswith("\u00b7 undecided (1 vs 1)")
    assert "press Repeat" in compare.table.item(row, 2).toolTip()
    assert compare.table.verticalHeaderItem(row).font().bold()  # the row the headline is about
    assert not compare.table.verticalHeaderItem(labels.index("Step (median)")).font().bold()
    step_row = labels.index("Step (median)")
    assert (
        "\u00b7 same settings as A here" in compare.table.item(step_row, 2).text()
    )  # no verdict on an untouched part

    import dataclasses

    def with_steps(a_s, b_s):
        a = dataclasses.replace(measured.a, step_s=tuple(a_s))
        b = dataclasses.replace(measured.b, step_s=tuple(b_s))
        return dataclasses.replace(measured, a=a, b=b)

    compare.show_comparison(with_steps([1.0, 1.01, 0.99, 1.0], [1.0, 0.99, 1.01, 1.0]))
    assert "Not decided by the noise rule" in compare.summary_label.text()
    # B's run found the machine quieter: its untouched U-Net steps ran 2x faster. That is load, and it says so.
    compare.show_comparison(with_steps([2.0, 2.02, 1.98, 2.01], [1.0, 0.99, 1.01, 1.0]))
    summary = compare.summary_label.text()
    assert "The load changed between the runs" in summary and "faster" not in summary
    assert (
        compare.table.item(step_row, 2).text()
        == "2.00x A's speed \u00b7 same settings as A here: the difference is load"
    )


@pytest.mark.slow
def test_speed_verdicts_follow_the_noise_rule(qtbot, generating, compare):
    import dataclasses

    from app.compare.window import WARNING_COLOUR, speed_text

    compare.b_box.setCurrentText("sdpa")  # a U-Net setting: the headline is the step
    compare.profile_spin.setValue(0)
    compare.start()
    assert wait_compared(qtbot, compare) == "finished"
    measured = compare.comparison
    step_cell = compare.table.item(0, 2).text()
    assert step_cell.startswith(speed_text(measured.speedup_per_step))
    assert measured.headline().verdict.verdict in step_cell  # whatever this machine measured, by the rule
    assert compare.summary_label.text().startswith("<b>U-Net step</b> (B's settings change only the U-Net)")

    def with_steps(a_s, b_s):
        a = dataclasses.replace(measured.a, step_s=tuple(a_s))
        b = dataclasses.replace(measured.b, step_s=tuple(b_s))
        return dataclasses.replace(measured, a=a, b=b)

    # A's median looks 3.8x slower only because a busy spell hit three of its steps: not called faster.
    compare.show_comparison(with_steps([1.0, 4.0, 4.1, 0.9, 4.2], [1.0, 1.05, 0.95, 1.1, 1.0]))
    summary = compare.summary_label.text()
    assert "no clear difference yet" in summary and "faster" not in summary
    assert "Not decided by the noise rule" in summary and "press Repeat" in summary
    cell = compare.table.item(0, 2)
    assert cell.text().endswith("\u00b7 undecided") and cell.foreground().color().name() == WARNING_COLOUR
    # Steps that beat A's without overlap: the rule says faster, and nothing warns.
    compare.show_comparison(with_steps([2.0, 2.02, 1.98, 2.01, 1.99], [1.0, 1.01, 0.99, 1.0, 1.02]))
    summary = compare.summary_label.text()
    assert "B is 2.00x as fast as A" in summary and "Not decided" not in summary
    assert compare.table.item(0, 2).text() == "2.00x A's speed \u00b7 faster"
    # The loop is one run each: beside the headline, and never called faster.
    loop_row = [compare.table.verticalHeaderItem(r).text() for r in range(compare.table.rowCount())].index(
        "Sampling loop (end to end)"
    )
    assert compare.table.item(loop_row, 2).text().endswith("undecided (1 vs 1)")
    assert "End to end (sampling loop incl. decode)" in summary


@pytest.mark.slow
def test_table_exports_to_csv_through_the_file_dialog(qtbot, generating, compare, tmp_path):
    import csv

    from PySide6.QtWidgets import QDialogButtonBox, QLineEdit

    _panel_bf16(generating)
    assert not compare.export_button.isEnabled()
    compare.start()
    assert wait_compared(qtbot, compare) == "finished"
    # Every cell is readable without hovering: rows are as tall as their wrapped text (once the table's
    # deferred layout pass has run, which a busy machine can delay past the end of the run).
    table = compare.table
    qtbot.waitUntil(
        lambda: all(table.rowHeight(r) >= table.sizeHintForRow(r) for r in range(table.rowCount())),
        timeout=10_000,
    )
    generating.services.settings.setValue(CSV_DIR_KEY, str(tmp_path))  # as left by an earlier export
    qtbot.mouseClick(compare.export_button, Qt.MouseButton.LeftButton)
    dialog = compare.outputs.csv_dialog
    qtbot.waitUntil(lambda: dialog.isVisible(), timeout=10_000)
    assert Path(dialog.directory().absolutePath()) == tmp_path  # the last folder is remembered
    name_edit = dialog.findChild(QLineEdit, "fileNameEdit")
    target = tmp_path / "numbers.csv"
    name_edit.selectAll()
    qtbot.keyClicks(name_edit, "numbers")  # the dialog adds .csv
    save = dialog.findChild(QDialogButtonBox, "buttonBox").button(QDialogButtonBox.StandardButton.Save)
    with qtbot.waitSignal(compare.csv_written, timeout=10_000):
        qtbot.mouseClick(save, Qt.MouseButton.LeftButton)
    rows = list(csv.reader(target.open(newline="", encoding="utf-8")))
    assert rows[0] == ["", f"A: {compare.comparison.a.label}", f"B: {compare.comparison.b.label}", "B vs A"]
    assert len(rows) == compare.table.rowCount() + 1
    for index, row in enumerate(rows[1:]):
        assert row[0] == compare.table.verticalHeaderItem(index).text()
        assert row[1:] == [compare.table.item(index, column).text() for column in range(3)]
    assert str(target) in compare.progress_label.text()


@pytest.mark.slow
def test_choices_that_cannot_apply_here_are_greyed_with_the_reason(qtbot, generating, compare):
    qtbot.waitUntil(lambda: bool(compare.unavailable), timeout=60_000)
    model = compare.b_box.model()

    def item(name):
        return model.item(compare.b_box.findData(name))

    assert not item("tf32").isEnabled() and "NVIDIA GPU" in item("tf32").text()
    assert not item("cuda_graphs").isEnabled() and "CUDA graphs need" in item("cuda_graphs").text()
    assert item("bf16").isEnabled() and item("bf16").text() == "bf16"
    assert item("Exact fp32").isEnabled()
    # A person stepping through the list with the keyboard never lands on a greyed entry.
    compare.b_box.setCurrentIndex(compare.b_box.findData("channels_last"))
    compare.b_box.setFocus()
    for _ in range(compare.b_box.count()):
        qtbot.keyClick(compare.b_box, Qt.Key.Key_Down)
        assert compare.choice(compare.b_box) not in compare.unavailable


@pytest.mark.slow
def test_ctrl_return_runs_in_a_freshly_opened_window(qtbot, generating):
    """Ctrl+Return pressed right after Ctrl+Shift+G opened the window starts the comparison: the window takes
    the keyboard when it opens, not only once the platform's activation arrives (the walk of issue 25 saw
    Ctrl+Return do nothing there)."""
    compare = open_compare(qtbot, generating, "tiny-latent", 3)
    assert compare is not None and compare.isVisible() and compare._job is None
    # No wait for the window to be exposed or active: the keys go where the keyboard is at once.
    target = QApplication.focusWidget()
    assert target is not None and target.window() is compare
    panel = generating.sampling_panel
    idle = (panel.progress_label.text(), panel.progress_bar.value())
    qtbot.keyClick(target, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert compare._job is not None and generating.state.job_running  # started
    # The Generate panel says another run has the engine, not "Starting..." of a generation of its own ...
    assert panel.progress_label.text().startswith("Waiting: another run is using the engine")
    assert wait_compared(qtbot, compare) == "finished"
    # ... and once it ends, its line is what it was (it stayed "Starting... 0%" while idle).
    assert (panel.progress_label.text(), panel.progress_bar.value()) == idle
    compare.close()


@pytest.mark.slow
def test_the_keypad_enter_runs_too(qtbot, generating):
    """The empty views say "Ctrl+Enter": the keypad's Enter (a key apart from Return) starts the run as well."""
    compare = open_compare(qtbot, generating, "tiny-latent", 2)
    assert "Ctrl+Enter" in compare.views["a"]["axial"].empty_text
    qtbot.keyClick(
        QApplication.focusWidget(),
        Qt.Key.Key_Enter,
        Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.KeypadModifier,
    )
    assert compare._job is not None  # started
    assert wait_compared(qtbot, compare) == "finished"
    compare.close()


def _measured_here(generating, qtbot) -> None:
    """A measurement of tiny-latent on this machine: bf16+sdpa clearly faster at 52 dB, Low memory even."""
    measured = generating.measured
    qtbot.waitUntil(lambda: measured.looked_up and measured.model_id == "tiny-latent", timeout=30_000)

    def row(name, seconds, speedup, verdict, psnr, config):
        return {
            "name": name,
            "config": config,
            "end_to_end_s": seconds,
            "step_ms_median": 10.0,
            "decode_s_median": 0.1,
            "speedup_end_to_end": speedup,
            "end_to_end_verdict": {"verdict": verdict, "words": verdict},
            "psnr_db": psnr,
        }

    result = {
        "rows": [
            row("fp32", 1.3, None, None, float("inf"), {}),
            row("bf16+sdpa", 1.0, 1.3, "faster", 52.0, {"autocast": "bf16", "attention": "sdpa"}),
            row(
                "preset:Low memory", 1.25, 1.04, "too close to call", float("inf"), {"streamed_decode": True}
            ),
        ],
        "created": "2026-12-01",
        "machine_words": "this test's CPU",
    }
    measured.set_result("tiny-latent", result)


@pytest.mark.slow
def test_the_choices_are_the_presets_by_name_with_what_was_measured_here(
    qtbot, generating, compare, screenshot
):
    """B offered ~40 raw names with no ratios and no 'Fastest here'; now the presets come first by the names of
    the Optimization section, each with its measured ratio, and Fastest here runs the recommendation."""
    box = compare.b_box
    qtbot.waitUntil(lambda: generating.measured.looked_up, timeout=30_000)
    fastest = box.model().item(box.findData("Fastest here"))
    assert not fastest.isEnabled() and "not measured here yet" in fastest.text()
    _measured_here(generating, qtbot)
    qtbot.waitUntil(lambda: box.model().item(box.findData("Fastest here")).isEnabled(), timeout=60_000)
    # The check of what can apply on this device runs in the background; its answer greys out the GPU preset.
    qtbot.waitUntil(lambda: "Fast (GPU)" in compare.unavailable, timeout=60_000)
    texts = [box.itemText(i) for i in range(box.count())]
    assert texts[0] == "Fastest here (\u2265 40 dB) \u00b7 bf16+sdpa, 1.30x fp32 here"
    assert texts[1] == "Exact fp32 \u00b7 the reference, 1.3 s here"
    assert texts[2].startswith("Fast (GPU) \u2014 not on ") and "TF32 needs an NVIDIA GPU" in texts[2]
    assert not box.model().item(2).isEnabled()
    assert texts[3:5] == ["Low memory \u00b7 1.04x fp32 here", "Fast decode (CPU) \u00b7 not measured here"]
    assert (
        "bf16+sdpa \u00b7 1.30x fp32 here" in texts and "int8" in texts
    )  # single settings: ratio where measured
    heading = texts.index("Single settings (volsynth bench names)")
    assert not box.model().item(heading).isEnabled()
    # Chosen with the keyboard, from the top of the list, as a person does.
    box.setFocus()
    qtbot.waitUntil(box.hasFocus, timeout=5_000)
    qtbot.keyClick(box, Qt.Key.Key_Home)
    assert compare.choice(box) == "Fastest here"
    compare.profile_spin.setValue(0)
    qtbot.keyClick(compare, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert wait_compared(qtbot, compare) == "finished"
    assert set(compare.comparison.b.applied()) == {"autocast", "attention"}
    table = compare.table
    for size in ((1024, 700), (1600, 1000)):
        compare.resize(*size)
        qtbot.waitUntil(lambda: compare.table.rowCount() > 0, timeout=5_000)
        QApplication.processEvents()
        # Each column's header is read whole: its lines fit the column, broken where the setting has a '+'.
        header = compare.table.horizontalHeader()
        for column in range(3):
            text = compare.table.horizontalHeaderItem(column).text()
            assert all(
                header.fontMetrics().horizontalAdvance(line) < header.sectionSize(column)
                for line in text.split("\n")
            ), (size, text, header.sectionSize(column))
            assert text.replace("\n", "").replace(" ", "") == compare.numbers._header_texts[column].replace(
                " ", ""
            )
        # A long choice in a narrow window ends in an ellipsis (its tooltip and the list show it whole).
        shown = box.shown_text()
        assert shown == box.currentText() or (
            shown.endswith("\u2026") and box.currentText().startswith(shown[:-1])
        )
        # The memory rows' notes are read whole (rows grow to their wrapped text): scroll to them and look.
        memory = next(r for r in range(table.rowCount()) if "memory" in table.verticalHeaderItem(r).text())
        qtbot.waitUntil(
            lambda: all(table.rowHeight(r) >= table.sizeHintForRow(r) for r in range(table.rowCount())),
            timeout=5_000,
        )
        table.scrollToItem(table.item(memory, 2), table.ScrollHint.PositionAtTop)
        QApplication.processEvents()
        compare.table.grab().save(str(SCREENSHOTS / f"compare-table-{size[0]}x{size[1]}.png"))
        screenshot(compare, f"compare-measured-choices-{size[0]}x{size[1]}")
