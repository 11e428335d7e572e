"""The Vault menu (app/vault/menu.py): New Vault first, each item its own mnemonic; New Vault creates the vault
where the app keeps it, or, once one exists, in a folder the user picks (no main window)."""

from __future__ import annotations

import pytest

from tests.app.vault.helpers import create_via_dialog, mnemonics

render = pytest.mark.render


@render
def test_new_vault_is_in_the_vault_menu(qtbot, vault_app, tmp_path, monkeypatch):
    app = vault_app
    controller = app.controller
    menu = controller.menu
    assert menu.actions()[0] is menu.new_action and menu.new_action.text() == "&New Vault..."
    # Each item of the menu has its own mnemonic, and the menu's own is not another menu's (View's: Alt+V).
    letters = mnemonics(menu.actions())
    assert len(letters) == len(set(letters)), letters
    bar_letters = mnemonics(app.services.menus.menu_bar.actions())
    assert "v" in bar_letters and len(bar_letters) == len(set(bar_letters)), bar_letters
    assert not controller.session.exists
    menu.new_action.trigger()  # no vault yet: created where the app keeps it
    create_via_dialog(qtbot, controller, controller.locking.unlock_dialog)

    from PySide6.QtWidgets import QFileDialog

    elsewhere = tmp_path / "second-vault"
    elsewhere.mkdir()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(elsewhere)))
    menu.new_action.trigger()  # one exists: the new one goes in a folder the user picks
    assert controller.session.path == elsewhere and not controller.session.is_unlocked
    assert controller.locking.unlock_dialog is not None and controller.locking.unlock_dialog.mode == "create"
    controller.locking.unlock_dialog.reject()
