"""The vault of one main window: owns the ``engine.vault.Vault`` and its state, and the pieces of
``app/vault`` that do its operations; the browser, the menu and the pieces themselves call a piece directly
(``controller.locking.unlock(...)``, ``controller.listing.items``).

The pieces (each a module named for what it does, each an attribute of the controller named for it):

- ``locking``: unlock, create, lock and the auto-lock after idle time;
- ``tasks`` (with ``worker`` and ``operations``): the background tasks that read or write the vault;
- ``listing``: the browser's model, the items matching the search;
- ``importing``, ``saving``, ``opening``, ``exporting``: scans in, session volumes in, items into the
  session, items out to files;
- ``item_actions``: edit an item's details, delete it; ``passphrase``: change the passphrase;
- ``boundary``: the ways a shown item could leave the vault (Save, Save As, screenshots) ask there;
- ``integrity``: Verify All, and the repair offered after a rollback;
- ``messages``: the information, warning and "already in the vault" boxes.

Threads: every vault operation that reads or writes items runs in the app's one ``Worker``
(``Worker.reporting_call``), moved to a QThread by the app's ``JobRunner``; results come back to the GUI
thread as callbacks through bound methods (``app.vault.tasks`` says why). The vault serialises its own operations, so the GUI thread never waits on its lock. Locking forgets the keys and the
decrypted index, clears the browser and closes the volumes opened from the vault; a result that arrives after
a lock (an open that was already decrypting) is dropped, since each task remembers the lock epoch it started
in.

``engine.vault`` is imported on first use, not at start-up (it pulls in cryptography, nibabel, pydicom).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

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
from app.vault.tasks import ERROR_TITLES, VaultTask, VaultTasks

__all__ = [
    "DEFAULT_AUTO_LOCK_MIN",
    "ERROR_TITLES",
    "IDLE_CHECK_MS",
    "NIFTI_FILTER",
    "VaultController",
    "VaultTask",
]

DEFAULT_AUTO_LOCK_MIN = 15  # engine.vault.DEFAULT_IDLE_TIMEOUT_S, without importing the vault at start-up


class VaultController(QObject):
    """The vault of one main window. Created by ``app.vault.install_vault(services, ...)``.

    Signals (GUI thread): ``state_changed()`` when locked/unlocked/moved, ``items_changed(list)`` with the
    listed ``ItemInfo`` s, ``task_ended(name, outcome)`` after each background task's thread ended
    (outcome ``finished``, ``failed`` or ``cancelled``), ``auto_lock_tick(seconds or None)`` once a second,
    ``volume_opened(VolumeEntry)`` after an item came into the session, ``show_browser_requested()`` when
    the Vault dock should show.

    Args:
        state: The app's session (``AppState``).
        runner: Starts workers in threads (``app.services.workers.JobRunner``).
        settings: The app's QSettings (vault folder, auto-lock minutes, remembered folders).
        show_status: ``(text, timeout_ms=0)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog.
        parent: Parent of the vault's dialogs (window-modal); its Close event locks the vault.
        clock: Monotonic clock in seconds, read through the vault for idle time (replaceable in tests).

    Attributes:
        kdf: Argon2id parameters for new passphrases; None is the engine's default (RFC 9106). Tests set
            small ones.
        clock: As above.
    """

    state_changed = Signal()
    items_changed = Signal(object)
    task_ended = Signal(str, str)
    auto_lock_tick = Signal(object)
    volume_opened = Signal(object)
    show_browser_requested = Signal()

    def __init__(
        self,
        *,
        state,
        runner,
        settings,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
        parent: QWidget | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(parent)
        self.settings = settings
        self.clock = clock or time.monotonic
        self.kdf = None
        self.vault = None
        self.unlocked = False
        self._path: Path | None = None
        self.remember_action = None  # set by install_vault (app.vault.privacy)
        self.browser = self.menu = self.status_button = None  # set by install_vault
        self.tasks = VaultTasks(
            runner,
            show_status,
            show_error,
            parent,
            changed=self.state_changed.emit,
            ended=self.task_ended.emit,
            failed_after=self._on_task_failed,
        )
        self.messages = VaultMessages(parent)
        self.locking = VaultLocking(self, settings, show_status, show_error, parent)
        self.listing = VaultListing(self)
        self.importing = VaultImport(self, settings, show_status, show_error, parent)
        self.opening = VaultOpen(self, state, show_status, show_error)
        self.saving = VaultSave(self, state, show_status, show_error)
        self.exporting = VaultExport(self, settings, show_status, parent)
        self.item_actions = VaultItemActions(self, state, show_status, parent)
        self.passphrase = VaultPassphrase(self, show_status, show_error, parent)
        self.integrity = VaultIntegrity(self, show_error, parent)
        self.boundary = VaultBoundary(self, settings, show_status, show_error, parent)

    # -- state ---------------------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The vault folder: the ``vault/path`` setting, else ``engine.vault.default_vault_path()``."""
        if self._path is None:
            saved = self.settings.value("vault/path", "", type=str)
            if saved:
                self._path = Path(saved).expanduser()
            else:
                from engine.vault import default_vault_path

                self._path = default_vault_path()
        return self._path

    @property
    def exists(self) -> bool:
        from engine.vault import Vault

        return Vault.exists(self.path)

    @property
    def is_unlocked(self) -> bool:
        return self.unlocked

    @property
    def auto_lock_minutes(self) -> int:
        """Minutes without activity before the vault locks itself; 0 never."""
        return max(0, self.settings.value("vault/auto_lock_minutes", DEFAULT_AUTO_LOCK_MIN, type=int))

    def set_auto_lock_minutes(self, minutes: int) -> None:
        minutes = max(0, int(minutes))
        self.settings.setValue("vault/auto_lock_minutes", minutes)
        if self.vault is not None:
            self.vault.idle_timeout_s = minutes * 60.0 if minutes else None
        self.state_changed.emit()

    def idle_timeout_s(self) -> float | None:
        minutes = self.auto_lock_minutes
        return minutes * 60.0 if minutes else None

    def now(self) -> float:
        """The vault's idle clock: ``clock``, read at each call (tests replace it)."""
        return self.clock()

    def set_vault_path(self, path: str | Path) -> None:
        """Use the vault in ``path`` (locking the current one); remembered in the settings."""
        path = Path(path).expanduser()
        if self.unlocked:
            self.locking.lock()
        self._path = path
        self.vault = None
        self.settings.setValue("vault/path", str(path))
        self.state_changed.emit()

    def window_show_browser(self) -> None:
        """Bring up the Vault dock (``install_vault`` connects ``show_browser_requested`` to it)."""
        self.show_browser_requested.emit()

    def forget_unlocked(self) -> None:
        """The vault locked: every piece drops its dialogs and what it was about to do, the volumes opened
        from the vault leave the session and the browser empties."""
        self.importing.forget()
        self.exporting.forget()
        self.passphrase.forget()
        self.item_actions.forget()
        self.messages.forget_question()
        self.opening.close_opened()
        self.listing.clear()

    def _on_task_failed(self, task: VaultTask) -> None:
        self.locking.notice_locked_elsewhere(task)
