"""Compare Settings (Generate > Compare Settings..., Ctrl+Shift+G): two optimization settings, same seed, side by side.

``install_compare(services, ...)`` is the one call the main window makes: it adds the menu entry and the toolbar
button; the window itself is built the first time it is opened.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QWidget

from app.compare.window import CompareWindow
from app.core.compare_runs import ComparingBackend, difference_window
from app.core.measured_settings import MeasuredSettings
from app.services import AppServices
from app.services.shortcuts import set_shortcut

__all__ = [
    "CompareController",
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

    def open(self) -> CompareWindow:
        if self.window is None:
            self.window = self.make_window()
            self.window.resize(1400, 900)
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
        return self.window


def install_compare(
    services: AppServices,
    device_text: Callable[[str], str],
    cancel_action: QAction,
    measured: MeasuredSettings,
) -> CompareController:
    """Give the main window its Compare Settings entry in the Generate menu and on the main tool bar (right
    after ``cancel_action``, Generate's Cancel); ``device_text`` names a device as the Generate panel does
    and ``measured`` is what `volsynth tune` measured here."""
    parent = services.parent
    controller = CompareController(
        lambda: CompareWindow(services, device_text, measured, parent=parent), parent=parent
    )
    services.menus.add_window_action(controller.action)
    generate_menu, toolbar = services.menus.generate, services.menus.main_toolbar
    generate_menu.addSeparator()
    generate_menu.addAction(controller.action)
    actions = toolbar.actions()
    after = actions.index(cancel_action) + 1  # right after Generate and Cancel
    if after < len(actions):
        toolbar.insertAction(actions[after], controller.action)
    else:
        toolbar.addAction(controller.action)
    return controller
