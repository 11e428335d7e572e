"""The vault of one main window: builds the pieces of ``app/vault`` around one ``VaultSession`` and gives each the
collaborators it calls; the browser, the menu and the tests call a piece directly
(``controller.locking.unlock(...)``, ``controller.listing.items``).

The pieces (each a module named for what it does, each an attribute of the controller named for it), lowest
first; a piece imports only pieces above it in this list, none imports the controller:

- ``session``: the open vault's state (folder, ``engine.vault.Vault``, unlocked or not); only ``locking``
  changes it;
- ``messages``: the information, warning and "already in the vault" boxes;
- ``tasks``: the background tasks that read or write the vault (their functions all live in
  ``app.core.vault_items``);
- ``listing``: the browser's model, the items matching the search;
- ``locking``: unlock, create, lock and the auto-lock after idle time; its ``locked`` signal tells the pieces
  below to drop what came from the vault;
- ``integrity``: Verify All, and the repair offered after a rollback (``locking.rolled_back``);
- ``opening``, ``importing``, ``exporting``, ``saving``: items into the session, scans in, items out to
  files, session volumes in;
- ``item_actions``: edit an item's details, compute its tissue maps, delete it; ``passphrase``: change the
  passphrase;
- ``boundary``: the ways a shown item could leave the vault (Save, Save As, screenshots) ask there.

Threads: every vault operation that reads or writes items runs in the app's one ``Worker``
(``Worker.reporting_call``), moved to a QThread by the app's ``JobRunner``; results come back to the GUI
thread as callbacks through bound methods (``app.vault.tasks`` says why). The vault serialises its own
operations, so the GUI thread never waits on its lock. Locking forgets the keys and the decrypted index, clears
the browser and closes the volumes opened from the vault; a result that arrives after a lock (an open that was
already decrypting) is dropped, since each task remembers the lock epoch it started in.

``engine.vault`` is imported on first use, not at start-up (it pulls in cryptography, nibabel, pydicom).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.services import AppServices
from app.vault.boundary import VaultBoundary
from app.vault.exporting import VaultExport
from app.vault.importing import NIFTI_FILTER, VaultImport
from app.vault.integrity import VaultIntegrity
from app.vault.item_actions import VaultItemActions
from app.vault.listing import VaultListing
from app.vault.locking import IDLE_CHECK_MS, VaultLocking
from app.vault.messages import VaultMessages
from app.vault.opening import VaultOpen
from app.vault.passphrase import VaultPassphrase
from app.vault.saving import VaultSave
from app.vault.session import DEFAULT_AUTO_LOCK_MIN, VaultSession
from app.vault.tasks import ERROR_TITLES, VaultTask, VaultTasks

__all__ = [
    "DEFAULT_AUTO_LOCK_MIN",
    "ERROR_TITLES",
    "IDLE_CHECK_MS",
    "NIFTI_FILTER",
    "VaultController",
    "VaultTask",
]


class VaultController(QObject):
    """The vault of one main window. Created by ``app.vault.install_vault(services, ...)``.

    Signals (GUI thread): ``state_changed()`` when locked/unlocked/moved, ``items_changed(list)`` with the
    listed ``ItemInfo`` s, ``task_ended(name, outcome)`` after each background task's thread ended
    (outcome ``finished``, ``failed`` or ``cancelled``), ``auto_lock_tick(seconds or None)`` once a second,
    ``volume_opened(VolumeEntry)`` after an item came into the session, ``show_browser_requested()`` when
    the Vault dock should show.

    Args:
        services: The app as a feature sees it; the vault uses its session (``state``), job runner, settings
            (vault folder, auto-lock minutes, remembered folders), status line, error dialog and ``parent``
            (the parent of the vault's dialogs, window-modal, whose Close event locks the vault). Each piece
            is given the ones it calls.
        clock: Monotonic clock in seconds, read through the vault for idle time (``session.clock``).
    """

    state_changed = Signal()
    items_changed = Signal(object)
    task_ended = Signal(str, str)
    auto_lock_tick = Signal(object)
    volume_opened = Signal(object)
    show_browser_requested = Signal()

    def __init__(self, services: AppServices, clock: Callable[[], float] | None = None) -> None:
        state, runner, settings = services.state, services.runner, services.settings
        show_status, show_error, parent = services.show_status, services.show_error, services.parent
        super().__init__(parent)
        self.remember_action: Any = None  # set by install_vault (app.vault.privacy)
        self.browser: Any = None  # set by install_vault, as the two below
        self.menu: Any = None
        self.status_button: Any = None
        self.session = VaultSession(settings, clock)
        self.messages = VaultMessages(parent)
        self.tasks = VaultTasks(
            runner,
            show_status,
            show_error,
            parent,
            changed=self.state_changed.emit,
            ended=self.task_ended.emit,
            failed_after=self._on_task_failed,
        )
        self.listing = VaultListing(self.session, self.tasks, changed=self.items_changed.emit)
        self.locking = VaultLocking(
            self.session,
            self.tasks,
            self.listing,
            self.messages,
            settings,
            show_status,
            show_error,
            parent,
            changed=self.state_changed.emit,
            tick=self.auto_lock_tick.emit,
            show_browser=self.window_show_browser,
        )
        self.integrity = VaultIntegrity(
            self.session, self.tasks, self.locking, self.messages, show_error, parent
        )
        self.opening = VaultOpen(
            self.session,
            self.tasks,
            self.listing,
            state,
            show_status,
            show_error,
            opened=self.volume_opened.emit,
        )
        self.importing = VaultImport(
            self.session,
            self.tasks,
            self.locking,
            self.listing,
            self.messages,
            settings,
            show_status,
            show_error,
            parent,
        )
        self.exporting = VaultExport(
            self.session, self.tasks, self.listing, self.messages, settings, show_status, parent
        )
        self.saving = VaultSave(
            self.session,
            self.tasks,
            self.locking,
            self.listing,
            self.messages,
            self.opening,
            self.importing,
            state,
            show_status,
            show_error,
        )
        self.item_actions = VaultItemActions(
            self.session, self.tasks, self.listing, self.opening, self.saving, state, show_status, parent
        )
        self.passphrase = VaultPassphrase(
            self.session, self.tasks, self.locking, self.messages, show_status, show_error, parent
        )
        self.boundary = VaultBoundary(
            self.session,
            self.tasks,
            self.exporting,
            settings,
            show_status,
            show_error,
            parent,
            changed=self.state_changed.emit,
        )
        # The vault locked: every piece drops its dialogs and what it was about to do, the volumes opened
        # from the vault leave the session and the browser empties.
        for forget in (
            self.importing.forget,
            self.exporting.forget,
            self.passphrase.forget,
            self.item_actions.forget,
            self.messages.forget_question,
            self.opening.close_opened,
            self.listing.clear,
        ):
            self.locking.locked.connect(forget)

    def window_show_browser(self) -> None:
        """Bring up the Vault dock (``install_vault`` connects ``show_browser_requested`` to it)."""
        self.show_browser_requested.emit()

    def _on_task_failed(self, task: VaultTask) -> None:
        self.locking.notice_locked_elsewhere(task)
