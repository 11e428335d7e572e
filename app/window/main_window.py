"""The main window: viewer in the centre, generation panel and session list in docks, menus, status bar.

Each feature is wired by one ``install_X(services, ...)`` call: ``services`` is the window's ``AppServices``
(app/services: the ``AppState``, the ``JobRunner``, ``show_status``, the menus a feature adds to...), built
once after the menus exist; the feature-specific widgets and the other features' objects it talks to are
passed beside it. No feature keeps or reads the window. Adding a dock (metrics, vault browser, comparison)
is one call: ``services.add_dock(widget, "Metrics", Qt.DockWidgetArea.RightDockWidgetArea)``; it appears
under View > Panels and its place is saved with the window state. Work that takes time goes through
``services.runner.run`` (app/services/workers.py), which shows the job and its Cancel. The menus and tool
bars are built in app/window/menus.py (returned as typed objects the window keeps), the status bar in
app/window/status_bar.py, the file commands in app/window/volume_files.py and the remembered settings in
app/window/settings.py.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import cast

from PySide6.QtCore import QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QMainWindow,
    QMenu,
    QMessageBox,
    QVBoxLayout,
    QWidget,
)

from app.cohort import install_cohort
from app.compare import install_compare
from app.core.measured_settings import MeasuredSettings
from app.core.recovery import RecoveryStore
from app.core.session import AppState
from app.docks.metrics_dock import MetricsDock
from app.generation import install_generation
from app.generation.tuning import install_tuning
from app.models import install_get_models
from app.panels.dock_width import widen_dock
from app.panels.optimization_panel import install_optimization_panel
from app.panels.sampling_panel import SamplingPanel
from app.panels.session_panel import SessionPanel
from app.recovery.bar import RecoveryBar, install_recovery
from app.remote import install_remote
from app.services import AppServices
from app.services.metrics_sources import MetricsSources
from app.services.workers import BackendPool, JobRunner
from app.vault import install_vault
from app.viewer.viewer_area import ViewerArea
from app.widgets.eliding_status_bar import ElidingStatusBar
from app.window.about import AboutDialog
from app.window.menus import (
    add_generation_actions,
    build_actions,
    build_menus,
    build_viewer_bars,
    sync_view_menu,
    sync_window_presets,
)
from app.window.settings import FORM_KEY, restore_window_settings, save_form, save_window_settings
from app.window.status_bar import WindowStatus
from app.window.volume_files import NIFTI_FILTER, VolumeFiles

__all__ = ["FORM_KEY", "NIFTI_FILTER", "AboutDialog", "MainWindow", "default_settings"]

log = logging.getLogger(__name__)

TELEMETRY_START_DELAY_MS = (
    500  # the sampler starts this long after the window is shown, off the start-up path
)


class _Preloader(QObject):
    """Imports pyvista/VTK (and torch) in a background thread; ``loaded`` arrives in the GUI thread."""

    loaded = Signal(float)

    def start(self, modules: tuple[str, ...]) -> None:
        thread = threading.Thread(target=self._run, args=(modules,), name="volsynth-preload", daemon=True)
        thread.start()

    def _run(self, modules: tuple[str, ...]) -> None:
        started = time.perf_counter()
        import importlib

        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - the view shows what is missing later
                log.warning("preloading %s failed: %s", name, exc)
        self.loaded.emit(time.perf_counter() - started)


class MainWindow(QMainWindow):
    """VolSynth Studio's main window.

    Args:
        registry: where models are listed from (``engine.models.registry.ModelRegistry()`` by default).
        settings: the QSettings to read and write (the application's by default).
        enable_3d: create the 3D view (needs OpenGL); tests of the slice views can switch it off.
        preload_torch: import torch in the background after start so the first Generate is quicker.
        sampler: the ``engine.telemetry`` source the Metrics dock shows; by default a ``Sampler`` of this
            machine, created and started after the window is shown. The window stops it when it closes.
    """

    volume_opened = Signal(object)
    view3d_ready = Signal()

    def __init__(
        self,
        registry=None,
        settings: QSettings | None = None,
        enable_3d: bool = True,
        preload_torch: bool = True,
        sampler=None,
        recovery: RecoveryStore | None = None,
    ) -> None:
        # One linear build, in dependency order (docks, status bar, generation, menus, features, settings):
        # splitting it would hide the order each install_X relies on.
        super().__init__()
        self.setWindowTitle("VolSynth Studio")
        self.setObjectName("VolSynthMainWindow")
        self.setAcceptDrops(True)
        self.settings = settings or QSettings()
        if registry is None:
            from engine.models.registry import ModelRegistry

            registry = ModelRegistry()
        self.registry = registry
        self.state = AppState()
        # Every background job; the ones a user watches end in the window's one error dialog or status line.
        self.runner = JobRunner(
            self,
            show_error=self.show_error,
            show_status=self.show_status,
            hold_engine=self.state.set_job_running,
        )
        self.backends = BackendPool(registry)
        self.docks: dict[str, QDockWidget] = {}
        self.panels_menu: QMenu | None = None  # View > Panels, once the menus are built
        self.errors_shown: list[str] = []

        self.viewer = ViewerArea(self.state)
        self.recovery_bar = RecoveryBar()
        central = QWidget()
        central_layout = QVBoxLayout(central)
        central_layout.setContentsMargins(0, 0, 0, 0)
        central_layout.setSpacing(4)
        central_layout.addWidget(self.recovery_bar)
        central_layout.addWidget(self.viewer, 1)
        self.setCentralWidget(central)
        self.sampling_panel = SamplingPanel(self.state)
        self.session_panel = SessionPanel(self.state)
        self.add_dock(
            self.sampling_panel, "Generate", Qt.DockWidgetArea.LeftDockWidgetArea, name="generateDock"
        )
        self.add_dock(
            self.session_panel, "Session", Qt.DockWidgetArea.RightDockWidgetArea, name="sessionDock"
        )
        self.metrics_dock = MetricsDock(sampler)
        self.add_dock(
            self.metrics_dock,
            "Metrics",
            Qt.DockWidgetArea.RightDockWidgetArea,
            name="metricsDock",
            tabify_with="sessionDock",
        )
        # This machine's sampler (made after the window shows) or an engine server's feed (app/remote).
        self.telemetry = MetricsSources(self.metrics_dock, sampler, lambda: self.state.form.device)

        # A message too long for the room beside the fields ends in "…" (whole in the tooltip).
        self.setStatusBar(ElidingStatusBar())
        self.status = WindowStatus(self.statusBar())
        self.readout_label, self.device_label = self.status.readout_label, self.status.device_label
        self.space_label, self.voxel_label = self.status.space_label, self.status.voxel_label
        self.statusBar().addPermanentWidget(
            self.runner.activity
        )  # the busy mark: what runs in the background
        self.files = VolumeFiles(
            self.state,
            self.runner,
            self.settings,
            show_status=self.show_status,
            show_error=self.show_error,
            volume_opened=self.volume_opened.emit,
            parent=self,
        )
        self.window_actions = build_actions(self)
        menu_bar = build_menus(self, self.window_actions)
        self.panels_menu, self.help = menu_bar.panels, menu_bar.help
        self.intended_use_notice = menu_bar.intended_use_notice
        menus = menu_bar.for_features
        # What every feature is installed with (app/services): it reads the app through it, not the window.
        self.services = AppServices(
            state=self.state,
            runner=self.runner,
            backends=self.backends,
            settings=self.settings,
            telemetry=self.telemetry,
            show_status=self.show_status,
            show_error=self.show_error,
            show_device=self.status.show_device,
            add_status_widget=self.statusBar().addPermanentWidget,
            add_dock=self.add_dock,
            open_path=self.open_path,
            open_model_folder=self.open_model_folder,
            volume_opened=self.volume_opened,
            menus=menus,
            parent=self,
        )
        # Generate, Cancel, Random Seed and the run lifecycle (progress, previews, telemetry marks).
        self.generation = install_generation(self.services, self.sampling_panel, self.metrics_dock)
        add_generation_actions(menus, self.generation)
        viewer_bars = build_viewer_bars(self.viewer, self.services, self.window_actions.reset_camera)
        self.viewer_toolbar, self.tissue_maps = viewer_bars.toolbar, viewer_bars.tissue_maps
        self.tissue_toolbar = self.viewer_toolbar.tissue_toolbar  # the tissue overlay: on/off, map, opacity
        self.viewer.layout_changed.connect(self._on_viewer_layout_changed)
        self.state.overlay_changed.connect(self._on_state_overlay_changed)
        self.state.display_changed.connect(self.sync_view_menu)
        # Vault dock, menu and auto-lock (app/vault)
        self.vault_controller = install_vault(
            self.services, self.session_panel.list, self.files.rebuild_recent_menu
        )
        self.files.vault_boundary = self.vault_controller.boundary  # a vault item's Save asks it
        # What `volsynth tune` measured here for the selected model: the presets are a view of it.
        self.measured_settings = MeasuredSettings()
        self.optimization_panel = install_optimization_panel(
            self.services, self.sampling_panel, self.generation.about_to_start, self.measured_settings
        )
        # Generate > Measure Settings on This Machine: the measurement, in the background.
        self.tuning = install_tuning(self.services, self.optimization_panel, self.measured_settings)
        # Generate > Compare Settings: two settings side by side
        self.compare = install_compare(
            self.services, self.generation.device_text, self.generation.cancel_action, self.measured_settings
        )
        # Generate > Connect to Engine Server: remote devices (app/remote)
        self.remote = install_remote(self.services, self.sampling_panel)
        self.cohort = install_cohort(self.services)  # Generate > Cohort...: many volumes on Ray (app/cohort)
        # Generate > Get Models...: real models from their hubs
        self.get_models = install_get_models(self.services)
        # Generated volumes are kept on disk until removed or a clean exit; a crashed session's come back.
        self.recovery = install_recovery(self.services, recovery or RecoveryStore(), self.recovery_bar)
        # Quitting without closing the window (app.quit(), a session logout) is still a clean exit.
        self._quit_hook = cast(QApplication, QApplication.instance()).aboutToQuit.connect(self.recovery.close)
        self._looked_for_orphans = False

        self.sampling_panel.open_model_requested.connect(self.open_model_folder_dialog)
        self.sampling_panel.width_wanted.connect(self._on_sampling_panel_width_wanted)
        self.session_panel.save_requested.connect(self.save_file_dialog)
        for view in self.viewer.slice_views:
            view.hovered.connect(self._on_view_hovered)
        self.viewer.view3d.shot_button.clicked.connect(self.save_3d_screenshot_dialog)
        self.state.status.connect(self.show_status)
        self.state.crosshair_changed.connect(self._on_state_crosshair_changed)
        self.state.window_changed.connect(self._on_state_window_changed)
        self.state.shown_changed.connect(self._on_state_shown_changed)
        self.state.volumes_changed.connect(self._update_title)  # a rename or a save changes the title
        self.state.form.changed.connect(self._on_form_changed)

        restore_window_settings(self)
        self._load_models()
        # From here on every edit of the form is on disk at once: a crash (even kill -9) keeps what was
        # typed. Connected after the start-up's own selections, which must not overwrite the saved form.
        self.state.form.changed.connect(self._on_form_changed_save)

        self._enable_3d = enable_3d
        self._preloader = _Preloader(self)
        self._preloader.loaded.connect(self._on_preloader_loaded)
        modules = (("pyvista", "pyvistaqt") if enable_3d else ()) + (("torch",) if preload_torch else ())
        if modules:
            self._preloader.start(modules)
        if preload_torch:
            self.runner.run_task("devices", _list_devices, finished=self._on_devices_listed)

    @property
    def sampler(self):
        """This machine's telemetry sampler; None until the telemetry starts (after the window shows)."""
        return self.telemetry.sampler

    # -- public hooks for other panels ---------------------------------------------------------------

    def add_dock(
        self,
        widget: QWidget,
        title: str,
        area=Qt.DockWidgetArea.RightDockWidgetArea,
        name: str | None = None,
        tabify_with: str | None = None,
    ) -> QDockWidget:
        """Add a dockable panel; it is listed under View > Panels and its place persists between runs."""
        dock = QDockWidget(title, self)
        dock.setObjectName(name or f"{title.lower().replace(' ', '')}Dock")
        dock.setWidget(widget)
        dock.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetMovable
            | QDockWidget.DockWidgetFeature.DockWidgetClosable
            | QDockWidget.DockWidgetFeature.DockWidgetFloatable
        )
        self.addDockWidget(area, dock)
        if tabify_with and tabify_with in self.docks:
            self.tabifyDockWidget(self.docks[tabify_with], dock)
        self.docks[dock.objectName()] = dock
        # A dock added after the menus are built (build_menus lists the others).
        if self.panels_menu is not None:
            self.panels_menu.addAction(dock.toggleViewAction())
        return dock

    # -- models --------------------------------------------------------------------------------------

    def _load_models(self) -> None:
        from engine.models.registry import DEFAULT_MODEL_ID

        sources = self.registry.list()
        last = str(self.settings.value("model/last", "", type=str))
        preferred = last if last and any(s.id == last for s in sources) else DEFAULT_MODEL_ID
        note = self.state.set_models(sources, preferred=preferred)
        if note:
            self.show_status(note, 15000)
        broken = getattr(self.registry, "broken", [])
        for model in broken:
            log.warning("model folder %s skipped: %s", model.path, model.reason)
        if broken:  # said, never fatal: the other models work
            more = f" (and {len(broken) - 1} more; see the log)" if len(broken) > 1 else ""
            self.show_status(f"Model folder {broken[0].name} cannot be used: {broken[0].reason}{more}", 20000)

    def open_model_folder_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open model folder (VolSynth model or MONAI bundle)")
        if folder:
            self.open_model_folder(folder)

    def open_model_folder(self, folder: str | Path) -> bool:
        from engine.errors import EngineError
        from engine.models import open_model_folder

        try:
            source = open_model_folder(folder)
        except EngineError as exc:
            self.show_error("Cannot open model", str(exc))
            return False
        self.state.add_model(source)
        # Selecting it said what the switch reset (steps, conditioning...): keep that after where it came from.
        note = self.state.form.switch_note if self.state.selected_model is source else ""
        self.show_status(f"Model {source.spec.name} opened from {folder}" + (f". {note}" if note else ""))
        return True

    # -- telemetry -----------------------------------------------------------------------------------

    def _on_telemetry_start_timeout(self) -> None:
        if self.isVisible():  # not for a window closed before the timer fired
            self.start_telemetry()

    def start_telemetry(self) -> None:
        """Create (if needed) and start the sampler, and the Metrics dock's redraws. Idempotent."""
        self.telemetry.start()

    def _on_form_changed(self, name: str) -> None:
        if name == "device" and not self.state.job_running:
            self.status.show_device(self.generation.device_text(self.state.form.device))

    def _on_viewer_layout_changed(self, name: str) -> None:
        self.settings.setValue("display/layout", name)  # remembered at once, as the form is

    def _on_sampling_panel_width_wanted(self, width: int) -> None:
        # As wide as the form, if the window has room (the Session dock gives some); else the form scrolls.
        widen_dock(self, self.docks["generateDock"], width)

    def _on_form_changed_save(self, name: str) -> None:
        save_form(self.settings, self.state.form)
        if name == "model" and self.state.form.model is not None:
            self.settings.setValue("model/last", self.state.form.model.id)
        self.settings.sync()

    def _on_state_shown_changed(self, entry) -> None:
        # Save works on the shown volume, whatever made it; a denoising preview is not a result yet.
        self.window_actions.save.setEnabled(entry is not None and entry.kind != "preview")
        self.window_actions.save_as.setEnabled(self.window_actions.save.isEnabled())
        self._update_title()
        self.status.show_volume(entry)

    # -- files (app/window/volume_files.py) -----------------------------------------------------------------

    def open_file_dialog(self) -> None:
        self.files.open_file_dialog()

    def open_path(self, path: str | Path) -> None:
        """Load a NIfTI file (and the tissue maps beside it) in the background; it joins the session and is
        shown when read."""
        self.files.open_path(path)

    def save_shown(self) -> None:
        """File > Save (Ctrl+S): write the shown volume to the file it was saved to, or ask where first."""
        self.files.save_shown()

    def save_file_dialog(self) -> None:
        self.files.save_file_dialog()

    def save_entry(self, entry, path: str | Path) -> None:
        """Write a session volume as NIfTI + JSON provenance sidecar (and its tissue maps), in the background."""
        self.files.save_entry(entry, path)

    def _update_title(self) -> None:
        """'seed 42 · ddpm[*] — VolSynth Studio': the shown volume, with Qt's modified mark while unsaved."""
        entry = self.state.shown
        if entry is None or entry.kind == "preview":
            self.setWindowTitle("VolSynth Studio")
            self.setWindowModified(False)
            return
        self.setWindowTitle(f"{entry.name.replace('[*]', '[**]')}[*] \u2014 VolSynth Studio")
        self.setWindowModified(entry.needs_saving)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        if self.files.dropped_niftis(event):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event) -> None:  # noqa: N802
        paths = self.files.dropped_niftis(event)
        for path in paths:
            self.open_path(path)
        if paths:
            event.acceptProposedAction()

    # -- 3D ------------------------------------------------------------------------------------------

    def _on_preloader_loaded(self, seconds: float) -> None:
        log.info("background imports took %.1f s", seconds)
        self.optimization_panel.refresh(import_engine=False)  # torch is here now: check against the device
        if self._enable_3d:
            self.viewer.view3d.attach_interactor()
            self.view3d_ready.emit()

    def save_3d_screenshot_dialog(self) -> None:
        entry = self.state.shown
        boundary = self.vault_controller.boundary
        if entry is not None and boundary.holds(
            entry
        ):  # patient data: marked and audited, or refused, as chosen once
            boundary.screenshot(entry, self.viewer.view3d.render_image)
            return
        path, _ = QFileDialog.getSaveFileName(
            self, "Save 3D screenshot", str(Path.home() / "volsynth-3d.png"), "PNG images (*.png)"
        )
        if path:
            try:
                self.viewer.view3d.save_screenshot(path)
            except (RuntimeError, OSError, ValueError) as exc:
                self.show_error("Cannot save screenshot", str(exc))
            else:
                self.show_status(f"Saved {path}", 5000)

    def reset_camera(self) -> None:
        self.viewer.view3d.reset_camera()

    # -- view ----------------------------------------------------------------------------------------

    def set_smooth_display(self, checked: bool) -> None:
        self.state.smooth_display = bool(checked)
        self.state.display_changed.emit()

    def sync_view_menu(self) -> None:
        sync_view_menu(self.window_actions, self.viewer_toolbar, self.state)

    def sync_window_presets(self) -> None:
        sync_window_presets(self.window_actions, self.viewer_toolbar, self.state)

    def _on_state_window_changed(self, window: float, level: float) -> None:
        self.sync_window_presets()

    def _on_state_crosshair_changed(self, ras) -> None:
        text = self.viewer.axial.crosshair_readout()
        if text:
            self.status.show_readout("\u271b " + text)

    def _on_state_overlay_changed(self) -> None:
        self._on_state_crosshair_changed(self.state.crosshair_ras)  # the readout names the tissue under it

    def _on_view_hovered(self, text: str) -> None:
        self.status.show_readout(text or self.viewer.axial.crosshair_readout())

    def step_volume(self, step: int) -> None:
        """Show the next (``step`` 1) or previous (-1) volume of the session; not during a run."""
        volumes = self.state.volumes
        if not volumes or self.state.job_running:
            return
        index = volumes.index(self.state.shown) if self.state.shown in volumes else 0
        self.state.show(volumes[(index + step) % len(volumes)])

    # -- messages ------------------------------------------------------------------------------------

    def show_status(self, text: str, timeout_ms: int = 0) -> None:
        self.status.show_message(text, timeout_ms)

    def show_error(self, title: str, message: str) -> None:
        """An error for the user: the engine's message in a dialog, never a traceback."""
        self.errors_shown.append(message)
        QMessageBox.critical(self, title, message)

    def show_about(self) -> None:
        dialog = AboutDialog(self.state.selected_model, self)
        dialog.exec()

    # -- settings and closing ------------------------------------------------------------------------

    def save_settings(self) -> None:
        save_window_settings(self)

    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        if not event.spontaneous() and self.settings.value("window/state") is None:
            # First start: the session list is the front tab, not Metrics (once the tab bar exists).
            QTimer.singleShot(0, self.docks["sessionDock"], self.docks["sessionDock"].raise_)
        QTimer.singleShot(TELEMETRY_START_DELAY_MS, self, self._on_telemetry_start_timeout)
        if not self._looked_for_orphans:
            self._looked_for_orphans = True
            self.recovery.look_for_orphans()

    def confirm_quit_during_run(self) -> bool:
        """Ask before quitting while something runs; True when the user wants to quit anyway."""
        answer = QMessageBox.question(
            self,
            "Quit VolSynth Studio?",
            "A generation is running. Quit anyway? It is cancelled now (a step that does not stop "
            "within 2 s is abandoned and its result dropped); volumes already generated are kept.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        return answer == QMessageBox.StandardButton.Yes

    def closeEvent(self, event) -> None:  # noqa: N802
        if self.state.job_running and not self.confirm_quit_during_run():
            event.ignore()
            return
        self.save_settings()
        # Waits for running writes (recovery's included); a run that does not stop is abandoned, so Quit
        # always quits (app/__main__.py then exits without waiting for its thread).
        self.runner.shutdown()
        self.recovery.close()
        QObject.disconnect(self._quit_hook)  # closed: the quit hook has nothing left to do
        self.remote.close()
        self.telemetry.stop()  # the Metrics dock's redraws, then the sampler
        self.viewer.view3d.close_interactor()
        super().closeEvent(event)

    def _on_devices_listed(self, devices) -> None:
        self.sampling_panel.set_devices(devices)
        self.optimization_panel.refresh(import_engine=False)


def _list_devices():
    from engine.machine.devices import available_devices

    return available_devices()


def default_settings() -> QSettings:
    return QSettings(
        QApplication.organizationName() or "VolSynth", QApplication.applicationName() or "VolSynth Studio"
    )
