"""The vault's integrity in the app (app/vault/integrity.py): a tampered item is named in a clear error and in
Verify All, a rolled-back vault is named and repaired from the app (real vaults in tmp_path, no main window)."""

from __future__ import annotations

import pytest

from engine.vault import Vault
from tests.app.vault.helpers import FAST_KDF, PASSPHRASE, create_via_dialog, import_items, wait_task

render = pytest.mark.render


@render
def test_tampered_item_shows_a_clear_error_naming_it(qtbot, vault_app, nibabel_data, error_dialogs):
    app, controller = vault_app, vault_app.controller
    create_via_dialog(qtbot, controller)
    import_items(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1, label="knee MRI")
    info = controller.listing.items[0]
    (blob,) = (controller.session.path / "blobs").glob("*.vsb")
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    blob.write_bytes(bytes(raw))

    controller.opening.open_item(info.id)
    assert wait_task(qtbot, controller, "open") == "failed"
    title, message = error_dialogs[-1]
    assert title == "Cannot open \u201cknee MRI\u201d from the vault"
    assert info.id in message and "corrupted" in message and "Traceback" not in message
    assert not app.state.volumes

    controller.integrity.verify_all()
    assert wait_task(qtbot, controller, "verify") == "finished"
    title, message = error_dialogs[-1]
    assert title == "The vault failed verification" and "\u201cknee MRI\u201d" in message
    assert not controller.integrity.last_verify.ok
    assert controller.session.is_unlocked  # the app goes on
    controller.listing.refresh()
    assert wait_task(qtbot, controller, "list") == "finished"


@render
def test_a_rolled_back_vault_is_named_and_repaired_from_the_app(qtbot, vault_app, nibabel_data):
    controller = vault_app.controller
    with Vault.create(controller.session.path, PASSPHRASE, kdf=FAST_KDF) as vault:
        vault.import_nifti(nibabel_data / "anatomical.nii", label="kept")
        old_index = (vault.path / "index.vsi").read_bytes()
        vault.import_nifti(nibabel_data / "example4d.nii.gz", label="dropped")
    (controller.session.path / "index.vsi").write_bytes(old_index)  # an older index put back

    dialog = controller.locking.request_unlock()
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "unlock") == "failed"
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
    assert wait_task(qtbot, controller, "repair") == "finished"
    box = controller.integrity.repair_box
    assert box is not None and "\u201cdropped\u201d" in box.text()
    controller.integrity.repair_confirm_button.click()
    assert wait_task(qtbot, controller, "repair") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 2, timeout=10_000)
    assert controller.session.is_unlocked and {i.label for i in controller.listing.items} == {
        "kept",
        "dropped",
    }
    assert controller.messages.last_info[0] == "Vault repaired"
