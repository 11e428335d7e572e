"""Compare Settings (Generate > Compare Settings..., Ctrl+Shift+G): two optimization settings, same seed, side by side.

``install_compare(window)`` is the one call the main window makes: it adds the menu entry and the toolbar
button; the window itself is built the first time it is opened.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QWidget

from app.compare.window import CompareServices, CompareWindow, ComparingBackend, difference_window
from app.shortcuts import set_shortcut

__all__ = [
    "CompareController",
    "CompareServices",
    "CompareWindow",
    "ComparingBackend",
    "difference_window",
    "install_compare",
]


class CompareController:
    """Owns the Compare Settings window of one main window; ``make_window()`` builds it on first use."""

    def __init__(self, make_window: Callable[[], CompareWindow], parent: QWidget) -> None:
        self.make_window = make_window  # builds a new window (open() keeps the one it built)
        self.window: CompareWindow | None = None
        self.action = set_shortcut(QAction("C&ompare Settings...", parent), "generate.compare")
        self.action.setStatusTip(
            "Run the Generate panel's request with two optimization settings and compare "
            "volumes, speed, memory and kernels"
        )
        self.action.triggered.connect(self.open)
        parent.addAction(self.action)

    def open(self) -> CompareWindow:
        if self.window is None:
            self.window = self.make_window()
            self.window.resize(1400, 900)
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
        return self.window


def install_compare(window) -> CompareController:
    """Give ``window`` (a ``MainWindow``) its Compare Settings entry in the Generate menu and the toolbar."""
    services = CompareServices(
        state=window.state,
        runner=window.runner,
        backends=window.backends,
        settings=window.settings,
        show_status=window.show_status,
        show_error=window.show_error,
        device_text=window.generation.device_text,
        measured=window.measured_settings,
    )
    controller = CompareController(lambda: CompareWindow(services, parent=window), parent=window)
    window.generate_menu.addSeparator()
    window.generate_menu.addAction(controller.action)
    actions = window.main_toolbar.actions()
    after = actions.index(window.cancel_action) + 1  # right after Generate and Cancel
    window.main_toolbar.insertAction(actions[after] if after < len(actions) else None, controller.action)
    return controller
