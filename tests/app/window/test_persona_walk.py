"""The two personas' paths, walked once end to end by keys and clicks (slow): a radiologist generates,
inspects, saves and keeps a volume in the vault; a researcher compares two settings, runs a 4-volume cohort
and plans a multi-device run from the Plan view against a real ``volsynth serve --device xla``."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit

from tests.app.keys import type_into
from tests.app.modal import answer_modal
from tests.app.remote.xla_server import PLAN_TIMEOUT_MS, open_plan_dialog
from tests.app.remote.xla_server import connect as _connect
from tests.app.vault.helpers import PASSPHRASE
from tests.app.vault.helpers import point_at_new_vault as _point_at_new_vault
from tests.app.vault.helpers import wait_task as _wait_task

pytestmark = [pytest.mark.render, pytest.mark.slow]


def test_radiologist_generate_inspect_save_vault(qtbot, main_window, tmp_path, screenshot):
    window = main_window
    window.state.select_model(window.state.model_by_id("tiny-latent"))
    window.sampling_panel.steps_spin.setValue(3)
    with qtbot.waitSignal(window.generation.ended, timeout=240_000) as ended:
        qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)
    assert ended.args == ["finished"]
    qtbot.waitUntil(lambda: not window.state.job_running, timeout=10_000)
    entry = window.state.shown
    assert window.isWindowModified() and entry.needs_saving
    axial = window.viewer.axial
    axial.setFocus()
    qtbot.keyClick(axial, Qt.Key.Key_Plus)  # inspect: zoom in, change the layout, step a slice
    qtbot.keyClick(axial, Qt.Key.Key_Up)
    window.viewer_toolbar.layout_group.actions()[1].trigger()  # Conventional
    window.settings.setValue("files/last_save_dir", str(tmp_path))
    errors: list = []

    def type_name(dialog) -> None:
        name = dialog.findChild(QLineEdit, "fileNameEdit")
        name.selectAll()
        qtbot.keyClicks(name, "walk")
        qtbot.keyClick(name, Qt.Key.Key_Return)

    answer_modal(type_name, errors)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    qtbot.keyClick(window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: entry.saved_file is not None, timeout=60_000)
    assert not errors and (tmp_path / "walk.nii.gz").is_file() and not window.isWindowModified()

    _point_at_new_vault(window, tmp_path / "vault")
    controller = window.vault_controller
    controller.menu.new_action.trigger()
    dialog = controller.locking.unlock_dialog
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.confirm_edit.setText(PASSPHRASE)
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "create") == "finished"
    qtbot.waitUntil(lambda: controller.session.is_unlocked and not controller.tasks.running, timeout=10_000)
    controller.menu.save_action.trigger()
    assert _wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    assert "the vault as" in entry.saved_to
    screenshot(window, "walk-radiologist")


def test_researcher_compare_cohort_and_plan(qtbot, main_window, tmp_path, xla_server, screenshot):
    pytest.importorskip("ray", reason="cohorts need the 'cohort' extra (ray)")
    window = main_window
    window.state.select_model(window.state.model_by_id("tiny-latent"))
    window.sampling_panel.steps_spin.setValue(3)
    qtbot.keyClick(
        window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )
    compare = window.compare.window
    qtbot.waitExposed(compare)
    with qtbot.waitSignal(compare.comparison_ended, timeout=240_000) as ended:
        qtbot.mouseClick(compare.run_button, Qt.MouseButton.LeftButton)
    assert ended.args == ["finished"]
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=10_000)
    screenshot(compare, "walk-compare")
    compare.close()

    window.cohort.action.trigger()
    dialog = window.cohort.dialog
    qtbot.waitExposed(dialog)
    type_into(qtbot, dialog.seeds_spin, "4")
    assert dialog.count_label.text().startswith("4 volumes")
    dialog.out_edit.setText(str(tmp_path / "cohort"))
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.job is None, timeout=600_000)
    assert dialog.summary is not None, dialog.status.text()
    assert (dialog.summary.done, dialog.summary.total) == (4, 4)
    screenshot(dialog, "walk-cohort")
    dialog.close()

    _connect(qtbot, window, xla_server)
    plan = open_plan_dialog(qtbot, window)
    assert plan.topology_box.currentText() == "v5e:2x4"  # as the README's examples
    plan.top_spin.setValue(1)
    qtbot.mouseClick(plan.plan_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: plan.table.rowCount() > 0, timeout=PLAN_TIMEOUT_MS)
    qtbot.waitUntil(lambda: not window.runner.running("plan-on-server"), timeout=PLAN_TIMEOUT_MS)
    assert plan.status_label.text().startswith("Planned tiny-latent on v5e:2x4 in ")
    QApplication.processEvents()
    screenshot(plan, "walk-plan")
    plan.close()
    assert QFileDialog is not None
