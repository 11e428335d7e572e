"""Changing the vault's passphrase (app/vault/passphrase.py): the key re-wrapped, or the vault re-encrypted under a
new key with a box that says what that reaches (real vaults in tmp_path, no main window)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from tests.app.vault.helpers import FAST_KDF, PASSPHRASE, create_via_dialog, wait_task

render = pytest.mark.render


@render
def test_change_passphrase_rewraps_the_key(qtbot, vault_app, error_dialogs):
    controller = create_via_dialog(qtbot, vault_app.controller)
    dialog = controller.passphrase.change_passphrase_dialog()
    dialog.old_edit.setText("not the passphrase")
    dialog.new_edit.setText("a brand new passphrase")
    dialog.confirm_edit.setText("a brand new passphrase")
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "passphrase") == "failed"
    assert error_dialogs[-1][0] == "Cannot change the passphrase" and "wrong" in error_dialogs[-1][1]
    assert dialog.isVisible() and "wrong" in dialog.error_label.text()
    dialog.old_edit.setText(PASSPHRASE)
    dialog.new_edit.setText("a brand new passphrase")
    dialog.confirm_edit.setText("a brand new passphrase")
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "passphrase") == "finished"
    assert not dialog.isVisible() and controller.session.vault.kdf_params == FAST_KDF

    controller.locking.lock()
    controller.locking.unlock(PASSPHRASE)
    assert wait_task(qtbot, controller, "unlock") == "failed" and not controller.session.is_unlocked
    controller.locking.unlock("a brand new passphrase")
    assert wait_task(qtbot, controller, "unlock") == "finished" and controller.session.is_unlocked


@render
def test_change_passphrase_with_re_encryption_puts_the_vault_under_a_new_key(qtbot, vault_app):
    controller = create_via_dialog(qtbot, vault_app.controller)
    old_id = controller.session.vault.vault_id
    dialog = controller.passphrase.change_passphrase_dialog()
    assert "old passphrase still opens old copies" in dialog.findChild(QLabel, "dialogText").text()
    qtbot.keyClicks(dialog.old_edit, PASSPHRASE)
    qtbot.keyClicks(dialog.new_edit, "a brand new passphrase")
    qtbot.keyClicks(dialog.confirm_edit, "a brand new passphrase")
    qtbot.mouseClick(dialog.rekey_box, Qt.MouseButton.LeftButton)
    assert dialog.rekey_box.isChecked()
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "passphrase") == "finished"
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
    assert wait_task(qtbot, controller, "unlock") == "failed" and not controller.session.is_unlocked
    controller.locking.unlock("a brand new passphrase")
    assert wait_task(qtbot, controller, "unlock") == "finished" and controller.session.is_unlocked
