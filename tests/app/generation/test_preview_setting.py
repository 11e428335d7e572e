"""The Generate panel's Previews setting: how often a run decodes its current estimate, chosen with the mouse,
sent with the request, and remembered at the next start."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.app.runs import generate


def _click_item(qtbot, combo, text: str) -> None:
    """Open the combo box's list with a click and pick the item in it with the keys, as a person does (a
    click inside a list that has only just opened is taken by Qt as the end of the opening click)."""
    qtbot.mouseClick(combo, Qt.MouseButton.LeftButton)
    view = combo.view()
    qtbot.waitUntil(view.isVisible, timeout=5_000)
    row = combo.findText(text)
    assert row >= 0, f"no {text!r} among {[combo.itemText(i) for i in range(combo.count())]}"
    qtbot.keyClick(view, Qt.Key.Key_Home)
    for _ in range(row):
        qtbot.keyClick(view, Qt.Key.Key_Down)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5_000)
    assert combo.currentText() == text


def _generate(qtbot, window) -> list[int]:
    """Run the panel's request to its end; the steps whose previews were drawn."""
    drawn: list[int] = []
    window.generation.preview_drawn.connect(drawn.append)
    outcome = generate(qtbot, window, click=True)
    window.generation.preview_drawn.disconnect(drawn.append)
    assert outcome == "finished"
    return drawn


@pytest.mark.slow
def test_previews_are_chosen_in_the_generate_panel_and_remembered(
    qtbot, themed_app, registry, qt_settings, error_dialogs
):
    from app.window.main_window import MainWindow

    first = MainWindow(registry=registry, settings=qt_settings, enable_3d=False, preload_torch=False)
    qtbot.addWidget(first)
    first.resize(1500, 920)
    first.show()
    qtbot.waitExposed(first)
    first.state.select_model(first.state.model_by_id("tiny-latent"))
    panel = first.sampling_panel
    box = panel.previews_box
    assert box.currentText() == "Twice per run"  # the default: a CPU decode per preview costs steps
    panel.steps_spin.setValue(10)

    _click_item(qtbot, box, "Final volume only")
    assert first.state.form.to_request().preview_interval == 0

    _click_item(qtbot, box, "4 per run")
    assert first.state.form.to_request().preview_interval == 2
    assert _generate(qtbot, first)  # drawn in the slice views
    assert first.generation.last_run["preview_steps"] == [2, 4, 6, 8]  # cheap previews are never skipped
    assert first.generation.last_run["request"]["preview_interval"] == 2
    first.close()

    second = MainWindow(registry=registry, settings=qt_settings, enable_3d=False, preload_torch=False)
    qtbot.addWidget(second)
    second.show()
    assert second.sampling_panel.previews_box.currentText() == "4 per run"
    assert second.state.form.preview_interval == -4
    second.close()


def test_a_saved_interval_the_list_lacks_is_shown_as_it_is(qtbot, main_window):
    """A settings file from before the list (or edited by hand) with 'every 5 steps' keeps it, named."""
    panel = main_window.sampling_panel
    main_window.state.form.set(preview_interval=5)
    assert panel.previews_box.currentText() == "Every 5 steps"
    _click_item(qtbot, panel.previews_box, "Once, halfway")
    assert main_window.state.form.preview_interval == -1
