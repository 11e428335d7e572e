"""The vault controller (app/vault/controller.py) takes the app's services, not a main window: everything it
tells the app goes through the status line, the error dialog and its own signals."""

from __future__ import annotations

from tests.app.vault.helpers import FAST_KDF, PASSPHRASE, wait_task


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
    assert wait_task(qtbot, controller, "create") == "finished"
    assert controller.session.is_unlocked and statuses[-1] == f"Vault unlocked: {controller.session.path}"

    controller.importing.import_nifti([nibabel_data / "anatomical.nii"], label="a scan")
    assert wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: len(controller.listing.items) == 1, timeout=10_000)
    controller.opening.open_item(controller.listing.items[0].id)
    qtbot.waitUntil(lambda: len(opened) == 1, timeout=20_000)
    assert state.volumes == [opened[0]] and state.shown is opened[0] and opened[0].name == "a scan"

    controller.locking.lock()
    assert not controller.session.is_unlocked and state.volumes == [] and statuses[-1] == "Vault locked"
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    assert errors == []
