"""Compare Settings (Generate > Compare Settings..., Ctrl+Shift+G): two optimization settings, same seed, side by side.

``install_compare(window)`` is the one call the main window makes: it adds the menu entry and the toolbar
button; the window itself is built the first time it is opened.
"""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence

from app.compare.window import CompareWindow, ComparingBackend, difference_window

__all__ = ["CompareController", "CompareWindow", "ComparingBackend", "difference_window", "install_compare"]


class CompareController:
    """Owns the Compare Settings window of one main window."""

    def __init__(self, window) -> None:
        self.main = window
        self.window: CompareWindow | None = None
        self.action = QAction("C&ompare Settings...", window)
        self.action.setShortcut(QKeySequence("Ctrl+Shift+G"))
        self.action.setStatusTip(
            "Run the Generate panel's request with two optimization settings and compare "
            "volumes, speed, memory and kernels"
        )
        self.action.triggered.connect(self.open)
        window.addAction(self.action)

    def open(self) -> CompareWindow:
        if self.window is None:
            self.window = CompareWindow(self.main)
            self.window.resize(1400, 900)
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
        return self.window


def install_compare(window) -> CompareController:
    """Give ``window`` (a ``MainWindow``) its Compare Settings entry in the Generate menu and the toolbar."""
    controller = CompareController(window)
    window.generate_menu.addSeparator()
    window.generate_menu.addAction(controller.action)
    actions = window.main_toolbar.actions()
    after = actions.index(window.cancel_action) + 1  # right after Generate and Cancel
    window.main_toolbar.insertAction(actions[after] if after < len(actions) else None, controller.action)
    return controller
