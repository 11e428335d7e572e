"""Session volumes into the vault (app/vault/saving.py): a generated volume saved and opened again as it was, its
tissue maps and space with it (the overlay on for them, never in crash recovery), and the same volume twice asks
first (real vaults in tmp_path, no main window: the generated volumes are fed to the session)."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from tests.app.vault.helpers import (
    create_via_dialog,
    generated_entry,
    install_viewer,
    press,
    save_to_vault,
    wait_task,
)

render = pytest.mark.render

TISSUES, MNI = ["GM", "WM", "CSF", "ventricles"], "MNI152NLin2009aSym"


@render
def test_save_generated_volume_to_vault_and_open_it_again(qtbot, vault_app):
    app = vault_app
    _viewer, bars = install_viewer(app.services)
    controller = create_via_dialog(qtbot, app.controller)
    assert not controller.menu.save_action.isEnabled()
    generated = generated_entry(app.state, seed=1234)
    assert app.state.shown is generated and controller.menu.save_action.isEnabled()
    assert controller.menu.session_menu(generated).actions()[0].isEnabled()  # the session list's context menu

    save_to_vault(qtbot, controller, rows=1)
    info = controller.listing.items[0]
    assert info.kind == "synthetic" and info.label == generated.name
    assert info.provenance["seed"] == 1234 and info.provenance["synthetic"] is True
    patient, study, _date, kind, label = controller.browser.row_texts()[0]
    assert (patient, kind, label) == ("\u2014", "Synthetic", generated.name) and "seed 1234" in study

    with qtbot.waitSignal(app.volume_opened, timeout=20_000) as opened:
        controller.opening.open_item(info.id)
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    reopened = opened.args[0]
    assert reopened.synthetic and reopened.provenance["seed"] == 1234
    assert np.array_equal(reopened.data, generated.data) and np.allclose(reopened.affine, generated.affine)
    # A volume without tissue maps: none stored, none opened, the overlay's controls off as before.
    assert info.tissue_maps == () and "Tissue maps" not in controller.browser.table.item(0, 0).toolTip()
    assert reopened.tissue == {} and reopened.space is None and app.state.shown is reopened
    assert not bars.toolbar.tissue_toolbar.tissue_action.isEnabled()
    assert "tissue maps" not in app.status()


@render
def test_generated_tissue_maps_go_to_the_vault_and_come_back_with_the_overlay(qtbot, vault_app, recovery):
    """A volume with paired tissue maps in MNI space, as a model that makes them leaves it in the session."""
    from app.core.tissue import ALL_TISSUES
    from app.window.status_bar import WindowStatus

    app = vault_app
    viewer, bars = install_viewer(app.services)
    bar = bars.toolbar.tissue_toolbar
    controller = create_via_dialog(qtbot, app.controller)
    rng = np.random.default_rng(7)
    maps = {name: rng.random((10, 12, 8)).astype(np.float32) for name in TISSUES}
    generated = generated_entry(app.state, seed=3, tissue=maps, space=MNI)
    assert generated.tissue_names == TISSUES and generated.space == MNI

    save_to_vault(qtbot, controller, rows=1)
    (info,) = controller.listing.items
    assert info.kind == "synthetic" and list(info.tissue_maps) == TISSUES and generated.saved
    assert info.provenance["space"] == MNI
    tooltip = controller.browser.table.item(0, 0).toolTip()  # the browser says the item has maps
    assert "Tissue maps: GM, WM, CSF, ventricles" in tooltip and f"Space: {MNI}" in tooltip

    app.state.remove_volume(generated)  # only the vault has it now
    assert app.state.volumes == [] and not bar.tissue_action.isEnabled()
    controller.browser.select_item(info.id)
    with qtbot.waitSignal(app.volume_opened, timeout=20_000) as opened:
        controller.browser.open_button.click()
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    reopened = opened.args[0]
    assert app.state.shown is reopened and reopened.kind == "opened" and reopened.synthetic
    assert "with tissue maps GM, WM, CSF, ventricles" in app.status()
    assert np.array_equal(reopened.data, generated.data) and np.allclose(reopened.affine, generated.affine)
    assert reopened.tissue_names == TISSUES and reopened.space == MNI
    for name in TISSUES:
        assert reopened.tissue[name].dtype == np.float32
        assert np.array_equal(reopened.tissue[name], generated.tissue[name]), name
    status = WindowStatus(app.host.statusBar())  # the status bar's labels, fed the shown volume
    status.show_volume(app.state.shown)
    assert status.space_label.text() == f"Space: {MNI}"

    # The overlay's controls are on for it, and Ctrl+T paints the maps over the slices.
    assert bar.tissue_action.isEnabled() and bar.tissue_box.isEnabled() and bar.opacity_slider.isEnabled()
    assert [bar.tissue_box.itemData(i) for i in range(bar.tissue_box.count())] == [ALL_TISSUES, *TISSUES]
    before = viewer.axial.grab().toImage()
    press(qtbot, app.host, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)  # Ctrl+T
    assert app.state.tissue_shown() == ALL_TISSUES
    assert viewer.axial.grab().toImage() != before
    # Opened from the vault, it is never written to the crash-recovery folder in plaintext.
    qtbot.waitUntil(lambda: not app.services.runner.running("recovery-keep"), timeout=10_000)
    assert reopened.uid not in recovery.store.kept()


@render
def test_saving_the_same_volume_twice_asks(qtbot, vault_app):
    app = vault_app
    controller = create_via_dialog(qtbot, app.controller)
    generated_entry(app.state)
    save_to_vault(qtbot, controller, rows=1)

    controller.menu.save_action.trigger()  # the same volume again: asked, nothing stored yet
    box = controller.messages.duplicate_box
    assert box is not None and "already in the vault" in box.text()
    assert all(t.name == "list" for t in controller.tasks.running)
    box.button(QMessageBox.StandardButton.Cancel).click()
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    assert len(controller.listing.items) == 1

    controller.menu.save_action.trigger()
    controller.messages.duplicate_yes_button.click()
    assert wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 2, timeout=10_000)
