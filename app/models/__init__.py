"""Getting real models: Generate > Get Models... (the catalogue, licences, resumable downloads, Verify and
Remove), and the model picker kept to the model folders that exist (``ModelFolderWatch``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction

from app.models.get_models_dialog import GetModelsDialog
from app.models.model_folders import ModelFolderWatch, drop_models_in
from app.services import AppServices


class GetModelsController(QObject):
    """Owns the menu entry and the one dialog (kept, so a download in progress survives closing it)."""

    def __init__(
        self,
        make_dialog: Callable[[], GetModelsDialog],
        parent: QObject | None = None,
        folder_watch: ModelFolderWatch | None = None,
    ) -> None:
        super().__init__(parent)
        self.make_dialog = make_dialog
        self.dialog: GetModelsDialog | None = None
        self.folder_watch = folder_watch
        self.action = QAction("Get Mo&dels...", parent)
        self.action.setObjectName("get_models_action")
        tip = "Fetch NVIDIA's NV-Generate-MR-Brain or MONAI's brain LDM from their hubs, with their licences"
        self.action.setStatusTip(tip)
        self.action.setToolTip(tip)
        self.action.triggered.connect(self._on_action_triggered)

    def open(self) -> GetModelsDialog:
        if self.dialog is None:
            self.dialog = self.make_dialog()
        self.dialog.show()
        self.dialog.raise_()
        self.dialog.activateWindow()
        return self.dialog

    def _on_action_triggered(self) -> None:
        self.open()


def install_get_models(services: AppServices, models_dir: Path | None = None) -> GetModelsController:
    """Give the main window Generate > Get Models..., right after Open Model Folder; a model installed is
    opened into the model picker, selected; one removed leaves it, as does any model whose folder is deleted."""
    parent = services.parent
    state = services.state

    def on_removed(folder: Path) -> None:
        drop_models_in(state, folder)

    controller = GetModelsController(
        lambda: GetModelsDialog(parent, services.runner, services.open_model_folder, models_dir, on_removed),
        parent=parent,
        folder_watch=ModelFolderWatch(state, parent),
    )
    menu, open_model_action = services.menus.generate, services.menus.open_model_action
    actions = menu.actions()
    after = actions.index(open_model_action) + 1 if open_model_action in actions else len(actions)
    if after < len(actions):
        menu.insertAction(actions[after], controller.action)
    else:
        menu.addAction(controller.action)
    return controller
