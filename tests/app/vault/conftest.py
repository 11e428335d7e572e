"""Fixtures of the vault's app tests: per-test vault state, the vault installed on the app's services (no main
window) over an empty vault, and the main window pointed at one for the few tests that are about the window."""

from __future__ import annotations

import pytest

from tests.app.vault.helpers import VaultApp, point_at_new_vault, use_new_vault
from tests.core_dumps import record_core_dumps


@pytest.fixture(autouse=True)
def private_vault_state(tmp_path, monkeypatch):
    """Per-test vault anchors, and core dumps recorded instead of turned off in the test process (that
    cannot be undone; test_core_dumps_are_off_while_the_vault_is_unlocked checks the real thing in a child)."""
    monkeypatch.setenv("VOLSYNTH_ANCHOR_DIR", str(tmp_path / "anchors"))
    return record_core_dumps(monkeypatch)


@pytest.fixture
def vault_app(qtbot, app_services, tmp_path):
    """The vault as ``install_vault`` gives it to the app, on ``app_services`` (a plain host window, no main
    window): its dock, menu and padlock, the Session list it adds "Save to Vault" to, and the file commands
    (File > Open, Save, Save As) whose Save of a vault item asks the vault's boundary. The vault folder is
    empty, in tmp_path (fast Argon2 parameters)."""
    from app.vault import install_vault
    from tests.app.generating import dock_session_panel, volume_files

    services = app_services
    session_panel = dock_session_panel(services)
    files = volume_files(services)
    controller = install_vault(services, session_panel.list, files.rebuild_recent_menu)
    files.vault_boundary = controller.boundary
    files.restore_recent()  # File > Open Recent as the settings have it, as at the app's start
    use_new_vault(controller, tmp_path / "vault")
    yield VaultApp(services, controller, session_panel, files)
    # A task the test's last step set off (the listing refreshed after an unlock) ends before the next test;
    # the bound is for a task that hangs.
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=60_000)


@pytest.fixture
def vault_window(qtbot, main_window, tmp_path):
    """The main window with its vault pointed at an empty folder in tmp_path (fast Argon2 parameters)."""
    yield point_at_new_vault(main_window, tmp_path / "vault")
    qtbot.waitUntil(lambda: not main_window.vault_controller.tasks.running, timeout=60_000)  # as vault_app


@pytest.fixture
def recovery(qtbot, vault_app):
    """Crash recovery on the app's services, as the main window installs it (its folder in this test's data
    home): it keeps each generated volume of the session."""
    from app.core.recovery import RecoveryStore
    from app.recovery.bar import RecoveryBar, install_recovery

    controller = install_recovery(vault_app.services, RecoveryStore(), RecoveryBar())
    yield controller
    runner = vault_app.services.runner
    qtbot.waitUntil(lambda: not runner.running("recovery-keep"), timeout=10_000)
    controller.close()


@pytest.fixture
def save_dialogs(monkeypatch):
    """The save-file dialog, answered by the test (``save_dialogs.answer``); what it proposed is recorded."""
    from PySide6.QtWidgets import QFileDialog

    from tests.app.vault.helpers import SaveDialogs

    dialogs = SaveDialogs()
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(dialogs))
    return dialogs
