"""Cohort (Generate > Cohort..., Ctrl+Shift+H): many volumes from one spec, on Ray, as a BIDS dataset.

``install_cohort(window)`` is the one call the main window makes: it adds the menu entry; the dialog is built
the first time it is opened, from the generation form's model and settings.
"""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence

__all__ = ["CohortController", "install_cohort"]


class CohortController:
    """Owns the Cohort dialog of one main window."""

    def __init__(self, window) -> None:
        self.main = window
        self.dialog = None
        self.action = QAction("Co&hort...", window)
        self.action.setShortcut(QKeySequence("Ctrl+Shift+H"))
        self.action.setStatusTip(
            "Generate many volumes over a grid or distribution of conditions, on this computer or a Ray "
            "cluster, as a BIDS dataset"
        )
        self.action.triggered.connect(self.open)
        window.addAction(self.action)

    def open(self):
        from app.cohort.dialog import CohortDialog

        if self.dialog is None:
            self.dialog = CohortDialog(self.main)
            self.dialog.resize(1000, 760)
        self.dialog.show()
        self.dialog.raise_()
        self.dialog.activateWindow()
        return self.dialog


def install_cohort(window) -> CohortController:
    """Give ``window`` (a ``MainWindow``) its Generate > Cohort... entry."""
    controller = CohortController(window)
    window.generate_menu.addAction(controller.action)
    return controller
