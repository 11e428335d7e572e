"""The vault's boundary (app/vault/boundary.py) holds on every path: a volume opened from the vault leaves it only
through Export or an asked, audited copy. Driven by the app's file commands, clicks and keys, with a real vault
in tmp_path and no main window (test_window.py checks the window's keys and menus reach here).

Paths out, one test each: Save and Save As ask and write nothing silently; the copy is audited and stays out of
Open Recent; Export offers and writes the item's maps; a 3D screenshot is marked as patient data (or refused) as
chosen once; crash recovery never keeps a vault item; the maps computed in the viewer are said to be
session-only where they are named and are kept, not segmented again, by the vault browser's Compute Tissue Maps.
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage

from tests.app.vault.helpers import (
    audit,
    create_via_dialog,
    files_under,
    generated_entry,
    install_viewer,
    open_scan_by_enter,
    patient_file,
    press,
    scan_file,
    wait_task,
)

render = pytest.mark.render


def test_save_on_a_vault_scan_asks_and_a_confirmed_copy_is_audited_and_never_recent(
    qtbot, vault_app, nibabel_data, tmp_path, save_dialogs, error_dialogs, capsys, screenshot
):
    app = vault_app
    controller = app.controller
    entry = open_scan_by_enter(
        qtbot, controller, app.state, patient_file(tmp_path, nibabel_data / "anatomical.nii")
    )
    outside = tmp_path / "outside"
    outside.mkdir()

    # File > Save: a prompt, no save dialog, nothing written
    app.files.save_shown()
    boundary = controller.boundary
    qtbot.waitUntil(lambda: boundary.prompt is not None and boundary.prompt.isVisible(), timeout=5_000)
    prompt = boundary.prompt
    assert "opened from the encrypted vault (a patient scan)" in prompt.text()
    assert "the image (" in prompt.informativeText() and "provenance sidecar" in prompt.informativeText()
    assert prompt.defaultButton() is prompt.export_button
    assert save_dialogs.proposed == []
    screenshot(prompt, "vault-save-a-copy-prompt")
    prompt.reject()  # Escape / Cancel
    qtbot.waitUntil(lambda: boundary.prompt is None, timeout=5_000)
    assert save_dialogs.proposed == [] and files_under(outside) == [] and entry.saved_file is None

    # Save again, Save a Copy Outside the Vault: the proposed name carries no patient detail
    save_dialogs.answer = str(outside / "copy.nii.gz")
    app.files.save_shown()
    qtbot.waitUntil(lambda: boundary.prompt is not None and boundary.prompt.isVisible(), timeout=5_000)
    with qtbot.waitSignal(
        controller.task_ended, timeout=30_000, check_params_cb=lambda n, _: n == "copy"
    ) as done:
        boundary.prompt.copy_button.click()
    assert done.args[1] == "finished" and error_dialogs == []
    proposed = Path(save_dialogs.proposed[-1]).name
    assert proposed == f"scan-{entry.vault_item.id[:12]}.nii.gz" and "Doe" not in proposed
    assert files_under(outside) == ["copy.json", "copy.nii.gz"]
    copy = nib.load(outside / "copy.nii.gz")
    assert np.array_equal(np.asarray(copy.dataobj, dtype=np.float32), entry.data)
    sidecar = json.loads((outside / "copy.json").read_text())
    assert sidecar["copied_from_vault_item"] == entry.vault_item.id[:12] and "Doe" not in json.dumps(sidecar)
    assert "recorded in the vault's audit trail" in app.status()

    # nothing remembered: not saved (the next Save asks again), not in Open Recent, no folder noted
    assert entry.saved_file is None and app.state.recent.paths() == []
    assert not app.files.recent_menu.isEnabled()
    assert str(outside) not in app.settings_text()

    # and `volsynth vault audit` lists the copy with its files
    vault_folder = controller.session.path
    controller.locking.lock()
    printed = audit(vault_folder, tmp_path, capsys)
    line = next(line for line in printed.splitlines() if "copy_out" in line)
    assert entry.vault_item.id[:12] in line and str(outside / "copy.nii.gz") in line, line


def test_save_as_on_a_vault_item_offers_export_with_its_maps(
    qtbot, vault_app, nibabel_data, tmp_path, save_dialogs, error_dialogs, capsys, screenshot
):
    app = vault_app
    controller = app.controller
    entry = open_scan_by_enter(
        qtbot, controller, app.state, patient_file(tmp_path, nibabel_data / "anatomical.nii")
    )
    item_id = entry.vault_item.id
    # maps kept with the item (as the vault browser's Compute Tissue Maps leaves them)
    rng = np.random.default_rng(4)
    shape = entry.vault_item.shape
    maps = {name: rng.random(shape).astype(np.float32) for name in ("GM", "WM", "CSF")}
    controller.session.vault.add_tissue_maps(
        item_id, maps, {"tissue_maps_source": "method", "method": "test"}
    )
    controller.listing.refresh()
    qtbot.waitUntil(lambda: controller.listing.item(item_id).tissue_maps != (), timeout=10_000)

    app.files.save_file_dialog()  # File > Save As
    boundary = controller.boundary
    qtbot.waitUntil(lambda: boundary.prompt is not None and boundary.prompt.isVisible(), timeout=5_000)
    boundary.prompt.export_button.click()
    exporting = controller.exporting
    qtbot.waitUntil(
        lambda: exporting.export_dialog is not None and exporting.export_dialog.isVisible(), timeout=5_000
    )
    dialog = exporting.export_dialog
    assert dialog.tissue_box.isVisible() and dialog.tissue_box.isChecked()
    assert dialog.tissue_box.text() == "Include its 3 tissue maps (GM, WM, CSF)"
    assert save_dialogs.proposed == []
    screenshot(dialog, "vault-export-with-maps")
    out = tmp_path / "export"
    dialog.folder_edit.setText(str(out))
    with qtbot.waitSignal(controller.task_ended, timeout=30_000, check_params_cb=lambda n, _: n == "export"):
        qtbot.keyClick(dialog.folder_edit, Qt.Key.Key_Return)
    assert error_dialogs == []
    stem = f"scan-{item_id[:12]}"
    assert files_under(out) == sorted(
        [f"{stem}.nii.gz", *(f"{stem}_label-{n}_probseg.nii.gz" for n in ("GM", "WM", "CSF"))]
    )
    for name, stored in maps.items():  # read back by nibabel, on the stored grid, as kept
        assert np.array_equal(
            np.asarray(nib.load(out / f"{stem}_label-{name}_probseg.nii.gz").dataobj), stored
        )
    # File > Open of the export brings the maps back with the scan
    with qtbot.waitSignal(app.volume_opened, timeout=20_000) as reopened:
        app.files.open_path(out / f"{stem}.nii.gz")
    assert set(reopened.args[0].tissue) == set(maps)

    vault_folder = controller.session.path
    controller.locking.lock()
    line = next(line for line in audit(vault_folder, tmp_path, capsys).splitlines() if " export " in line)
    assert (
        '"tissue_maps": ["GM", "WM", "CSF"]' in line and str(out) in line and '"deidentified": true' in line
    )


@render
def test_a_3d_screenshot_of_a_vault_item_is_marked_as_patient_data_or_refused(
    qtbot, vault_app, nibabel_data, tmp_path, save_dialogs, error_dialogs, capsys
):
    """The 3D view's picture is fed as an image (what ``View3D.render_image`` returns)."""
    app = vault_app
    controller = app.controller
    entry = open_scan_by_enter(
        qtbot, controller, app.state, patient_file(tmp_path, nibabel_data / "anatomical.nii")
    )
    boundary = controller.boundary
    rendered = []

    def render_image() -> QImage:
        image = QImage(320, 240, QImage.Format.Format_RGB888)
        image.fill(QColor(40, 40, 40))
        rendered.append(image)
        return image

    save_dialogs.answer = str(tmp_path / "shot.png")
    boundary.screenshot(entry, render_image)  # File > Save 3D Screenshot on a vault item: asked once how
    qtbot.waitUntil(lambda: boundary.question is not None and boundary.question.isVisible(), timeout=5_000)
    with qtbot.waitSignal(
        controller.task_ended, timeout=30_000, check_params_cb=lambda n, _: n == "screenshot"
    ) as done:
        boundary.question.mark_button.click()
    assert done.args[1] == "finished" and error_dialogs == []
    assert Path(save_dialogs.proposed[-1]).name == f"scan-{entry.vault_item.id[:12]}-3d.png"
    shot = QImage(str(tmp_path / "shot.png"))
    assert not shot.isNull() and "PATIENT DATA" in shot.text("Description")
    banner = shot.pixelColor(3, 3)
    assert (banner.red(), banner.green(), banner.blue()) == (0xB0, 0x00, 0x20)  # the red band across the top
    middle = shot.pixelColor(shot.width() // 2, shot.height() - 3)
    assert (middle.red(), middle.green(), middle.blue()) == (40, 40, 40)  # the picture itself below the band
    assert controller.menu.screenshot_actions["mark"].isChecked()

    # Chosen once: the next screenshot asks nothing; switched to Refuse in the Vault menu, nothing is written
    controller.menu.screenshot_actions["refuse"].trigger()
    save_dialogs.answer = str(tmp_path / "refused.png")
    boundary.screenshot(entry, render_image)
    assert boundary.question is None and not (tmp_path / "refused.png").exists()
    assert "refused" in app.status()

    vault_folder = controller.session.path
    controller.locking.lock()
    screenshots = [
        line for line in audit(vault_folder, tmp_path, capsys).splitlines() if "screenshot" in line
    ]
    assert len(screenshots) == 1 and str(tmp_path / "shot.png") in screenshots[0]


def test_crash_recovery_never_keeps_and_no_drag_takes_a_volume_opened_from_the_vault(
    qtbot, vault_app, recovery
):
    app = vault_app
    controller = create_via_dialog(qtbot, app.controller)
    made = generated_entry(app.state)  # a generated volume, kept for crash recovery, then stored in the vault
    qtbot.waitUntil(lambda: made.uid in recovery.store.kept(), timeout=10_000)
    controller.saving.save_entry(made)
    assert wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: len(controller.listing.items) == 1, timeout=10_000)
    with qtbot.waitSignal(app.volume_opened, timeout=20_000) as opened:
        controller.opening.open_item(controller.listing.items[0].id)
    entry = opened.args[0]
    assert entry.synthetic and entry.vault_item is not None
    # The recovery store holds the generated volume only; the decrypted copy from the vault is never written.
    qtbot.waitUntil(lambda: not app.services.runner.running("recovery-keep"), timeout=10_000)
    assert recovery.store.kept() == [made.uid]
    images = [p for p in recovery.store.folder.rglob("*.nii.gz") if "_label-" not in p.name]
    assert len(images) == 1
    # Nor can it be dragged out to a file manager: neither list it is shown in starts a drag.
    assert not app.session_panel.list.dragEnabled() and not controller.browser.table.dragEnabled()


