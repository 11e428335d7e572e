"""The vault in the app: create/unlock dialogs, browser, import (menu and drop), open, save generated volumes,
export with de-identification, lock and auto-lock, and errors shown as dialogs (real vaults in tmp_path)."""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QLabel, QMessageBox, QPushButton

from engine.vault import KdfParams, Vault
from tests.app.vault.helpers import (
    FAST_KDF,
    PASSPHRASE,
)
from tests.app.vault.helpers import create_via_dialog as _create_via_dialog
from tests.app.vault.helpers import generated_entry as _generated_entry
from tests.app.vault.helpers import import_items as _import
from tests.app.vault.helpers import open_item as _open
from tests.app.vault.helpers import point_at_new_vault as _point_at_new_vault
from tests.app.vault.helpers import wait_task as _wait_task

render = pytest.mark.render


def _nifti_with_descrip(tmp_path: Path, source: Path, descrip: bytes) -> Path:
    """A real NIfTI file with identifying free text in its header (as scanners and tools leave them)."""
    img = nib.load(str(source))
    out = nib.Nifti1Image(np.asanyarray(img.dataobj), img.affine, img.header.copy())
    out.header["descrip"] = descrip
    out.header["aux_file"] = b"Doe-Jane-aux"
    path = tmp_path / "doe_jane_t1.nii"
    nib.save(out, str(path))
    return path


# -- Qt-free pieces -------------------------------------------------------------------------------------


def test_table_cells_read_like_a_worklist():
    from app.core.vault_items import item_row, jsonable, label_problems, person_name

    assert person_name("Doe^Jane^Q") == "Doe, Jane Q" and person_name("Anonymous") == "Anonymous"

    class Info:
        id, kind, label, created, source = "ab" * 16, "scan", "T1", "2024-05-02T10:00:00+00:00", "dicom"
        patient, study, provenance = (
            {"name": "Doe^Jane"},
            {"date": "20240131", "modality": "MR", "description": "Brain"},
            None,
        )

    assert item_row(Info) == ("Doe, Jane", "MR \u00b7 Brain", "2024-01-31", "Scan", "T1")
    Info.kind, Info.patient, Info.study = "synthetic", {}, {}
    Info.provenance = {"model": {"id": "brain-t1-demo"}, "seed": 7}
    assert (
        item_row(Info)[:2] == ("\u2014", "brain-t1-demo \u00b7 seed 7") and item_row(Info)[3] == "Synthetic"
    )
    assert jsonable({"a": (1, np.float32(0.5)), "b": math.nan, 3: Path("/x")}) == {
        "a": [1, 0.5],
        "b": None,
        "3": "/x",
    }
    assert label_problems([f"item {'ab' * 16} is corrupted"], [Info]) == [
        f"\u201cT1\u201d: item {'ab' * 16} is corrupted"
    ]


# -- the wiring: what install_vault hands over is all the vault uses ------------------------------------


def test_the_vault_needs_no_main_window(qtbot, app_services, nibabel_data, tmp_path):
    """The controller takes the app's services (``install_vault`` hands them over): a plain host window stands
    in for the main window, and the app hears of everything through the status line, the error dialog and
    the controller's signals."""
    import dataclasses

    from app.vault.controller import VaultController

    statuses, errors, opened, shown = [], [], [], []
    services = dataclasses.replace(
        app_services,
        show_status=lambda text, timeout_ms=0: statuses.append(text),
        show_error=lambda title, message: errors.append((title, message)),
    )
    state, parent = services.state, services.parent
    controller = VaultController(services)
    controller.volume_opened.connect(opened.append)
    controller.show_browser_requested.connect(lambda: shown.append(True))
    controller.session.kdf = FAST_KDF
    controller.locking.set_vault_path(tmp_path / "vault")

    dialog = controller.locking.request_unlock()
    assert shown == [True] and dialog.mode == "create" and dialog.parent() is parent
    dialog.reject()
    controller.locking.create(PASSPHRASE)
    assert _wait_task(qtbot, controller, "create") == "finished"
    assert controller.session.is_unlocked and statuses[-1] == f"Vault unlocked: {controller.session.path}"

    controller.importing.import_nifti([nibabel_data / "anatomical.nii"], label="a scan")
    assert _wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: len(controller.listing.items) == 1, timeout=10_000)
    controller.opening.open_item(controller.listing.items[0].id)
    qtbot.waitUntil(lambda: len(opened) == 1, timeout=20_000)
    assert state.volumes == [opened[0]] and state.shown is opened[0] and opened[0].name == "a scan"

    controller.locking.lock()
    assert not controller.session.is_unlocked and state.volumes == [] and statuses[-1] == "Vault locked"
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    assert errors == []


# -- the window -----------------------------------------------------------------------------------------


@render
def test_create_import_list_and_open_keeps_the_data(qtbot, vault_window, nibabel_data, error_dialogs):
    from engine.nifti.io import load_nifti

    window = vault_window
    controller = window.vault_controller
    assert not controller.session.is_unlocked and "Vault" in [
        a.text().replace("&", "") for a in window.menuBar().actions()
    ]

    # the create dialog refuses a mismatched confirmation before anything is written
    dialog = controller.locking.request_unlock()
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.confirm_edit.setText(PASSPHRASE + "x")
    dialog.ok_button.click()
    assert dialog.isVisible() and "differ" in dialog.error_label.text()
    assert not Vault.exists(controller.session.path)
    dialog.reject()

    _create_via_dialog(qtbot, window)
    browser = controller.browser
    assert Vault.exists(controller.session.path) and window.docks["vaultDock"].isVisible()
    assert browser.pages.currentWidget() is browser.unlocked_page
    qtbot.waitUntil(lambda: browser.table_stack.currentWidget() is browser.empty_label)

    source = nibabel_data / "anatomical.nii"
    _import(
        qtbot,
        controller,
        [source],
        rows=1,
        patient={"name": "Doe^Jane", "id": "P-001"},
        study={"description": "MR brain", "date": "20240131"},
    )
    assert browser.row_texts() == [("Doe, Jane", "MR brain", "2024-01-31", "Scan", "anatomical")]
    info = controller.listing.items[0]
    assert info.kind == "scan" and info.label == "anatomical"

    browser.select_item(info.id)
    assert browser.open_button.isEnabled()
    # Enter on the selected row opens it, as a double-click does (a worklist read with the keyboard).
    with qtbot.waitSignal(window.volume_opened, timeout=20_000) as blocker:
        qtbot.keyClick(browser.table, Qt.Key.Key_Return)
    entry = blocker.args[0]
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    from_disk = load_nifti(source)  # what File > Open shows for the same file
    assert window.state.shown is entry and entry.name == "anatomical" and not entry.synthetic
    assert entry.data.dtype == np.float32 and np.array_equal(entry.data, from_disk.data)
    assert np.allclose(entry.affine, from_disk.affine)
    assert entry.path is None  # decrypted into memory only
    assert controller.opening.entry_is_from_vault(entry) and not controller.saving.can_save(entry)
    assert window.session_panel.list.count() == 1
    assert not error_dialogs

    window.close()  # closing the window locks the vault
    assert not controller.session.vault.is_unlocked and not controller.session.is_unlocked


