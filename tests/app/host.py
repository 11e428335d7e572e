"""The plain window the ``app_services`` fixture hosts a feature in, in place of the main window.

Defined once, at module level: a Qt class is made once per process, not once per test."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QMainWindow


class Host(QMainWindow):
    """Menus, tool bars, docks and a status bar for the feature under test; ``volume_opened`` as the main window's."""

    volume_opened = Signal(object)