@pytest.mark.slow
def test_viewer_maps_of_a_vault_scan_are_said_session_only_and_kept_by_the_browser(
    qtbot, vault_app, tmp_path, error_dialogs, monkeypatch
):
    app = vault_app
    controller = app.controller
    _viewer, bars = install_viewer(app.services)
    entry = open_scan_by_enter(qtbot, controller, app.state, scan_file(tmp_path))
    computer = bars.tissue_maps
    ctrl_shift = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    press(qtbot, app.host, Qt.Key.Key_T, ctrl_shift)  # Ctrl+Shift+T: Compute Tissue Maps in the viewer
    qtbot.waitUntil(lambda: entry.tissue != {} and computer.job is None, timeout=60_000)
    label = computer.source_label.text()
    assert (
        label.startswith("Maps segmented: VolSynth EM")
        and "this session only, not kept in the vault" in label
    )
    session_maps = {name: array.copy() for name, array in entry.tissue.items()}

    # The vault browser's Compute Tissue Maps keeps those maps (no second segmentation)
    from engine.anatomy import segment as segmenting

    def refuse(*args, **kwargs):
        raise AssertionError("segmented again")

    monkeypatch.setattr(segmenting, "segment", refuse)
    with qtbot.waitSignal(
        controller.task_ended, timeout=60_000, check_params_cb=lambda n, _: n == "tissue"
    ) as done:
        controller.item_actions.compute_tissue_maps(entry.vault_item.id)
    assert done.args[1] == "finished" and error_dialogs == []
    qtbot.waitUntil(lambda: "not kept in the vault" not in computer.source_label.text(), timeout=10_000)
    stored = controller.session.vault.open_item(entry.vault_item.id, with_tissue=True)
    assert set(stored.tissue) == set(session_maps)
    # stored on the scan's own (LPS) grid: the viewer's RAS+ maps flipped back in x and y
    for name, array in session_maps.items():
        assert np.array_equal(stored.tissue[name], array[::-1, ::-1, :]), name