@render
def test_drop_on_the_browser_imports_and_drop_on_the_window_still_opens(
    qtbot, vault_window, nibabel_data, tmp_path
):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    source = tmp_path / "scan one.nii"
    shutil.copy(nibabel_data / "anatomical.nii", source)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(source))])
    event = QDropEvent(
        QPointF(40, 40),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    controller.browser.dropEvent(event)
    dialog = controller.importing.import_dialog
    assert dialog is not None and dialog.label_edit.text() == "scan one"
    dialog.patient_name_edit.setText("Roe, Richard")
    dialog.study_edit.setText("Follow-up")
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    assert controller.browser.row_texts()[0][0:2] == ("Roe, Richard", "Follow-up")
    assert controller.listing.items[0].patient == {"name": "Roe^Richard"}
    assert not window.state.volumes  # imported, not opened

    with qtbot.waitSignal(window.volume_opened, timeout=20_000):  # the viewer keeps opening dropped files
        window.dropEvent(
            QDropEvent(
                QPointF(300, 300),
                Qt.DropAction.CopyAction,
                mime,
                Qt.MouseButton.LeftButton,
                Qt.KeyboardModifier.NoModifier,
            )
        )
    assert window.state.shown.path == source


@render
def test_save_generated_volume_to_vault_and_open_it_again(qtbot, vault_window):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    window.state.select_model(window.state.model_by_id("tiny-latent"))
    window.sampling_panel.steps_spin.setValue(3)
    window.sampling_panel.seed_spin.setValue(1234)
    assert not controller.menu.save_action.isEnabled()
    with qtbot.waitSignal(window.generation.ended, timeout=120_000) as ended:
        window.sampling_panel.generate_button.click()
    assert ended.args[0] == "finished"
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=10_000)
    generated = window.state.shown
    assert generated.kind == "generated" and controller.menu.save_action.isEnabled()
    assert controller.menu.session_menu(generated).actions()[0].isEnabled()  # the session list's context menu

    controller.menu.save_action.trigger()
    assert _wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    info = controller.listing.items[0]
    assert info.kind == "synthetic" and info.label == generated.name
    assert info.provenance["seed"] == 1234 and info.provenance["synthetic"] is True
    patient, study, _date, kind, label = controller.browser.row_texts()[0]
    assert (patient, kind, label) == ("\u2014", "Synthetic", generated.name) and "seed 1234" in study

    reopened = _open(qtbot, window, info.id)
    assert reopened.synthetic and reopened.provenance["seed"] == 1234
    assert np.array_equal(reopened.data, generated.data) and np.allclose(reopened.affine, generated.affine)
    # A model without tissue maps: none stored, none opened, the overlay's controls off as before.
    assert info.tissue_maps == () and "Tissue maps" not in controller.browser.table.item(0, 0).toolTip()
    assert reopened.tissue == {} and reopened.space is None and window.state.shown is reopened
    assert not window.tissue_toolbar.tissue_action.isEnabled()
    assert "tissue maps" not in window.statusBar().currentMessage()


@pytest.fixture
def tissue_vault_window(tissue_window, tmp_path):
    """conftest's ``tissue_window`` (the tiny 5-channel MNI model selected) with its vault pointed at an
    empty folder in tmp_path."""
    yield _point_at_new_vault(tissue_window, tmp_path / "vault")
    assert not tissue_window.vault_controller.tasks.running


@pytest.mark.slow
@render
def test_generated_tissue_maps_go_to_the_vault_and_come_back_with_the_overlay(qtbot, tissue_vault_window):
    from app.core.tissue import ALL_TISSUES

    names, mni = ["GM", "WM", "CSF", "ventricles"], "MNI152NLin2009aSym"
    window, bar = tissue_vault_window, tissue_vault_window.tissue_toolbar
    controller = _create_via_dialog(qtbot, window)
    window.activateWindow()  # back from the passphrase dialog: keyboard shortcuts reach the main window
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    window.sampling_panel.steps_spin.setValue(3)
    with qtbot.waitSignal(window.generation.ended, timeout=120_000) as ended:
        qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)  # Ctrl+G
    assert ended.args[0] == "finished"
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=10_000)
    generated = window.state.shown
    assert generated.tissue_names == names and generated.space == mni

    controller.menu.save_action.trigger()
    assert _wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    (info,) = controller.listing.items
    assert info.kind == "synthetic" and list(info.tissue_maps) == names and generated.saved
    assert info.provenance["space"] == mni
    tooltip = controller.browser.table.item(0, 0).toolTip()  # the browser says the item has maps
    assert "Tissue maps: GM, WM, CSF, ventricles" in tooltip and f"Space: {mni}" in tooltip

    window.state.remove_volume(generated)  # only the vault has it now
    assert window.state.volumes == [] and not bar.tissue_action.isEnabled()
    controller.browser.select_item(info.id)
    with qtbot.waitSignal(window.volume_opened, timeout=20_000) as opened:
        controller.browser.open_button.click()
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    reopened = opened.args[0]
    assert window.state.shown is reopened and reopened.kind == "opened" and reopened.synthetic
    assert "with tissue maps GM, WM, CSF, ventricles" in window.statusBar().currentMessage()
    assert np.array_equal(reopened.data, generated.data) and np.allclose(reopened.affine, generated.affine)
    assert reopened.tissue_names == names and reopened.space == mni
    for name in names:
        assert reopened.tissue[name].dtype == np.float32
        assert np.array_equal(reopened.tissue[name], generated.tissue[name]), name
    assert window.space_label.text() == f"Space: {mni}"

    # The overlay's controls are on for it, and Ctrl+T paints the maps over the slices.
    assert bar.tissue_action.isEnabled() and bar.tissue_box.isEnabled() and bar.opacity_slider.isEnabled()
    assert [bar.tissue_box.itemData(i) for i in range(bar.tissue_box.count())] == [ALL_TISSUES, *names]
    before = window.viewer.axial.grab().toImage()
    qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)  # Ctrl+T
    assert window.state.tissue_shown() == ALL_TISSUES
    assert window.viewer.axial.grab().toImage() != before
    # Opened from the vault, it is never written to the crash-recovery folder in plaintext.
    assert reopened.uid not in window.recovery.store.kept()


