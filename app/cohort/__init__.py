"""Cohort (Generate > Cohort..., Ctrl+Shift+H): many volumes from one spec, on Ray, as a BIDS dataset.

``install_cohort(services)`` is the one call the main window makes: it adds the menu entry; the dialog is built
the first time it is opened, from the generation form's model and settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtGui import QAction

from app.services import AppServices
from app.services.shortcuts import set_shortcut

if TYPE_CHECKING:  # the dialog (numpy, the engine's cohort module) is imported when first opened
    from app.cohort.dialog import CohortDialog

__all__ = ["CohortController", "install_cohort"]


class CohortController:
    """Owns the Cohort dialog of one main window (``services.parent``): the form it starts from, the runner, and
    where a finished volume is opened (``services.open_path``)."""

    def __init__(self, services: AppServices) -> None:
        self.services = services
        self.dialog: CohortDialog | None = None
        self.action = set_shortcut(QAction("Co&hort...", services.parent), "generate.cohort")
        self.action.setStatusTip(
            "Generate many volumes over a grid or distribution of conditions, on this computer or a Ray "
            "cluster, as a BIDS dataset"
        )
        self.action.triggered.connect(self.open)

    def open(self) -> CohortDialog:
        from app.cohort.dialog import CohortDialog

        if self.dialog is None:
            self.dialog = CohortDialog(self.services, self.services.parent)
            self.dialog.resize(1000, 760)
        self.dialog.show()
        self.dialog.raise_()
        self.dialog.activateWindow()
        return self.dialog


def install_cohort(services: AppServices) -> CohortController:
    """Give the main window its Generate > Cohort... entry."""
    controller = CohortController(services)
    services.menus.add_window_action(controller.action)
    services.menus.generate.addAction(controller.action)
    return controller
