"""What the app remembers about files, and how to make it forget (PHI hygiene, issue 18).

File and folder names often carry patient names, and the app's settings file is plain text. The settings
that hold paths are listed in :data:`PATH_KEYS` (and in docs/vault.md's privacy section). With
"Remember Recent Files and Folders" switched off (Vault menu), none of them is kept: the recent-files list
stays empty and the remembered folders are removed (at once, and again when the window closes, since the
main window notes the last folder of its own Open and Save dialogs as it goes).

Items opened from the vault never enter the recent-files list: they are decrypted into memory and have no
path (``VolumeEntry.path is None``), and :class:`PrivateRecentFiles` records no path-less entry.

Core dumps: :func:`protect_process` turns them off (``engine.vault.core_dumps``) before a vault passphrase is
typed; it stays off for the rest of the app's life (decrypted data can outlive a lock in freed memory).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from PySide6.QtGui import QAction

from app.core.session import RecentFiles

REMEMBER_KEY = "privacy/remember_recent"
#: Settings that hold a file or folder path (besides ``vault/path``, the vault's own folder).
PATH_KEYS = (
    "files/recent",
    "files/last_dir",
    "files/last_save_dir",
    "vault/last_import_dir",
    "vault/last_export_dir",
    "compare/csv_dir",
)


def remember_recent(settings) -> bool:
    """Whether the app may remember recent files and the last folders of its dialogs (default: yes)."""
    return settings.value(REMEMBER_KEY, True, type=bool)


def forget_paths(settings) -> None:
    """Remove every remembered file and folder path from the settings (see :data:`PATH_KEYS`)."""
    for key in PATH_KEYS:
        settings.remove(key)
    settings.sync()


def last_dir(settings, key: str) -> str:
    """Where a file dialog starts: the folder last used for it (if remembering is on), else home."""
    if remember_recent(settings):
        saved = settings.value(key, "", type=str)
        if saved and Path(saved).is_dir():
            return saved
    return str(Path.home())


def remember_dir(settings, key: str, folder: Path) -> None:
    """Note ``folder`` as where the ``key`` dialog starts next time, if remembering is on."""
    if remember_recent(settings):
        settings.setValue(key, str(folder))


class PrivateRecentFiles(RecentFiles):
    """``RecentFiles`` that records nothing while remembering is off, and nothing without a path (a vault
    item decrypted into memory).

    Args:
        paths: Initial paths (most recent first).
        enabled: Remember paths at all.
    """

    def __init__(self, paths=(), *, enabled: bool = True) -> None:
        self.enabled = True
        super().__init__(paths)
        self.enabled = enabled
        if not enabled:
            self.clear()

    def add(self, path) -> None:
        if not self.enabled or path is None or str(path) == "":
            return
        super().add(path)

    def clear(self) -> None:
        for path in self.paths():
            self.remove(path)


def protect_process() -> str:
    """Core dumps off for this process (``engine.vault.core_dumps.disable_core_dumps``); returns why not, if not."""
    from engine.vault import core_dumps as privacy

    return privacy.disable_core_dumps().reason


def install_privacy(
    settings,
    state,
    menu,
    *,
    parent,
    show_status: Callable[..., None],
    rebuild_recent_menu: Callable[[], None] | None = None,
) -> QAction:
    """Put the private recent-files list into the session ``state`` and a "Remember Recent Files and
    Folders" toggle into ``menu``. Call before the window restores its settings (``install_vault`` does).

    Args:
        settings: The app's QSettings.
        state: The session (``AppState``) whose ``recent`` list becomes a ``PrivateRecentFiles``; None: none.
        menu: Where the toggle goes (the Vault menu).
        parent: Owner of the toggle's QAction (the window).
        show_status: ``(text, timeout_ms)``, the window's status line.
        rebuild_recent_menu: Rebuilds the File menu's Open Recent after the list was cleared, if any.
    """
    enabled = remember_recent(settings)
    if state is not None and hasattr(state, "recent"):
        state.recent = PrivateRecentFiles(state.recent.paths(), enabled=enabled)
    if not enabled:
        forget_paths(settings)
    action = QAction("Remember Recent Files and Folders", parent)
    action.setCheckable(True)
    action.setChecked(enabled)
    action.setStatusTip(
        "Keep the recent-files list and the last folders of the file dialogs (their names may name patients)"
    )
    action.toggled.connect(partial(_on_remember_toggled, settings, state, show_status, rebuild_recent_menu))
    menu.addAction(action)
    return action


def _on_remember_toggled(settings, state, show_status, rebuild_recent_menu, checked: bool) -> None:
    settings.setValue(REMEMBER_KEY, bool(checked))
    recent = getattr(state, "recent", None)
    if isinstance(recent, PrivateRecentFiles):
        recent.enabled = bool(checked)
        if not checked:
            recent.clear()
    if not checked:
        forget_paths(settings)
        settings.setValue(REMEMBER_KEY, False)
        if callable(rebuild_recent_menu):  # the File menu's Open Recent
            rebuild_recent_menu()
        show_status("Recent files and folders forgotten; nothing new will be remembered", 6000)