@render
def test_export_deidentified_clears_the_header(qtbot, vault_window, nibabel_data, tmp_path, error_dialogs):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    source = _nifti_with_descrip(tmp_path, nibabel_data / "anatomical.nii", b"Jane Doe 1970-01-01 MRN 12345")
    _import(qtbot, controller, [source], rows=1, patient={"name": "Doe^Jane"})
    info = controller.listing.items[0]

    dialog = controller.exporting.export_dialog_for(info.id)
    assert dialog.deidentify_box.isChecked()  # on unless the user turns it off
    out = tmp_path / "export"
    dialog.folder_edit.setText(str(out))
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "export") == "finished"
    result = controller.exporting.last_export
    assert result.deidentified and len(result.files) == 1
    exported = result.files[0]
    assert exported.is_file() and exported.parent == out
    assert exported.name.endswith(".nii.gz")  # a de-identified copy leaves compressed
    assert "doe" not in exported.name.lower() and "jane" not in exported.name.lower()
    header = nib.load(str(exported)).header
    assert header["descrip"].item() == b"" and header["aux_file"].item() == b""
    assert np.array_equal(
        np.asanyarray(nib.load(str(exported)).dataobj), np.asanyarray(nib.load(str(source)).dataobj)
    )

    # a second export to the same place is refused with the engine's message, and the app goes on
    controller.exporting.export_item(info.id, out, deidentify=True)
    assert _wait_task(qtbot, controller, "export") == "failed"
    assert error_dialogs[-1][0] == "Cannot export from the vault" and "already exists" in error_dialogs[-1][1]
    controller.exporting.export_item(info.id, out, deidentify=False, overwrite=True)
    assert _wait_task(qtbot, controller, "export") == "finished"
    plain = controller.exporting.last_export.files[0]  # the imported bytes as they were: .nii
    assert plain.name == exported.name.removesuffix(".gz")
    assert plain.read_bytes() == source.read_bytes()
    assert b"Jane Doe" in nib.load(str(plain)).header["descrip"].item()


@render
def test_deidentified_dicom_export_is_nii_gz_and_its_message_counts_the_files(
    qtbot, vault_window, tmp_path, screenshot
):
    from pydicom.data import get_testdata_file

    from app.core.vault_items import ImportJob

    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    source = Path(get_testdata_file("MR_small.dcm"))
    controller.importing.import_sources([ImportJob(source, "dicom", label="T2 axial")])
    assert _wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    info = controller.listing.items[0]

    controller.browser.select_item(info.id)
    controller.browser.export_button.click()
    dialog = controller.exporting.export_dialog
    assert dialog.deidentify_box.isChecked()
    out = tmp_path / "shared"
    dialog.folder_edit.setText(str(out))
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "export") == "finished"
    nii, dicom = controller.exporting.last_export.files
    assert nii.name.endswith(".nii.gz") and nii.read_bytes()[:2] == b"\x1f\x8b"  # really gzip
    assert nib.load(str(nii)).header["descrip"].item() == b""
    assert dicom.suffix == ".dcm"
    title, text = controller.messages.last_info
    summary = f"Wrote 1 NIfTI and 1 DICOM files to {out} (de-identified)"
    assert title == "Exported from the Vault" and text == summary  # no list of paths in the message
    assert window.statusBar().currentMessage() == summary
    box = controller.messages.last_info_box
    assert box.detailedText().splitlines() == [str(nii), str(dicom)]  # behind "Show Details..."
    qtbot.waitExposed(box)
    details_button = next(b for b in box.buttons() if box.buttonRole(b) == QMessageBox.ButtonRole.ActionRole)
    qtbot.mouseClick(details_button, Qt.MouseButton.LeftButton)  # "Show Details..." lists the paths
    screenshot(box, "14-vault-export-message")
    box.accept()


def _sort_arrow(header, column: int) -> str:
    """Which way the sort arrow drawn in a header section points ("up" or "down"), read from its pixels.

    The arrow is the right-most mark in the section, apart from the label; a down arrow (\u25bc) is widest in
    its top row, an up arrow (\u25b2) in its bottom row.
    """
    image = header.grab().toImage()
    left = header.sectionViewportPosition(column)
    right = left + header.sectionSize(column)
    background = image.pixelColor(left + 1, 1).lightness()
    marked = {
        (x, y)
        for x in range(left, right)
        for y in range(image.height())
        if abs(image.pixelColor(x, y).lightness() - background) > 40
    }
    columns = sorted({x for x, _ in marked})
    arrow = [columns[-1]]
    for x in reversed(columns[:-1]):  # walk left from the right-most mark until a gap
        if arrow[-1] - x > 2:
            break
        arrow.append(x)
    rows: dict[int, int] = {}
    for x, y in marked:
        if x in arrow:
            rows[y] = rows.get(y, 0) + 1
    top, bottom = rows[min(rows)], rows[max(rows)]
    assert top != bottom, rows
    return "down" if top > bottom else "up"


