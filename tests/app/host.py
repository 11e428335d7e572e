"""The plain window the ``app_services`` fixture hosts a feature in, in place of the main window.

Defined once, at module level, not inside the fixture: made anew for every test, each class (with its own
meta-object and signal) was left to the garbage collector, and a test process crashed once in a collection (a
segmentation fault during an unrelated wait, in a test on this fixture). It was the only Qt class the tests made
anew for every test; whether it was the cause is not proven."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QMainWindow


class Host(QMainWindow):
    """Menus, tool bars, docks and a status bar for the feature under test; ``volume_opened`` as the main window's."""

    volume_opened = Signal(object)
