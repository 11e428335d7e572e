"""Items out of the vault to files (app/vault/exporting.py): de-identified by default (headers cleared, .nii.gz),
a message that counts the files, Enter in the folder field exports, a synthetic volume leaves marked, and the
dialog starts in the folder used last (real vaults in tmp_path, no main window)."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from engine.vault import Vault
from tests.app.vault.helpers import (
    FAST_KDF,
    PASSPHRASE,
    create_via_dialog,
    generated_entry,
    import_items,
    nifti_with_descrip,
    save_to_vault,
    wait_task,
)

render = pytest.mark.render


@render
def test_export_deidentified_clears_the_header(qtbot, vault_app, nibabel_data, tmp_path, error_dialogs):
    controller = create_via_dialog(qtbot, vault_app.controller)
    source = nifti_with_descrip(tmp_path, nibabel_data / "anatomical.nii", b"Jane Doe 1970-01-01 MRN 12345")
    import_items(qtbot, controller, [source], rows=1, patient={"name": "Doe^Jane"})
    info = controller.listing.items[0]

    dialog = controller.exporting.export_dialog_for(info.id)
    assert dialog.deidentify_box.isChecked()  # on unless the user turns it off
    out = tmp_path / "export"
    dialog.folder_edit.setText(str(out))
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "export") == "finished"
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
    assert wait_task(qtbot, controller, "export") == "failed"
    assert error_dialogs[-1][0] == "Cannot export from the vault" and "already exists" in error_dialogs[-1][1]
    controller.exporting.export_item(info.id, out, deidentify=False, overwrite=True)
    assert wait_task(qtbot, controller, "export") == "finished"
    plain = controller.exporting.last_export.files[0]  # the imported bytes as they were: .nii
    assert plain.name == exported.name.removesuffix(".gz")
    assert plain.read_bytes() == source.read_bytes()
    assert b"Jane Doe" in nib.load(str(plain)).header["descrip"].item()


@render
def test_deidentified_dicom_export_is_nii_gz_and_its_message_counts_the_files(
    qtbot, vault_app, tmp_path, screenshot
):
    from pydicom.data import get_testdata_file

    from app.core.vault_items import ImportJob

    app = vault_app
    controller = create_via_dialog(qtbot, app.controller)
    source = Path(get_testdata_file("MR_small.dcm"))
    controller.importing.import_sources([ImportJob(source, "dicom", label="T2 axial")])
    assert wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    info = controller.listing.items[0]

    controller.browser.select_item(info.id)
    controller.browser.export_button.click()
    dialog = controller.exporting.export_dialog
    assert dialog.deidentify_box.isChecked()
    out = tmp_path / "shared"
    dialog.folder_edit.setText(str(out))
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "export") == "finished"
    nii, dicom = controller.exporting.last_export.files
    assert nii.name.endswith(".nii.gz") and nii.read_bytes()[:2] == b"\x1f\x8b"  # really gzip
    assert nib.load(str(nii)).header["descrip"].item() == b""
    assert dicom.suffix == ".dcm"
    title, text = controller.messages.last_info
    summary = f"Wrote 1 NIfTI and 1 DICOM files to {out} (de-identified)"
    assert title == "Exported from the Vault" and text == summary  # no list of paths in the message
    assert app.status() == summary
    box = controller.messages.last_info_box
    assert box.detailedText().splitlines() == [str(nii), str(dicom)]  # behind "Show Details..."
    qtbot.waitExposed(box)
    details_button = next(b for b in box.buttons() if box.buttonRole(b) == QMessageBox.ButtonRole.ActionRole)
    qtbot.mouseClick(details_button, Qt.MouseButton.LeftButton)  # "Show Details..." lists the paths
    screenshot(box, "14-vault-export-message")
    box.accept()


@render
def test_enter_in_the_export_folder_field_exports(qtbot, vault_app, nibabel_data, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    controller = vault_app.controller
    with Vault.create(controller.session.path, PASSPHRASE, kdf=FAST_KDF) as vault:
        item = vault.import_nifti(nibabel_data / "anatomical.nii", label="existing scan").id
    controller.locking.unlock(PASSPHRASE)
    assert wait_task(qtbot, controller, "unlock") == "finished"
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
    assert wait_task(qtbot, controller, "export") == "finished"
    assert browsed == [] and not dialog.isVisible()
    assert list(out.glob("scan-*.nii*"))


@render
def test_export_names_the_file_and_a_synthetic_volume_leaves_as_marked_nii_gz(qtbot, vault_app, tmp_path):
    from engine.nifti.io import load_nifti

    app = vault_app
    controller = create_via_dialog(qtbot, app.controller)
    entry = generated_entry(app.state, seed=21)
    save_to_vault(qtbot, controller, rows=1)
    info = controller.listing.items[0]

    browser = controller.browser
    browser.select_item(info.id)
    browser.export_button.click()
    dialog = controller.exporting.export_dialog
    out = tmp_path / "shared"
    dialog.folder_edit.setText(str(out))
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "export") == "finished"
    nii = controller.exporting.last_export.files[0]
    assert nii.name.endswith(".nii.gz") and nii.parent == out
    title, text = controller.messages.last_info
    assert (
        title == "Exported from the Vault"
        and text == f"Wrote 1 NIfTI and 1 JSON files to {out} (de-identified)"
    )
    assert app.status() == text
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