@render
def test_date_column_sort_arrow_matches_the_order_and_a_click_flips_both(
    qtbot, vault_window, tmp_path, screenshot
):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    rng = np.random.default_rng(0)
    for n, date in enumerate(("20220301", "20240131")):
        path = tmp_path / f"scan{n}.nii.gz"
        nib.save(nib.Nifti1Image(rng.random((8, 8, 8), dtype=np.float32), np.eye(4)), str(path))
        _import(qtbot, controller, [path], rows=n + 1, study={"date": date})
    table = controller.browser.table
    header = table.horizontalHeader()
    window.docks["vaultDock"].show()
    window.docks["vaultDock"].raise_()
    qtbot.waitExposed(table)

    def dates() -> list[str]:
        return [table.item(row, 2).text() for row in range(table.rowCount())]

    newest_first = dates()
    assert newest_first == sorted(newest_first, reverse=True) and newest_first[0] != newest_first[1]
    assert header.sortIndicatorSection() == 2 and header.sortIndicatorOrder() == Qt.SortOrder.DescendingOrder
    assert _sort_arrow(header, 2) == "down"  # it was drawn pointing up (ascending) over newest-first rows
    screenshot(window, "14-vault-date-sort-newest-first")

    date_x = header.sectionViewportPosition(2) + header.sectionSize(2) // 2
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(date_x, header.height() // 2))
    assert dates() == newest_first[::-1]  # oldest first now
    assert header.sortIndicatorOrder() == Qt.SortOrder.AscendingOrder and _sort_arrow(header, 2) == "up"
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(date_x, header.height() // 2))
    assert dates() == newest_first
    assert header.sortIndicatorOrder() == Qt.SortOrder.DescendingOrder and _sort_arrow(header, 2) == "down"


@render
def test_wrong_passphrase_shows_an_error_and_stays_locked(qtbot, vault_window, nibabel_data, error_dialogs):
    window = vault_window
    controller = window.vault_controller
    with Vault.create(controller.session.path, PASSPHRASE, kdf=FAST_KDF) as vault:
        vault.import_nifti(nibabel_data / "anatomical.nii", label="existing scan")

    dialog = controller.locking.request_unlock()
    assert dialog.mode == "unlock" and controller.browser.unlock_button.text() == "Unlock..."
    dialog.passphrase_edit.setText("not the passphrase")
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "unlock") == "failed"
    assert error_dialogs == []  # said once, inline (issue 24): no pop-up on top of the dialog
    assert (
        not controller.session.is_unlocked
        and controller.browser.pages.currentWidget() is controller.browser.locked_page
    )
    assert (
        dialog.isVisible()
        and dialog.passphrase_edit.text() == ""
        and "Wrong passphrase" in dialog.error_label.text()
    )
    assert dialog.ok_button.isEnabled()

    dialog.passphrase_edit.setText(PASSPHRASE)  # a second try works
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "unlock") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    assert not dialog.isVisible() and controller.browser.row_texts()[0][4] == "existing scan"

    # delete asks first; Cancel keeps the item, Delete removes it
    browser = controller.browser
    browser.select_item(controller.listing.items[0].id)
    browser.delete_button.click()
    controller.item_actions.confirm_box.button(
        controller.item_actions.confirm_box.StandardButton.Cancel
    ).click()
    assert (
        controller.item_actions.confirm_box is None
        and not controller.tasks.running
        and len(controller.listing.items) == 1
    )
    browser.delete_button.click()
    controller.item_actions.confirm_delete_button.click()
    assert _wait_task(qtbot, controller, "delete") == "finished"
    qtbot.waitUntil(lambda: browser.table.rowCount() == 0, timeout=10_000)
    assert not list((controller.session.path / "blobs").glob("*.vsb"))


@render
def test_after_a_wrong_passphrase_the_right_one_and_enter_unlock(
    qtbot, vault_window, nibabel_data, error_dialogs
):
    """Issue 24, point 11: typed keys only. Before, Enter reached Cancel while the dialog was busy (the
    passphrase field was disabled, so the focus went to Cancel, an auto-default button) and a wrong
    passphrase was reported twice (a pop-up, then the inline line)."""
    controller = vault_window.vault_controller
    slow_enough = KdfParams(memory_kib=64 * 1024, iterations=3, lanes=4)  # RFC 9106's: the dialog stays busy
    with Vault.create(controller.session.path, PASSPHRASE, kdf=slow_enough) as vault:
        vault.import_nifti(nibabel_data / "anatomical.nii", label="existing scan")
    dialog = controller.locking.request_unlock()
    dialog.activateWindow()  # focus moves as it does for a user (it decides where Enter goes)
    qtbot.waitUntil(dialog.isActiveWindow, timeout=10_000)
    qtbot.keyClicks(dialog.passphrase_edit, "not the passphrase")
    qtbot.keyClick(dialog.passphrase_edit, Qt.Key.Key_Return)
    assert dialog.busy
    qtbot.keyClick(dialog.focusWidget() or dialog, Qt.Key.Key_Return)  # impatient: Enter again while busy
    assert _wait_task(qtbot, controller, "unlock") == "failed"
    assert dialog.isVisible(), "Enter cancelled the unlock dialog"
    assert "Wrong passphrase" in dialog.error_label.text() and error_dialogs == []  # said once, inline
    assert dialog.focusWidget() is dialog.passphrase_edit
    qtbot.keyClicks(dialog.passphrase_edit, PASSPHRASE)
    qtbot.keyClick(dialog.passphrase_edit, Qt.Key.Key_Return)
    assert _wait_task(qtbot, controller, "unlock") == "finished"
    qtbot.waitUntil(lambda: controller.session.is_unlocked and not dialog.isVisible(), timeout=10_000)


@render
def test_enter_in_the_export_folder_field_exports(qtbot, vault_window, nibabel_data, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    controller = vault_window.vault_controller
    with Vault.create(controller.session.path, PASSPHRASE, kdf=FAST_KDF) as vault:
        item = vault.import_nifti(nibabel_data / "anatomical.nii", label="existing scan").id
    controller.locking.unlock(PASSPHRASE)
    assert _wait_task(qtbot, controller, "unlock") == "finished"
    browsed = []
    monkeypatch.setattr(
        QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: browsed.append(a) or "")
    )
    qtbot.waitUntil(lambda: controller.listing.item(item) is not None, timeout=10_000)
    dialog = controller.exporting.export_dialog_for(item)
    out = tmp_path / "exported"
    dialog.folder_edit.clear()
    qtbot.keyClicks(dialog.folder_edit, str(out))
    qtbot.keyClick(dialog.folder_edit, Qt.Key.Key_Return)
    assert _wait_task(qtbot, controller, "export") == "finished"
    assert browsed == [] and not dialog.isVisible()
    assert list(out.glob("scan-*.nii*"))


@render
def test_change_passphrase_rewraps_the_key(qtbot, vault_window, error_dialogs):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    dialog = controller.passphrase.change_passphrase_dialog()
    dialog.old_edit.setText("not the passphrase")
    dialog.new_edit.setText("a brand new passphrase")
    dialog.confirm_edit.setText("a brand new passphrase")
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "passphrase") == "failed"
    assert error_dialogs[-1][0] == "Cannot change the passphrase" and "wrong" in error_dialogs[-1][1]
    assert dialog.isVisible() and "wrong" in dialog.error_label.text()
    dialog.old_edit.setText(PASSPHRASE)
    dialog.new_edit.setText("a brand new passphrase")
    dialog.confirm_edit.setText("a brand new passphrase")
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "passphrase") == "finished"
    assert not dialog.isVisible() and controller.session.vault.kdf_params == FAST_KDF

    controller.locking.lock()
    controller.locking.unlock(PASSPHRASE)
    assert _wait_task(qtbot, controller, "unlock") == "failed" and not controller.session.is_unlocked
    controller.locking.unlock("a brand new passphrase")
    assert _wait_task(qtbot, controller, "unlock") == "finished" and controller.session.is_unlocked


