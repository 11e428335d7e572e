"""The app side of the encrypted vault (``engine.vault``): browser dock, dialogs, Vault menu, auto-lock.

``install_vault(services, ...)`` is the one call the main window makes: it adds the Vault dock (bottom, hidden on a
first start; View > Panels and Vault > Show Vault Browser bring it up), the Vault menu before Help, a padlock
in the status bar and a "Save to Vault" entry in the session list's context menu, puts the private
recent-files list in place with its "Remember Recent Files and Folders" toggle (``app.vault.privacy``), and
returns the ``VaultController`` that owns the vault.

Nothing here imports ``engine.vault`` at start-up; it is loaded the first time the vault is used.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QListWidget

from app.services import AppServices
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


def install_vault(
    services: AppServices, session_list: QListWidget, rebuild_recent_menu: Callable[[], None]
) -> VaultController:
    """Give the main window its vault UI. Call before the window restores its saved state, so the dock's
    place is restored too. ``session_list`` (the Session panel's list) gets "Save to Vault" in its context
    menu; ``rebuild_recent_menu`` rebuilds File > Open Recent after the private list was cleared.

    Every piece of ``app/vault`` gets what it needs from here (the session, the job runner, the settings,
    the status line and error dialog, the parent of its dialogs) or a signal connected here.
    """
    state = services.state
    controller = VaultController(services)
    controller.volume_opened.connect(services.volume_opened)
    controller.browser = VaultBrowser(controller, state)
    dock = services.add_dock(
        controller.browser, "Vault", Qt.DockWidgetArea.BottomDockWidgetArea, name="vaultDock"
    )
    dock.hide()
    controller.show_browser_requested.connect(partial(_show_dock, dock))
    menu = VaultMenu(controller, state, services.parent, services.menus.add_window_action)
    controller.menu = menu
    menu.addSeparator()
    controller.remember_action = install_privacy(
        services.settings,
        state,
        menu,
        parent=services.parent,
        show_status=services.show_status,
        rebuild_recent_menu=rebuild_recent_menu,
    )
    bar = services.menus.menu_bar
    help_menu = next((a for a in bar.actions() if a.text().replace("&", "") == "Help"), None)
    if help_menu is not None:
        bar.insertMenu(help_menu, menu)
    else:
        bar.addMenu(menu)
    menu.attach_session_list(session_list)
    controller.status_button = VaultStatusButton(controller)
    services.add_status_widget(controller.status_button)
    return controller


def _show_dock(dock) -> None:
    dock.show()
    dock.raise_()
