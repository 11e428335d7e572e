"""A session's recovery on app services, as the main window installs it: the bar, the controller over a
recovery folder, the next start of the app, and a session's clean exit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from PySide6.QtCore import Qt

from app.core.recovery import RecoveryStore
from app.core.session import AppState
from app.recovery.bar import RecoveryBar, RecoveryController, install_recovery
from app.services import AppServices


def open_session(services: AppServices, root: Path) -> RecoveryController:
    """A session's recovery over the folder ``root``: its bar above the rest, and the look for what a crashed
    or closed session left, as the main window does once it is shown."""
    bar = RecoveryBar()
    dock = services.add_dock(bar, "Recovery", Qt.DockWidgetArea.TopDockWidgetArea, name=f"recovery{id(bar)}")
    dock.show()
    recovery = install_recovery(services, RecoveryStore(root), bar)
    recovery.look_for_orphans()
    return recovery


def next_session(services: AppServices) -> AppServices:
    """The services of the next start of the app: a new, empty session on the same host and settings."""
    return dataclasses.replace(services, state=AppState())


def end_session(qtbot, services: AppServices, recovery: RecoveryController) -> None:
    """A clean exit, as closing the main window makes it: the writes end, then the recovery closes."""
    qtbot.waitUntil(lambda: not services.runner.jobs, timeout=30_000)
    recovery.close()
    recovery.bar.parentWidget().close()
