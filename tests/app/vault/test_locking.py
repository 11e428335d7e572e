"""Unlocking, creating and locking the vault (app/vault/locking.py): a wrong passphrase said once, inline; Enter
while the dialog is busy; the lock button and the auto-lock after idle time; what an unlock cleaned up; core
dumps off while unlocked (real vaults in tmp_path, no main window)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from engine.vault import KdfParams, Vault
from tests.app.vault.helpers import (
    FAST_KDF,
    PASSPHRASE,
    create_via_dialog,
    import_items,
    open_item,
    unlock_via_dialog,
    wait_task,
)

render = pytest.mark.render


@render
def test_wrong_passphrase_shows_an_error_and_stays_locked(qtbot, vault_app, nibabel_data, error_dialogs):
    controller = vault_app.controller
    with Vault.create(controller.session.path, PASSPHRASE, kdf=FAST_KDF) as vault:
        vault.import_nifti(nibabel_data / "anatomical.nii", label="existing scan")

    dialog = controller.locking.request_unlock()
    assert dialog.mode == "unlock" and controller.browser.unlock_button.text() == "Unlock..."
    dialog.passphrase_edit.setText("not the passphrase")
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "unlock") == "failed"
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
    assert wait_task(qtbot, controller, "unlock") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)
    assert not dialog.isVisible() and controller.browser.row_texts()[0][4] == "existing scan"


@render
def test_after_a_wrong_passphrase_the_right_one_and_enter_unlock(
    qtbot, vault_app, nibabel_data, error_dialogs
):
    """Issue 24, point 11: typed keys only. Before, Enter reached Cancel while the dialog was busy (the
    passphrase field was disabled, so the focus went to Cancel, an auto-default button) and a wrong
    passphrase was reported twice (a pop-up, then the inline line)."""
    controller = vault_app.controller
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
    assert wait_task(qtbot, controller, "unlock") == "failed"
    assert dialog.isVisible(), "Enter cancelled the unlock dialog"
    assert "Wrong passphrase" in dialog.error_label.text() and error_dialogs == []  # said once, inline
    assert dialog.focusWidget() is dialog.passphrase_edit
    qtbot.keyClicks(dialog.passphrase_edit, PASSPHRASE)
    qtbot.keyClick(dialog.passphrase_edit, Qt.Key.Key_Return)
    assert wait_task(qtbot, controller, "unlock") == "finished"
    qtbot.waitUntil(lambda: controller.session.is_unlocked and not dialog.isVisible(), timeout=10_000)


@render
def test_lock_button_and_auto_lock_clear_the_browser(qtbot, vault_app, nibabel_data):
    app, controller = vault_app, vault_app.controller
    create_via_dialog(qtbot, controller)
    browser = controller.browser
    import_items(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1)
    open_item(qtbot, controller, controller.listing.items[0].id)
    assert len(app.state.volumes) == 1

    browser.lock_button.click()
    assert not controller.session.is_unlocked and not controller.session.vault.is_unlocked
    assert browser.table.rowCount() == 0 and browser.pages.currentWidget() is browser.locked_page
    assert not app.state.volumes  # the decrypted volume left the session with the keys
    assert controller.status_button.text() == "Vault locked"

    controller.locking.unlock(PASSPHRASE)
    assert wait_task(qtbot, controller, "unlock") == "finished"
    qtbot.waitUntil(lambda: browser.table.rowCount() == 1, timeout=10_000)
    assert controller.session.auto_lock_minutes == 15 and controller.session.vault.idle_timeout_s == 15 * 60

    # user activity postpones auto-lock; 15 idle minutes lock it (a fake clock stands in for waiting)
    start = time.monotonic()
    controller.session.clock = lambda: start + 14 * 60
    assert not controller.locking.check_idle()
    qtbot.keyClick(app.host, Qt.Key.Key_Shift)  # a key anywhere in the app
    assert controller.session.vault.seconds_until_auto_lock() == pytest.approx(15 * 60, abs=1)
    controller.session.clock = lambda: start + 14 * 60 + 15 * 60 + 1
    assert controller.locking.check_idle()
    assert not controller.session.is_unlocked and browser.table.rowCount() == 0
    assert browser.pages.currentWidget() is browser.locked_page
    assert "15 min" in app.status()

    controller.locking.set_auto_lock_minutes(1)  # the setting persists and applies to the open vault
    assert (
        app.settings.value("vault/auto_lock_minutes", type=int) == 1
        and controller.session.vault.idle_timeout_s == 60
    )


@render
def test_unlock_reports_partial_files_it_removed(qtbot, vault_app, nibabel_data):
    controller = vault_app.controller
    with Vault.create(controller.session.path, PASSPHRASE, kdf=FAST_KDF) as vault:
        vault.import_nifti(nibabel_data / "anatomical.nii")
    leftover = controller.session.path / "blobs" / ".tmp-w-00112233445566ff.part"
    leftover.write_bytes(b"plain")
    assert unlock_via_dialog(qtbot, controller) == "finished"
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
