"""The model picker follows the model folders on disk: a folder deleted (by Get Models' Remove, a file manager,
a script) leaves the picker at once.

Each local model's folder and the folder holding it are watched (``QFileSystemWatcher``: inotify on Linux);
any change there re-checks which models' folders are still there. Some file systems (network shares) send no
notifications, so the same check runs whenever the application becomes active again, which is when a person
who deleted a folder elsewhere comes back to it.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QFileSystemWatcher, QObject, Qt
from PySide6.QtGui import QGuiApplication

from app.core.session import AppState


def local_folder(source) -> Path | None:
    """The folder a model was opened from, or None for a model that has none here (an engine server's)."""
    path = getattr(source, "path", None)
    return path if isinstance(path, Path) else None


def drop_models_in(state: AppState, folder: Path) -> list:
    """Take the models opened from ``folder`` out of the session's list; returns them."""
    gone = [s for s in state.models if (path := local_folder(s)) is not None and _same(path, folder)]
    if gone:
        state.remove_models(gone)
    return gone


def _same(a: Path, b: Path) -> bool:
    return a == b or a.absolute() == b.absolute()


class ModelFolderWatch(QObject):
    """Keeps ``state.models`` to the local models whose folders exist."""

    def __init__(self, state: AppState, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.watcher = QFileSystemWatcher(self)
        self.watcher.directoryChanged.connect(self._on_watcher_directory_changed)
        state.models_changed.connect(self._on_state_models_changed)
        app = QGuiApplication.instance()
        if isinstance(app, QGuiApplication):
            app.applicationStateChanged.connect(self._on_application_state_changed)
        self._on_state_models_changed()

    def prune(self) -> list:
        """Drop the models whose folders are gone; returns them."""
        gone = [s for s in self.state.models if (path := local_folder(s)) is not None and not path.is_dir()]
        if gone:
            self.state.remove_models(gone)
        return gone

    def _on_state_models_changed(self) -> None:
        wanted = set()
        for source in self.state.models:
            folder = local_folder(source)
            if folder is not None and folder.is_dir():
                wanted |= {str(folder), str(folder.parent)}
        watched = set(self.watcher.directories())
        if watched - wanted:
            self.watcher.removePaths(sorted(watched - wanted))
        if wanted - watched:
            self.watcher.addPaths(sorted(wanted - watched))

    def _on_watcher_directory_changed(self, _path: str) -> None:
        self.prune()

    def _on_application_state_changed(self, application_state: Qt.ApplicationState) -> None:
        if application_state == Qt.ApplicationState.ApplicationActive:
            self.prune()
