"""What the app remembers about files (app/vault/privacy.py): Open Recent never holds a vault item, and Vault >
Remember Recent Files and Folders switched off forgets the paths at once, notes none after and none at close
(a real vault in tmp_path, no main window: File > Open is the app's file commands)."""

from __future__ import annotations

import shutil

import pytest

from tests.app.vault.helpers import create_via_dialog, import_items, open_item

render = pytest.mark.render


@render
def test_recent_files_never_hold_vault_items_and_can_be_switched_off(
    qtbot, vault_app, nibabel_data, tmp_path
):
    app = vault_app
    controller = create_via_dialog(qtbot, app.controller)
    import_items(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1)
    open_item(qtbot, controller, controller.listing.items[0].id)
    assert app.state.recent.paths() == []  # an item decrypted from the vault has no path to remember

    (tmp_path / "patients").mkdir()
    source = tmp_path / "patients" / "Doe_Jane_t1.nii"
    shutil.copy(nibabel_data / "anatomical.nii", source)
    with qtbot.waitSignal(app.volume_opened, timeout=20_000):
        app.files.open_path(source)  # File > Open
    assert app.state.recent.paths() == [str(source.resolve())]
    assert controller.remember_action.isChecked()

    controller.remember_action.trigger()  # Vault > Remember Recent Files and Folders: off
    assert not controller.remember_action.isChecked() and app.state.recent.paths() == []
    text = app.settings_text()
    assert "Doe_Jane" not in text and "patients" not in text, text
    with qtbot.waitSignal(app.volume_opened, timeout=20_000):
        app.files.open_path(source)
    assert app.state.recent.paths() == []
    text = app.settings_text()
    assert "Doe_Jane" not in text and "patients" not in text, text  # nothing noted while it is off
    app.host.close()
    text = app.settings_text()
    assert "Doe_Jane" not in text and "patients" not in text, text