@render
def test_change_passphrase_with_re_encryption_puts_the_vault_under_a_new_key(qtbot, vault_window):
    controller = _create_via_dialog(qtbot, vault_window)
    old_id = controller.session.vault.vault_id
    dialog = controller.passphrase.change_passphrase_dialog()
    assert "old passphrase still opens old copies" in dialog.findChild(QLabel, "dialogText").text()
    qtbot.keyClicks(dialog.old_edit, PASSPHRASE)
    qtbot.keyClicks(dialog.new_edit, "a brand new passphrase")
    qtbot.keyClicks(dialog.confirm_edit, "a brand new passphrase")
    qtbot.mouseClick(dialog.rekey_box, Qt.MouseButton.LeftButton)
    assert dialog.rekey_box.isChecked()
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "passphrase") == "finished"
    assert (
        controller.session.is_unlocked and controller.session.vault.vault_id != old_id
    )  # a new key, a new vault id
    # A box that stays until read says what was re-encrypted, and what it does not reach (old copies).
    title, text = controller.messages.last_info
    assert title == "Vault Re-encrypted" and text.startswith(f"{len(controller.listing.items)} items and ")
    assert "audit entr" in text and "still open with the old passphrase" in text
    from shiboken6 import isValid

    box = controller.messages.last_info_box
    assert box.isVisible()
    qtbot.keyClick(box, Qt.Key.Key_Return)  # read: Enter closes it (and Qt deletes it)
    qtbot.waitUntil(lambda: not isValid(box) or not box.isVisible(), timeout=5_000)
    controller.locking.lock()
    controller.locking.unlock(PASSPHRASE)
    assert _wait_task(qtbot, controller, "unlock") == "failed" and not controller.session.is_unlocked
    controller.locking.unlock("a brand new passphrase")
    assert _wait_task(qtbot, controller, "unlock") == "finished" and controller.session.is_unlocked


@render
def test_lock_button_and_auto_lock_clear_the_browser(qtbot, vault_window, nibabel_data):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    browser = controller.browser
    _import(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1)
    _open(qtbot, window, controller.listing.items[0].id)
    assert len(window.state.volumes) == 1

    browser.lock_button.click()
    assert not controller.session.is_unlocked and not controller.session.vault.is_unlocked
    assert browser.table.rowCount() == 0 and browser.pages.currentWidget() is browser.locked_page
    assert not window.state.volumes  # the decrypted volume left the session with the keys
    assert controller.status_button.text() == "Vault locked"

    controller.locking.unlock(PASSPHRASE)
    assert _wait_task(qtbot, controller, "unlock") == "finished"
    qtbot.waitUntil(lambda: browser.table.rowCount() == 1, timeout=10_000)
    assert controller.session.auto_lock_minutes == 15 and controller.session.vault.idle_timeout_s == 15 * 60

    # user activity postpones auto-lock; 15 idle minutes lock it (a fake clock stands in for waiting)
    start = time.monotonic()
    controller.session.clock = lambda: start + 14 * 60
    assert not controller.locking.check_idle()
    qtbot.keyClick(window, Qt.Key.Key_Shift)
    assert controller.session.vault.seconds_until_auto_lock() == pytest.approx(15 * 60, abs=1)
    controller.session.clock = lambda: start + 14 * 60 + 15 * 60 + 1
    assert controller.locking.check_idle()
    assert not controller.session.is_unlocked and browser.table.rowCount() == 0
    assert browser.pages.currentWidget() is browser.locked_page
    assert "15 min" in window.statusBar().currentMessage()

    controller.locking.set_auto_lock_minutes(1)  # the setting persists and applies to the open vault
    assert (
        window.settings.value("vault/auto_lock_minutes", type=int) == 1
        and controller.session.vault.idle_timeout_s == 60
    )


@render
def test_cancel_a_long_import_leaves_nothing_behind(qtbot, vault_window, nibabel_data, monkeypatch):
    import threading

    from app.core import vault_items as model

    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    started, release = threading.Event(), threading.Event()
    probe = model.synthetic_marks

    def slow_probe(path):  # holds the import in the worker until the test has pressed Cancel
        if threading.current_thread() is not threading.main_thread():
            started.set()
            release.wait(10)
        return probe(path)

    monkeypatch.setattr(model, "synthetic_marks", slow_probe)
    controller.importing.import_nifti([nibabel_data / "anatomical.nii", nibabel_data / "example4d.nii.gz"])
    progress = controller.tasks.running[-1].progress
    assert progress is not None and started.wait(10)
    qtbot.waitUntil(progress.isVisible, timeout=10_000)  # shown once the import has taken a moment
    cancel = progress.findChild(QPushButton)  # the progress dialog's Cancel, pressed from the keyboard
    cancel.setFocus()
    qtbot.keyClick(cancel, Qt.Key.Key_Space)
    assert progress.labelText() == "Cancelling..."
    release.set()
    assert _wait_task(qtbot, controller, "import") == "finished"
    assert "Import cancelled: 0 of 2 imported" in window.statusBar().currentMessage()
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    assert controller.listing.items == [] and not list((controller.session.path / "blobs").glob("*.vsb"))
    assert controller.session.is_unlocked  # and the vault goes on working
    _import(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1)


@render
def test_tampered_item_shows_a_clear_error_naming_it(qtbot, vault_window, nibabel_data, error_dialogs):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    _import(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1, label="knee MRI")
    info = controller.listing.items[0]
    (blob,) = (controller.session.path / "blobs").glob("*.vsb")
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    blob.write_bytes(bytes(raw))

    controller.opening.open_item(info.id)
    assert _wait_task(qtbot, controller, "open") == "failed"
    title, message = error_dialogs[-1]
    assert title == "Cannot open \u201cknee MRI\u201d from the vault"
    assert info.id in message and "corrupted" in message and "Traceback" not in message
    assert not window.state.volumes

    controller.integrity.verify_all()
    assert _wait_task(qtbot, controller, "verify") == "finished"
    title, message = error_dialogs[-1]
    assert title == "The vault failed verification" and "\u201cknee MRI\u201d" in message
    assert not controller.integrity.last_verify.ok
    assert controller.session.is_unlocked  # the app goes on
    controller.listing.refresh()
    assert _wait_task(qtbot, controller, "list") == "finished"


