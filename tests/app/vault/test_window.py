"""The vault in the main window: what is about the window itself. The Vault menu's place in the menu bar, a
generated volume taken from the Generate button into the vault and opened again (its name in the window's
title), the window's Save and Save As keys, Save 3D Screenshot and drops asking the vault's boundary, and
closing the window locking the vault and writing no remembered path. The vault's own behaviour is tested on
its controller over the app's services in the other files here."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QColor, QImage

from tests.app.runs import generate
from tests.app.vault.helpers import (
    PASSPHRASE,
    drop,
    mnemonics,
    open_scan_by_enter,
    patient_file,
    press,
    wait_task,
)

render = pytest.mark.render

CTRL, SHIFT = Qt.KeyboardModifier.ControlModifier, Qt.KeyboardModifier.ShiftModifier


@pytest.mark.slow
@render
def test_generated_volume_goes_to_the_vault_and_back_in_the_main_window(
    qtbot, vault_window, save_dialogs, error_dialogs
):
    window = vault_window
    controller, menu = window.vault_controller, window.vault_controller.menu
    titles = [a.text().replace("&", "") for a in window.menuBar().actions()]
    assert titles.index("Vault") == titles.index("Help") - 1  # the Vault menu comes before Help
    letters = mnemonics(window.menuBar().actions())  # its mnemonic is no other menu's (View's: Alt+V)
    assert len(letters) == len(set(letters)), letters

    menu.new_action.trigger()  # Vault > New Vault...
    dialog = controller.locking.unlock_dialog
    assert dialog is not None and dialog.mode == "create"
    qtbot.keyClicks(dialog.passphrase_edit, PASSPHRASE)
    qtbot.keyClicks(dialog.confirm_edit, PASSPHRASE)
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "create") == "finished"
    qtbot.waitUntil(lambda: controller.session.is_unlocked and not controller.tasks.running, timeout=10_000)
    assert window.docks["vaultDock"].isVisible()

    window.state.select_model(window.state.model_by_id("tiny-latent"))
    window.sampling_panel.seed_spin.setValue(1234)
    assert not menu.save_action.isEnabled()
    assert generate(qtbot, window, steps=3, click=True) == "finished"
    generated = window.state.shown
    assert generated.kind == "generated" and menu.save_action.isEnabled()
    assert menu.session_menu(generated).actions()[0].isEnabled()  # the session list's context menu

    menu.save_action.trigger()  # Vault > Save Shown Volume to Vault
    assert wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    info = controller.listing.items[0]
    assert info.kind == "synthetic" and info.label == generated.name and generated.saved
    assert info.provenance["seed"] == 1234 and info.provenance["synthetic"] is True
    assert "seed 1234" in controller.browser.row_texts()[0][1]

    controller.browser.select_item(info.id)
    with qtbot.waitSignal(window.volume_opened, timeout=20_000) as opened:
        qtbot.keyClick(controller.browser.table, Qt.Key.Key_Return)  # Enter on the row opens it
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    reopened = opened.args[0]
    assert window.state.shown is reopened and reopened.synthetic and reopened.provenance["seed"] == 1234
    assert np.array_equal(reopened.data, generated.data) and np.allclose(reopened.affine, generated.affine)
    assert reopened.tissue == {} and not window.tissue_toolbar.tissue_action.isEnabled()
    assert "tissue maps" not in window.statusBar().currentMessage()
    assert reopened.name in window.windowTitle()

    # renamed in the vault: the window's title follows
    controller.browser.details_button.click()
    details = controller.item_actions.details_dialog
    details.label_edit.clear()
    qtbot.keyClicks(details.label_edit, "T1 follow-up")
    details.ok_button.click()
    assert wait_task(qtbot, controller, "edit") == "finished"
    qtbot.waitUntil(lambda: "T1 follow-up" in window.windowTitle(), timeout=10_000)
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)

    # Ctrl+S and Ctrl+Shift+S on a vault item ask the vault's boundary; no save dialog, nothing written
    boundary = controller.boundary
    for modifiers in (CTRL, CTRL | SHIFT):
        press(qtbot, window, Qt.Key.Key_S, modifiers)
        qtbot.waitUntil(lambda: boundary.prompt is not None and boundary.prompt.isVisible(), timeout=5_000)
        boundary.prompt.reject()
        qtbot.waitUntil(lambda: boundary.prompt is None, timeout=5_000)
    assert save_dialogs.proposed == [] and reopened.saved_file is None
    assert error_dialogs == []

    window.close()  # closing the window locks the vault
    assert not controller.session.vault.is_unlocked and not controller.session.is_unlocked


@pytest.mark.slow
@render
def test_screenshot_drop_and_close_of_the_window_keep_to_the_vault_rules(
    qtbot, vault_window, nibabel_data, tmp_path, save_dialogs, error_dialogs, monkeypatch
):
    window = vault_window
    controller = window.vault_controller
    entry = open_scan_by_enter(
        qtbot, controller, window.state, patient_file(tmp_path, nibabel_data / "anatomical.nii")
    )

    # File > Save 3D Screenshot of a vault item asks the boundary (marked as patient data, here)
    picture = QImage(320, 240, QImage.Format.Format_RGB888)
    picture.fill(QColor(40, 40, 40))
    monkeypatch.setattr(window.viewer.view3d, "render_image", lambda: picture)
    save_dialogs.answer = str(tmp_path / "shot.png")
    window.window_actions.screenshot.trigger()
    boundary = controller.boundary
    qtbot.waitUntil(lambda: boundary.question is not None and boundary.question.isVisible(), timeout=5_000)
    with qtbot.waitSignal(
        controller.task_ended, timeout=30_000, check_params_cb=lambda n, _: n == "screenshot"
    ) as done:
        boundary.question.mark_button.click()
    assert done.args[1] == "finished" and error_dialogs == []
    assert [Path(p).name for p in save_dialogs.proposed] == [f"scan-{entry.vault_item.id[:12]}-3d.png"]
    assert "PATIENT DATA" in QImage(str(tmp_path / "shot.png")).text("Description")

    # a file dropped on the window (not the browser) is still opened by the viewer, not imported
    source = tmp_path / "patients" / "Doe_Jane_t2.nii"
    shutil.copy(nibabel_data / "anatomical.nii", source)
    with qtbot.waitSignal(window.volume_opened, timeout=20_000):
        drop(window, [source], QPointF(300, 300))
    assert window.state.shown.path == source and len(controller.listing.items) == 1
    assert window.state.recent.paths() == [str(source.resolve())]

    # remembering switched off, closing the window writes no path back
    controller.remember_action.trigger()
    window.close()
    assert not controller.session.is_unlocked
    window.settings.sync()
    text = Path(window.settings.fileName()).read_text()
    assert "Doe_Jane" not in text and "patients" not in text, text
