"""The app side of the encrypted vault (``engine.vault``): browser dock, dialogs, Vault menu, auto-lock.

``install_vault(window)`` is the one call the main window makes: it adds the Vault dock (bottom, hidden on a
first start; View > Panels and Vault > Show Vault Browser bring it up), the Vault menu before Help, a padlock
in the status bar and a "Save to Vault" entry in the session list's context menu, puts the private
recent-files list in place with its "Remember Recent Files and Folders" toggle (``app.vault.privacy``), and
returns the ``VaultController`` that owns the vault.

Nothing here imports ``engine.vault`` at start-up; it is loaded the first time the vault is used.
"""

from __future__ import annotations

from functools import partial

from PySide6.QtCore import Qt

from app.vault.browser import VaultBrowser, VaultStatusButton
from app.vault.controller import VaultController
from app.vault.dialogs import (
    ChangePassphraseDialog,
    ExportDialog,
    ImportDetailsDialog,
    ItemDetailsDialog,
    VaultUnlockDialog,
)
from app.vault.menu import VaultMenu
from app.vault.privacy import install_privacy

__all__ = [
    "ChangePassphraseDialog",
    "ExportDialog",
    "ImportDetailsDialog",
    "ItemDetailsDialog",
    "VaultBrowser",
    "VaultController",
    "VaultMenu",
    "VaultUnlockDialog",
    "install_vault",
]


def install_vault(window) -> VaultController:
    """Give ``window`` (a ``MainWindow``) its vault UI. Call before the window restores its saved state, so
    the dock's place is restored too.

    The one place in ``app/vault`` that reads the main window: every piece gets what it needs from here
    (the session, the job runner, the settings, the status line and error dialog, the parent of its
    dialogs) or a signal connected here; none of them keeps the window.
    """
    state = window.state
    controller = VaultController(
        state=state,
        runner=window.runner,
        settings=window.settings,
        show_status=window.show_status,
        show_error=window.show_error,
        parent=window,
    )
    controller.volume_opened.connect(window.volume_opened)
    controller.browser = VaultBrowser(controller, state)
    dock = window.add_dock(
        controller.browser, "Vault", Qt.DockWidgetArea.BottomDockWidgetArea, name="vaultDock"
    )
    dock.hide()
    controller.show_browser_requested.connect(partial(_show_dock, dock))
    menu = VaultMenu(controller, state, window)
    controller.menu = menu
    menu.addSeparator()
    controller.remember_action = install_privacy(
        window.settings,
        state,
        menu,
        parent=window,
        show_status=window.show_status,
        rebuild_recent_menu=getattr(window, "_rebuild_recent_menu", None),
    )
    bar = window.menuBar()
    help_menu = next((a for a in bar.actions() if a.text().replace("&", "") == "Help"), None)
    if help_menu is not None:
        bar.insertMenu(help_menu, menu)
    else:
        bar.addMenu(menu)
    session_list = getattr(getattr(window, "session_panel", None), "list", None)
    if session_list is not None:
        menu.attach_session_list(session_list)
    controller.status_button = VaultStatusButton(controller)
    window.statusBar().addPermanentWidget(controller.status_button)
    return controller


def _show_dock(dock) -> None:
    dock.show()
    dock.raise_()