@pytest.mark.slow
@render
def test_screenshot_vault_browser(qtbot, window_3d, tmp_path, nibabel_data, mni_t1, screenshot):
    from pydicom.data import get_testdata_file

    from app.core.vault_items import ImportJob

    window = _point_at_new_vault(window_3d, tmp_path / "vault")
    controller = _create_via_dialog(qtbot, window)
    _import(
        qtbot,
        controller,
        [nibabel_data / "anatomical.nii"],
        rows=1,
        label="SPM normalised T1",
        patient={"name": "Roe^Richard", "id": "P-0107"},
        study={"description": "MR brain", "date": "20231105"},
    )
    controller.importing.import_sources(
        [ImportJob(Path(get_testdata_file("MR_small.dcm")), "dicom", label="T2 axial")]
    )
    assert _wait_task(qtbot, controller, "import") == "finished"
    window.state.select_model(window.state.model_by_id("tiny-latent"))
    window.sampling_panel.steps_spin.setValue(3)
    window.sampling_panel.seed_spin.setValue(20240131)
    with qtbot.waitSignal(window.generation.ended, timeout=120_000):
        window.sampling_panel.generate_button.click()
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=10_000)
    generated = window.state.shown
    assert not generated.saved
    controller.saving.save_entry()
    assert _wait_task(qtbot, controller, "save") == "finished"
    assert generated.saved  # in the vault now: crash recovery lets it go at a clean exit
    _import(
        qtbot,
        controller,
        [mni_t1],
        rows=4,
        label="T1 MPRAGE",
        patient={"name": "Doe^Jane", "id": "P-0042"},
        study={"description": "MR brain follow-up", "date": "20240131"},
    )
    mni = next(i for i in controller.listing.items if i.label == "T1 MPRAGE")
    _open(qtbot, window, mni.id)
    controller.browser.select_item(mni.id)
    window.docks["vaultDock"].raise_()
    qtbot.waitUntil(lambda: window.viewer.view3d.render_count > 0, timeout=30_000)
    qtbot.wait(1200)  # one auto-lock tick for the footer, and the 3D render
    path = screenshot(window, "07-vault-browser")
    assert path.is_file() and path.stat().st_size > 10_000


# -- issue 18 (synthetic stays synthetic, PHI hygiene) and issue 13 (vault paths a person uses) ----------


def _generated_file(tmp_path: Path, name: str = "generated.nii.gz", seed: int = 3) -> Path:
    """A volume exactly as VolSynth writes it: SYNTHETIC header fields and a provenance sidecar."""
    from engine.nifti.io import save_volume
    from engine.nifti.volume import Volume

    data = np.random.default_rng(seed).random((8, 9, 7))
    provenance = {"model": {"id": "tiny-latent"}, "seed": seed, "synthetic": True}
    return save_volume(Volume(data, np.eye(4), provenance=provenance, synthetic=True), tmp_path / name)


def _drop(widget, paths) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    widget.dropEvent(
        QDropEvent(
            QPointF(40, 40),
            Qt.DropAction.CopyAction,
            mime,
            Qt.MouseButton.LeftButton,
            Qt.KeyboardModifier.NoModifier,
        )
    )


def _right_click_row(qtbot, browser, item_id: str) -> None:
    """What a right click on a row sends: a context-menu event at that row."""
    from PySide6.QtGui import QContextMenuEvent
    from PySide6.QtWidgets import QApplication

    browser.select_item(item_id)
    row = browser.table.currentRow()
    rect = browser.table.visualItemRect(browser.table.item(row, 0))
    viewport = browser.table.viewport()
    QApplication.sendEvent(
        viewport,
        QContextMenuEvent(QContextMenuEvent.Reason.Mouse, rect.center(), viewport.mapToGlobal(rect.center())),
    )
    qtbot.waitUntil(lambda: browser.table_menu is not None and browser.table_menu.isVisible(), timeout=5_000)


def _menu_action(menu, text: str):
    return next(a for a in menu.actions() if a.text().replace("&", "") == text)


@render
def test_dropped_synthetic_file_is_stored_as_synthetic_never_as_a_scan(
    qtbot, vault_window, nibabel_data, tmp_path, error_dialogs
):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    generated = _generated_file(tmp_path)

    _drop(controller.browser, [generated])
    dialog = controller.importing.import_dialog
    assert dialog.synthetic_label.isVisible() and "SYNTHETIC" in dialog.synthetic_label.text()
    assert not dialog.patient_name_edit.isEnabled() and not dialog.patient_id_edit.isEnabled()
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    info = controller.listing.items[0]
    assert info.kind == "synthetic" and info.patient == {} and info.provenance["seed"] == 3
    assert controller.browser.row_texts()[0][3] == "Synthetic"

    # dropped together with a scan: the patient details go to the scan only
    scan = tmp_path / "scan.nii"
    shutil.copy(nibabel_data / "anatomical.nii", scan)
    second = _generated_file(tmp_path, "second.nii.gz", seed=4)
    _drop(controller.browser, [scan, second])
    dialog = controller.importing.import_dialog
    assert dialog.patient_name_edit.isEnabled() and "second.nii.gz" in dialog.synthetic_label.text()
    dialog.patient_name_edit.setText("Doe, Jane")
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 3, timeout=10_000)
    by_kind = {i.original_name: i for i in controller.listing.items}
    assert by_kind["scan.nii"].kind == "scan" and by_kind["scan.nii"].patient == {"name": "Doe^Jane"}
    assert by_kind["second.nii.gz"].kind == "synthetic" and by_kind["second.nii.gz"].patient == {}

    # asking for it as a patient's scan is refused, with the reason
    third = _generated_file(tmp_path, "third.nii.gz", seed=5)
    controller.importing.import_nifti([third], patient={"name": "Doe^Jane"})
    assert _wait_task(qtbot, controller, "import") == "finished"
    title, message = error_dialogs[-1]
    assert title == "Cannot import into the vault"
    assert "third.nii.gz is a synthetic volume generated by VolSynth" in message and "patient scan" in message
    assert len(controller.listing.items) == 3


