"""What a feature gets from the main window: ``AppServices``, built once by the window after its menus exist
and handed to every ``install_X(services, ...)``; and the services themselves, below the features: the
job runner, the backend pool and the one worker (``workers``), the one shortcut table Help lists
(``shortcuts``), and the telemetry sources the Metrics dock switches between (``metrics_sources``).

A feature reads the app through these typed fields only; it neither keeps nor reads the main window. The one
field that is the window itself, ``parent``, is there as the Qt parent of the feature's actions, dialogs and
helper objects (so they close with the window and its shortcuts reach them); nothing is read off it
(packaging/structure_report.py counts any read that comes back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QSettings, SignalInstance
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDockWidget, QMenu, QMenuBar, QToolBar, QWidget

from app.core.session import AppState
from app.services.metrics_sources import MetricsSources
from app.services.workers import BackendPool, JobRunner

__all__ = ["AddDock", "AppServices", "WindowMenus"]

AddDock = Callable[..., QDockWidget]  # (widget, title, area, name=, tabify_with=) -> the dock


@dataclass(frozen=True)
class WindowMenus:
    """The main window's menus and tool bars that features add their entries to."""

    menu_bar: QMenuBar  # a feature's own menu goes before Help (the Vault menu)
    generate: QMenu  # Generate: the window's own entries first, then each feature's
    view: QMenu
    main_toolbar: QToolBar  # Open, Save, Generate, Cancel
    open_model_action: QAction  # Generate > Open Model Folder... (Get Models... follows it)
    # Makes an action's keys work anywhere in the main window, whatever menu it is in.
    add_window_action: Callable[[QAction], None]
    # Tool bars across the top, after the others, each kept on a row it fits.
    add_fitted_tool_bars: Callable[..., None]


@dataclass(frozen=True)
class AppServices:
    """The app as a feature sees it (see the module's docstring)."""

    state: AppState  # the session: the Generate form, the volumes, the display
    # Every background job goes through it; a job the user watches through ``run`` (its progress and Cancel,
    # the one error dialog, the busy mark), a look-up or a write nobody watches through ``run_task``.
    runner: JobRunner
    backends: BackendPool  # the backend of each device
    settings: QSettings  # the app's remembered settings
    telemetry: MetricsSources  # what the Metrics dock shows: this machine's sampler or a server's feed
    show_status: Callable[..., None]  # (text, timeout_ms=0) in the status bar
    show_error: Callable[[str, str], None]  # (title, message) in a dialog
    show_device: Callable[[str], None]  # the status bar's device field
    add_status_widget: Callable[[QWidget], None]  # a permanent widget at the right of the status bar
    add_dock: AddDock  # a dock listed under View > Panels, its place remembered
    open_path: Callable[[str | Path], None]  # read a NIfTI into the session (in the background)
    open_model_folder: Callable[[str | Path], bool]  # a model folder into the picker, selected
    volume_opened: SignalInstance  # (VolumeEntry) a volume was opened into the session
    menus: WindowMenus
    parent: QWidget  # the main window, only as the Qt parent of a feature's objects
