"""An item's actions (app/vault/item_actions.py): edit its details from the context menu or the Details button
(a rename reaches the Session list), and delete it, asked first (real vaults in tmp_path, no main window)."""

from __future__ import annotations

import pytest

from engine.vault import Vault
from tests.app.vault.helpers import (
    FAST_KDF,
    PASSPHRASE,
    create_via_dialog,
    import_items,
    menu_action,
    open_item,
    right_click_row,
    wait_task,
)

render = pytest.mark.render


@render
def test_delete_asks_first_and_cancel_keeps_the_item(qtbot, vault_app, nibabel_data):
    controller = vault_app.controller
    with Vault.create(controller.session.path, PASSPHRASE, kdf=FAST_KDF) as vault:
        vault.import_nifti(nibabel_data / "anatomical.nii", label="existing scan")
    controller.locking.unlock(PASSPHRASE)
    assert wait_task(qtbot, controller, "unlock") == "finished"
    browser = controller.browser
    qtbot.waitUntil(lambda: browser.table.rowCount() == 1, timeout=10_000)

    # delete asks first; Cancel keeps the item, Delete removes it
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
    assert wait_task(qtbot, controller, "delete") == "finished"
    qtbot.waitUntil(lambda: browser.table.rowCount() == 0, timeout=10_000)
    assert not list((controller.session.path / "blobs").glob("*.vsb"))


@render
def test_a_renamed_vault_item_is_renamed_in_the_session_list(qtbot, vault_app, nibabel_data):
    app, controller = vault_app, vault_app.controller
    create_via_dialog(qtbot, controller)
    import_items(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1, patient={"name": "Doe^Jane"})
    info = controller.listing.items[0]
    entry = open_item(qtbot, controller, info.id)
    session = app.session_panel.list
    assert session.item(0).text() == info.label
    renamed = []
    app.state.volumes_changed.connect(lambda *args: renamed.append(entry.name))
    browser = controller.browser
    browser.select_item(info.id)
    browser.details_button.click()
    dialog = controller.item_actions.details_dialog
    dialog.label_edit.clear()
    qtbot.keyClicks(dialog.label_edit, "T1 follow-up")
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "edit") == "finished"
    qtbot.waitUntil(lambda: session.item(0).text() == "T1 follow-up", timeout=10_000)
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)  # listed again
    # the app is told of the rename (the window's title follows the shown volume's name on it)
    assert entry.name == "T1 follow-up" and app.state.shown is entry and "T1 follow-up" in renamed


@render
def test_details_are_edited_from_the_context_menu_and_the_details_button(qtbot, vault_app, nibabel_data):
    controller = vault_app.controller
    create_via_dialog(qtbot, controller)
    import_items(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1, patient={"name": "Doe^Jane"})
    browser = controller.browser
    info = controller.listing.items[0]

    right_click_row(qtbot, browser, info.id)
    menu_action(browser.table_menu, "Edit Details...").trigger()
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
    assert wait_task(qtbot, controller, "edit") == "finished"
    qtbot.waitUntil(
        lambda: browser.row_texts() and browser.row_texts()[0][4] == "T1 baseline", timeout=10_000
    )
    assert browser.row_texts()[0][:3] == ("Doe, Jane", "\u2014", "2024-01-31")

    browser.select_item(info.id)
    browser.details_button.click()
    dialog = controller.item_actions.details_dialog
    dialog.patient_id_edit.setText("P-0042")
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "edit") == "finished"
    qtbot.waitUntil(
        lambda: controller.listing.items and controller.listing.items[0].patient.get("id") == "P-0042",
        timeout=10_000,
    )
    assert (
        controller.listing.items[0].patient["name"] == "Doe^Jane"
        and controller.listing.items[0].label == "T1 baseline"
    )