@render
def test_import_menu_validates_dates_and_remembers_the_folder(
    qtbot, vault_window, nibabel_data, tmp_path, monkeypatch
):
    from PySide6.QtWidgets import QFileDialog

    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    folder = tmp_path / "incoming"
    folder.mkdir()
    source = folder / "t1.nii"
    shutil.copy(nibabel_data / "anatomical.nii", source)
    starts = []

    def choose(parent, caption, start, filters):
        starts.append(start)
        return [str(source)], filters

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(choose))
    controller.menu.import_nifti_action.trigger()
    dialog = controller.importing.import_dialog
    assert dialog is not None and starts == [str(Path.home())]
    qtbot.keyClicks(dialog.study_date_edit, "2024-13-45")
    qtbot.keyClicks(dialog.birth_date_edit, "1970-01-31")
    dialog.ok_button.click()
    assert dialog.isVisible() and "Study date" in dialog.error_label.text() and not controller.tasks.running
    dialog.study_date_edit.clear()
    qtbot.keyClicks(dialog.study_date_edit, "2024-01-31")
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    info = controller.listing.items[0]
    assert info.study["date"] == "20240131" and info.patient["birth_date"] == "19700131"
    assert controller.browser.row_texts()[0][2] == "2024-01-31"

    # the next import starts where the last one was (and the same file again asks first)
    controller.menu.import_nifti_action.trigger()
    assert starts[-1] == str(folder)
    controller.importing.import_dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "import") == "finished"
    box = controller.messages.duplicate_box
    assert box is not None and "already in the vault" in box.text()
    box.button(QMessageBox.StandardButton.Cancel).click()
    assert controller.messages.duplicate_box is None and all(
        t.name == "list" for t in controller.tasks.running
    )
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    assert len(controller.listing.items) == 1


@render
def test_a_renamed_vault_item_is_renamed_in_the_session_list(qtbot, vault_window, nibabel_data):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    _import(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1, patient={"name": "Doe^Jane"})
    info = controller.listing.items[0]
    entry = _open(qtbot, window, info.id)
    session = window.session_panel.list
    assert session.item(0).text() == info.label
    browser = controller.browser
    browser.select_item(info.id)
    browser.details_button.click()
    dialog = controller.item_actions.details_dialog
    dialog.label_edit.clear()
    qtbot.keyClicks(dialog.label_edit, "T1 follow-up")
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "edit") == "finished"
    qtbot.waitUntil(lambda: session.item(0).text() == "T1 follow-up", timeout=10_000)
    assert entry.name == "T1 follow-up" and "T1 follow-up" in window.windowTitle()


@render
def test_details_are_edited_from_the_context_menu_and_the_details_button(qtbot, vault_window, nibabel_data):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    _import(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1, patient={"name": "Doe^Jane"})
    browser = controller.browser
    info = controller.listing.items[0]

    _right_click_row(qtbot, browser, info.id)
    _menu_action(browser.table_menu, "Edit Details...").trigger()
    browser.table_menu.close()
    dialog = controller.item_actions.details_dialog
    assert dialog is not None and dialog.label_edit.text() == "anatomical"
    assert dialog.patient_name_edit.text() == "Doe, Jane"
    dialog.label_edit.clear()
    qtbot.keyClicks(dialog.label_edit, "T1 baseline")
    qtbot.keyClicks(dialog.study_date_edit, "31/01/2024")
    dialog.ok_button.click()
    assert dialog.isVisible() and "YYYY-MM-DD" in dialog.error_label.text()
    dialog.study_date_edit.clear()
    qtbot.keyClicks(dialog.study_date_edit, "2024-01-31")
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "edit") == "finished"
    qtbot.waitUntil(
        lambda: browser.row_texts() and browser.row_texts()[0][4] == "T1 baseline", timeout=10_000
    )
    assert browser.row_texts()[0][:3] == ("Doe, Jane", "\u2014", "2024-01-31")

    browser.select_item(info.id)
    browser.details_button.click()
    dialog = controller.item_actions.details_dialog
    dialog.patient_id_edit.setText("P-0042")
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "edit") == "finished"
    qtbot.waitUntil(
        lambda: controller.listing.items and controller.listing.items[0].patient.get("id") == "P-0042",
        timeout=10_000,
    )
    assert (
        controller.listing.items[0].patient["name"] == "Doe^Jane"
        and controller.listing.items[0].label == "T1 baseline"
    )


@render
def test_saving_the_same_volume_twice_asks(qtbot, vault_window):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    _generated_entry(window)
    controller.menu.save_action.trigger()
    assert _wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)

    controller.menu.save_action.trigger()  # the same volume again: asked, nothing stored yet
    box = controller.messages.duplicate_box
    assert box is not None and "already in the vault" in box.text()
    assert all(t.name == "list" for t in controller.tasks.running)
    box.button(QMessageBox.StandardButton.Cancel).click()
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    assert len(controller.listing.items) == 1

    controller.menu.save_action.trigger()
    controller.messages.duplicate_yes_button.click()
    assert _wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 2, timeout=10_000)


@render
def test_one_generated_volume_saved_to_two_files_is_imported_once_unless_asked(qtbot, vault_window, tmp_path):
    """File bytes differ (names, gzip headers); the voxels, affine and provenance do not: asked first."""
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    entry = _generated_entry(window, seed=5)
    first, second = tmp_path / "a.nii.gz", tmp_path / "b-copy.nii"  # the dialog offers both
    for path in (first, second):
        window.save_entry(entry, path)
        qtbot.waitUntil(path.is_file, timeout=20_000)
    qtbot.waitUntil(lambda: not window.runner.running("save"), timeout=20_000)
    assert first.read_bytes() != second.read_bytes()
    _drop(controller.browser, [first])
    controller.importing.import_dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    _drop(controller.browser, [second])
    controller.importing.import_dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.messages.duplicate_box is not None, timeout=10_000)
    assert "already in the vault" in controller.messages.duplicate_box.text()
    controller.messages.duplicate_box.button(QMessageBox.StandardButton.Cancel).click()
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    assert len(controller.listing.items) == 1


@render
def test_export_names_the_file_and_a_synthetic_volume_leaves_as_marked_nii_gz(qtbot, vault_window, tmp_path):
    from engine.nifti.io import load_nifti

    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    entry = _generated_entry(window, seed=21)
    controller.menu.save_action.trigger()
    assert _wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    info = controller.listing.items[0]

    browser = controller.browser
    browser.select_item(info.id)
    browser.export_button.click()
    dialog = controller.exporting.export_dialog
    out = tmp_path / "shared"
    dialog.folder_edit.setText(str(out))
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "export") == "finished"
    nii = controller.exporting.last_export.files[0]
    assert nii.name.endswith(".nii.gz") and nii.parent == out
    title, text = controller.messages.last_info
    assert (
        title == "Exported from the Vault"
        and text == f"Wrote 1 NIfTI and 1 JSON files to {out} (de-identified)"
    )
    assert window.statusBar().currentMessage() == text
    assert str(nii) in controller.messages.last_info_box.detailedText()
    header = nib.load(str(nii)).header
    assert b"SYNTHETIC" in header["descrip"].item() and header["intent_name"].item() == b"SYNTHETIC"
    assert header["aux_file"].item() == b"volsynth-synthetic"
    reopened = load_nifti(nii)  # what File > Open shows: synthetic, with its provenance
    assert reopened.synthetic and reopened.provenance["seed"] == 21
    assert np.array_equal(reopened.data, entry.data)

    browser.export_button.click()  # the export dialog starts in the folder used last
    assert controller.exporting.export_dialog.folder_edit.text() == str(out)
    controller.exporting.export_dialog.reject()


