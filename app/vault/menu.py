"""The window's Vault menu, and the "Save to Vault" entry of the session list's context menu.

Its actions are added to the window too, so their shortcuts (Lock Ctrl+L, Show Vault Browser Ctrl+Shift+V)
work while the menu is closed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QFileDialog, QMenu, QWidget

from app.services.shortcuts import set_shortcut
from app.vault.boundary import SCREENSHOT_MARK, SCREENSHOT_REFUSE
from app.vault.dialogs import UNLOCKED_COLOUR, lock_icon


class VaultMenu(QMenu):
    """The window's Vault menu (and the Save to Vault entry of the session list's context menu).

    Args:
        controller: The ``VaultController``.
        state: The session (``AppState``): the shown volume, and the volumes of the session list.
        parent: The window the menu belongs to, and the parent of its actions.
        add_window_action: Makes an action's keys work anywhere in that window; the actions with keys go
            through it, so their shortcuts work while the menu is closed.
    """

    def __init__(
        self, controller, state, parent: QWidget, add_window_action: Callable[[QAction], None]
    ) -> None:
        super().__init__("V&ault", parent)  # Alt+V is View's
        self.controller = controller
        self._state = state
        self._owner = parent
        self._add_window_action = add_window_action
        c = controller
        # What a first-time user looks for; "Unlock (or create)" and "Open Vault Folder..." hid it.
        self.new_action = self._add(
            "&New Vault...",
            self._on_new_action_triggered,
            tip="Create an encrypted vault (in a folder you choose)",
        )
        self.unlock_action = self._add(
            "&Unlock Vault...", c.locking.request_unlock, tip="Unlock (or create) the encrypted vault"
        )
        self.lock_action = self._add(
            "&Lock Vault", self._on_lock_action_triggered, "vault.lock", "Lock the vault now"
        )
        self.addSeparator()
        self.import_nifti_action = self._add(
            "Import N&IfTI Files...",
            c.importing.import_nifti_dialog,
            tip="Encrypt NIfTI files into the vault",
        )
        self.import_dicom_action = self._add(
            "Import &DICOM Folder...",
            c.importing.import_dicom_dialog,
            tip="Encrypt a DICOM series (and its original files) into the vault",
        )
        self.save_action = self._add(
            "&Save Shown Volume to Vault",
            self._on_save_action_triggered,
            tip="Store the shown volume; a generated one keeps its provenance",
        )
        self.addSeparator()
        self.verify_action = self._add(
            "&Verify All Items", c.integrity.verify_all, tip="Authenticate every item and the audit trail"
        )
        self.repair_action = self._add(
            "&Repair Vault...",
            c.integrity.request_repair,
            tip="After a rollback or an interrupted import: put back the items whose files are still there",
        )
        self.passphrase_action = self._add("Change &Passphrase...", c.passphrase.change_passphrase_dialog)
        self.auto_lock_action = self._add(
            "&Auto-Lock...",
            c.locking.auto_lock_dialog,
            tip="Minutes without activity before the vault locks itself",
        )
        self.folder_action = self._add(
            "&Open Vault Folder...",
            c.locking.choose_vault_folder,
            tip="Use (or create) a vault in another folder",
        )
        # How a screenshot of a vault item leaves (asked at the first one; app.vault.boundary).
        self.screenshots_menu = self.addMenu("S&creenshots of Vault Items")
        self.screenshots_menu.setStatusTip(
            "Screenshots of a volume from the vault: marked as patient data, or refused"
        )
        group = QActionGroup(self)
        self.screenshot_actions: dict[str, QAction] = {}
        for choice, text in ((SCREENSHOT_MARK, "&Mark as Patient Data"), (SCREENSHOT_REFUSE, "&Refuse Them")):
            action = self.screenshots_menu.addAction(text)
            action.setCheckable(True)
            group.addAction(action)
            action.triggered.connect(partial(c.boundary.set_screenshot_choice, choice))
            self.screenshot_actions[choice] = action
        self.addSeparator()
        self.show_action = self._add("Show Vault &Browser", c.window_show_browser, "vault.show_browser")
        c.state_changed.connect(self._on_controller_state_changed)
        state.shown_changed.connect(self._on_state_shown_changed)
        self._on_controller_state_changed()

    def _add(self, text: str, slot, shortcut_id: str | None = None, tip: str = "") -> QAction:
        action = QAction(text, self._owner)
        if shortcut_id:  # the keys come from the one table (app/services/shortcuts.py) Help lists
            set_shortcut(action, shortcut_id)
            self._add_window_action(action)  # shortcuts work while the menu is closed
        if tip:
            action.setStatusTip(tip)
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    def _on_new_action_triggered(self) -> None:
        """No vault yet: create it in the default place. One exists there: create the new one elsewhere."""
        c = self.controller
        if c.session.exists:
            folder = QFileDialog.getExistingDirectory(
                self._owner, "Choose an empty folder for the new vault", str(c.session.path.parent)
            )
            if not folder:
                return
            c.locking.set_vault_path(folder)
        c.locking.request_unlock()  # a folder without a vault: the dialog creates one

    def _on_lock_action_triggered(self) -> None:
        self.controller.locking.lock()

    def _on_save_action_triggered(self) -> None:
        self.controller.saving.save_entry()

    def _on_controller_state_changed(self) -> None:
        unlocked = self.controller.session.is_unlocked
        self.unlock_action.setEnabled(not unlocked)
        self.repair_action.setEnabled(not unlocked)  # repair unlocks the vault itself
        self.lock_action.setEnabled(unlocked)
        self.passphrase_action.setEnabled(unlocked)
        minutes = self.controller.session.auto_lock_minutes
        self.auto_lock_action.setText(
            f"&Auto-Lock After {minutes} min..." if minutes else "&Auto-Lock: Off..."
        )
        chosen = self.controller.boundary.screenshot_setting()
        for choice, action in self.screenshot_actions.items():
            action.setChecked(choice == chosen)
        self._on_state_shown_changed(self._state.shown)

    def _on_state_shown_changed(self, entry) -> None:
        self.save_action.setEnabled(self.controller.saving.can_save(entry))

    # -- the session list's context menu ----------------------------------------------------------

    def attach_session_list(self, list_widget) -> None:
        self._session_list = list_widget
        list_widget.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        list_widget.customContextMenuRequested.connect(self._on_session_menu_requested)

    def session_menu(self, entry) -> QMenu:
        menu = QMenu(self._session_list)
        action = menu.addAction(lock_icon(UNLOCKED_COLOUR, unlocked=True), "Save to Vault")
        action.setEnabled(self.controller.saving.can_save(entry))
        self._menu_entry = entry
        action.triggered.connect(self._on_session_save_triggered)
        return menu

    def _on_session_save_triggered(self) -> None:
        self.controller.saving.save_entry(self._menu_entry)

    def _on_session_menu_requested(self, pos) -> None:
        item = self._session_list.itemAt(pos)
        if item is None:
            return
        uid = item.data(Qt.ItemDataRole.UserRole)
        entry = next((e for e in self._state.volumes if e.uid == uid), None)
        if entry is not None:
            self.session_menu(entry).popup(self._session_list.viewport().mapToGlobal(pos))