@render
def test_recent_files_never_hold_vault_items_and_can_be_switched_off(
    qtbot, vault_window, nibabel_data, tmp_path
):
    window = vault_window
    controller = _create_via_dialog(qtbot, window)
    _import(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1)
    _open(qtbot, window, controller.listing.items[0].id)
    assert window.state.recent.paths() == []  # an item decrypted from the vault has no path to remember

    (tmp_path / "patients").mkdir()
    source = tmp_path / "patients" / "Doe_Jane_t1.nii"
    shutil.copy(nibabel_data / "anatomical.nii", source)
    with qtbot.waitSignal(window.volume_opened, timeout=20_000):
        window.open_path(source)
    assert window.state.recent.paths() == [str(source.resolve())]
    assert controller.remember_action.isChecked()

    controller.remember_action.trigger()  # Vault > Remember Recent Files and Folders: off
    assert not controller.remember_action.isChecked() and window.state.recent.paths() == []
    window.settings.sync()
    text = Path(window.settings.fileName()).read_text()
    assert "Doe_Jane" not in text and "patients" not in text, text
    with qtbot.waitSignal(window.volume_opened, timeout=20_000):
        window.open_path(source)
    assert window.state.recent.paths() == []
    window.settings.sync()
    text = Path(window.settings.fileName()).read_text()
    assert "Doe_Jane" not in text and "patients" not in text, text  # nothing noted while it is off
    window.close()
    window.settings.sync()
    text = Path(window.settings.fileName()).read_text()
    assert "Doe_Jane" not in text and "patients" not in text, text


@render
def test_unlock_reports_partial_files_it_removed(qtbot, vault_window, nibabel_data):
    window = vault_window
    controller = window.vault_controller
    with Vault.create(controller.session.path, PASSPHRASE, kdf=FAST_KDF) as vault:
        vault.import_nifti(nibabel_data / "anatomical.nii")
    leftover = controller.session.path / "blobs" / ".tmp-w-00112233445566ff.part"
    leftover.write_bytes(b"plain")
    dialog = controller.locking.request_unlock()
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "unlock") == "finished"
    assert not leftover.exists()
    assert (
        controller.messages.last_info[0] == "Vault cleaned up"
        and "partial file" in controller.messages.last_info[1]
    )


@pytest.mark.slow
@render
def test_core_dumps_are_off_while_the_vault_is_unlocked(tiny_models_dir, tmp_path):
    """In a child process (PR_SET_DUMPABLE and a hard RLIMIT_CORE of 0 cannot be undone): the app turns
    core dumps off when the vault is unlocked (created, here) through its dialog."""
    import os
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("prctl(PR_SET_DUMPABLE) is Linux only")
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("child_core_dump_app.py")),
            str(tiny_models_dir),
            str(tmp_path / "vault"),
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VOLSYNTH_ANCHOR_DIR": str(tmp_path / "anchors")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(
        line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("BEFORE", "UNLOCKED"))
    )
    assert lines["BEFORE"].endswith(" 1")  # an ordinary, dumpable process before the vault
    assert lines["UNLOCKED"] == "(0, 0) 0"


@render
def test_a_rolled_back_vault_is_named_and_repaired_from_the_app(qtbot, vault_window, nibabel_data, tmp_path):
    window = vault_window
    controller = window.vault_controller
    with Vault.create(controller.session.path, PASSPHRASE, kdf=FAST_KDF) as vault:
        vault.import_nifti(nibabel_data / "anatomical.nii", label="kept")
        old_index = (vault.path / "index.vsi").read_bytes()
        vault.import_nifti(nibabel_data / "example4d.nii.gz", label="dropped")
    (controller.session.path / "index.vsi").write_bytes(old_index)  # an older index put back

    dialog = controller.locking.request_unlock()
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "unlock") == "failed"
    box = controller.integrity.repair_box
    assert (
        box is not None and "index.vsi was rolled back" in box.text() and "Nothing was deleted" in box.text()
    )
    assert not controller.session.is_unlocked
    controller.integrity.repair_offer_button.click()

    dialog = controller.integrity.repair_dialog
    assert dialog is not None and dialog.mode == "repair"
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "repair") == "finished"
    box = controller.integrity.repair_box
    assert box is not None and "\u201cdropped\u201d" in box.text()
    controller.integrity.repair_confirm_button.click()
    assert _wait_task(qtbot, controller, "repair") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 2, timeout=10_000)
    assert controller.session.is_unlocked and {i.label for i in controller.listing.items} == {
        "kept",
        "dropped",
    }
    assert controller.messages.last_info[0] == "Vault repaired"


@render
def test_new_vault_is_in_the_vault_menu(qtbot, vault_window, tmp_path, monkeypatch):
    window = vault_window
    controller = window.vault_controller
    menu = controller.menu
    assert menu.actions()[0] is menu.new_action and menu.new_action.text() == "&New Vault..."
    # Each item of the menu has its own mnemonic, and the menu's own is not View's (Alt+V).
    letters = [a.text().split("&")[1][0].lower() for a in menu.actions() if "&" in a.text()]
    assert len(letters) == len(set(letters)), letters
    bar_letters = [a.text().split("&")[1][0].lower() for a in window.menuBar().actions() if "&" in a.text()]
    assert len(bar_letters) == len(set(bar_letters)), bar_letters
    assert not controller.session.exists
    menu.new_action.trigger()  # no vault yet: created where the app keeps it
    dialog = controller.locking.unlock_dialog
    assert dialog is not None and dialog.mode == "create"
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.confirm_edit.setText(PASSPHRASE)
    dialog.ok_button.click()
    assert _wait_task(qtbot, controller, "create") == "finished"
    qtbot.waitUntil(lambda: controller.session.is_unlocked and not controller.tasks.running, timeout=10_000)

    from PySide6.QtWidgets import QFileDialog

    elsewhere = tmp_path / "second-vault"
    elsewhere.mkdir()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(elsewhere)))
    menu.new_action.trigger()  # one exists: the new one goes in a folder the user picks
    assert controller.session.path == elsewhere and not controller.session.is_unlocked
    assert controller.locking.unlock_dialog is not None and controller.locking.unlock_dialog.mode == "create"
    controller.locking.unlock_dialog.reject()
