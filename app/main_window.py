"""The main window: viewer in the centre, generation panel and session list in docks, menus, status bar.

Adding a dock (metrics, vault browser, comparison) is one call: ``window.add_dock(widget, "Metrics",
Qt.DockWidgetArea.RightDockWidgetArea)``; it appears under View > Panels and its place is saved with the
window state. Work that takes time goes through ``window.runner`` (see app/workers.py).
"""

from __future__ import annotations

import json
import logging
import platform
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDialogButtonBox,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.cohort import install_cohort
from app.compare import install_compare
from app.core.measured_settings import MeasuredSettings
from app.core.nifti_files import open_volume, save_volume_files
from app.core.recovery import RecoveryStore
from app.core.session import CONVENTIONS, RENDER_PRESETS, AppState
from app.core.volumes import CUSTOM_PRESET, WINDOW_PRESETS, VolumeEntry, file_stem
from app.docks.metrics_dock import MetricsDock
from app.eliding_status_bar import ElidingStatusBar
from app.generation import GenerationController
from app.generation.tuning import install_tuning
from app.help import install_help, install_intended_use_notice
from app.panels.dock_width import widen_dock
from app.panels.optimization_panel import install_optimization_panel
from app.panels.sampling_panel import SamplingPanel
from app.panels.session_panel import SessionPanel
from app.recovery_bar import RecoveryBar, RecoveryController
from app.remote import install_remote
from app.vault import install_vault
from app.vault.privacy import remember_recent
from app.viewer.toolbar import install_viewer_toolbar
from app.viewer.viewer_area import DEFAULT_LAYOUT, LAYOUTS, ViewerArea
from app.workers import BackendPool, JobRunner
from engine.nifti.io import is_nifti
from engine.nifti.volume import Volume

log = logging.getLogger(__name__)

NIFTI_FILTER = "NIfTI volumes (*.nii *.nii.gz);;All files (*)"
FORM_KEY = "generation/form"
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
        self.runner = JobRunner(self)
        self.backends = BackendPool(registry)
        self.docks: dict[str, QDockWidget] = {}
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
        self.sampler = sampler
        self.metrics_dock = MetricsDock(sampler)
        self.add_dock(
            self.metrics_dock,
            "Metrics",
            Qt.DockWidgetArea.RightDockWidgetArea,
            name="metricsDock",
            tabify_with="sessionDock",
        )

        self._build_status_bar()
        # Generate, Cancel, Random Seed and the run lifecycle (progress, previews, telemetry marks).
        self.generation = GenerationController(self)
        self._build_actions()
        self._build_menus()
        self._build_toolbar()
        self.vault_controller = install_vault(self)  # Vault dock, menu and auto-lock (app/vault)
        # What `volsynth tune` measured here for the selected model: the presets are a view of it.
        self.measured_settings = MeasuredSettings()
        self.optimization_panel = install_optimization_panel(self, self.measured_settings)
        # Generate > Measure Settings on This Machine: the measurement, in the background.
        self.tuning = install_tuning(self, self.measured_settings)
        self.compare = install_compare(
            self
        )  # Generate > Compare Settings: two settings side by side (app/compare)
        self.remote = install_remote(self)  # Generate > Connect to Engine Server: remote devices (app/remote)
        self.cohort = install_cohort(self)  # Generate > Cohort...: many volumes on Ray (app/cohort)
        # Generated volumes are kept on disk until removed or a clean exit; a crashed session's come back.
        self.recovery = RecoveryController(self, recovery or RecoveryStore(), self.recovery_bar)
        # Quitting without closing the window (app.quit(), a session logout) is still a clean exit.
        self._quit_hook = QApplication.instance().aboutToQuit.connect(self.recovery.close)
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

        self._restore_settings()
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
        if hasattr(self, "panels_menu"):
            self.panels_menu.addAction(dock.toggleViewAction())
        return dock

    # -- building ------------------------------------------------------------------------------------

    def make_action(self, text: str, slot, shortcut=None, tip: str = "") -> QAction:
        """A window-wide action whose tooltip names its shortcut (Help > Keyboard Shortcuts lists them)."""
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
            action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        if tip:
            action.setStatusTip(tip)
            action.setToolTip(f"{tip} ({action.shortcut().toString()})" if shortcut else tip)
        action.triggered.connect(slot)
        return action

    def _build_actions(self) -> None:
        self.open_action = self.make_action(
            "&Open NIfTI...", self.open_file_dialog, QKeySequence.StandardKey.Open, "Open a NIfTI volume"
        )
        # Slicer's and ITK-SNAP's convention: Save writes to the volume's file again once it has one (and
        # asks where only the first time); Save As always asks for a new file.
        self.save_action = self.make_action(
            "&Save",
            self.save_shown,
            QKeySequence.StandardKey.Save,
            "Save the shown volume: to its file again once saved, else asks where (NIfTI + provenance sidecar)",
        )
        self.save_action.setEnabled(False)
        self.save_as_action = self.make_action(
            "Save &As NIfTI...",
            self.save_file_dialog,
            "Ctrl+Shift+S",
            "Save the shown volume to a new NIfTI file with a provenance sidecar",
        )
        self.save_as_action.setEnabled(False)
        self.screenshot_action = self.make_action(
            "Save 3D S&creenshot...",
            self.save_3d_screenshot_dialog,
            "Ctrl+Shift+P",
            "Save the 3D view as PNG",
        )
        self.quit_action = self.make_action("&Quit", self.close, QKeySequence.StandardKey.Quit)
        self.generate_action = self.generation.generate_action
        self.cancel_action = self.generation.cancel_action
        self.random_seed_action = self.generation.random_seed_action
        self.open_model_action = self.make_action(
            "Open &Model Folder...",
            self.open_model_folder_dialog,
            "Ctrl+Shift+O",
            "Open a VolSynth model folder or MONAI bundle",
        )
        self.reset_camera_action = self.make_action(
            "Reset 3D &Camera", self._on_reset_camera_action, "Ctrl+0"
        )
        self.smooth_action = self.make_action(
            "&Smooth Slice Display", self._on_smooth_action_toggled, "Ctrl+I"
        )
        self.smooth_action.setCheckable(True)
        self.about_action = self.make_action("&About VolSynth Studio", self.show_about)
        self.next_volume_action = self.make_action("Next Volume", partial(self._step_volume, 1), "Ctrl+]")
        self.prev_volume_action = self.make_action(
            "Previous Volume", partial(self._step_volume, -1), "Ctrl+["
        )

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        file_menu.addAction(self.open_action)
        self.recent_menu = file_menu.addMenu("Open &Recent")
        file_menu.addAction(self.save_action)
        file_menu.addAction(self.save_as_action)
        file_menu.addAction(self.screenshot_action)
        file_menu.addSeparator()
        file_menu.addAction(self.quit_action)

        gen_menu = bar.addMenu("&Generate")
        self.generate_menu = gen_menu  # other parts add their entries here (app/compare, app/remote)
        for action in (
            self.generate_action,
            self.cancel_action,
            self.random_seed_action,
            self.open_model_action,
        ):
            gen_menu.addAction(action)

        view_menu = bar.addMenu("&View")
        wl_menu = view_menu.addMenu("&Window/Level Preset")
        self.wl_group = QActionGroup(self)
        for index, preset in enumerate((*WINDOW_PRESETS, CUSTOM_PRESET)):
            action = self.make_action(preset, partial(self._on_wl_preset_chosen, preset), f"Ctrl+{index + 1}")
            action.setCheckable(True)
            self.wl_group.addAction(action)
            wl_menu.addAction(action)
        conv_menu = view_menu.addMenu("&Left/Right Convention")
        self.convention_group = QActionGroup(self)
        for convention in CONVENTIONS:
            label = {
                "radiological": "Radiological (patient right on screen left)",
                "neurological": "Neurological (patient right on screen right)",
            }[convention]
            action = self.make_action(label, partial(self.state.set_convention, convention))
            action.setCheckable(True)
            action.setData(convention)
            self.convention_group.addAction(action)
            conv_menu.addAction(action)
        render_menu = view_menu.addMenu("3D &Rendering")
        self.render_group = QActionGroup(self)
        for preset in RENDER_PRESETS:
            action = self.make_action(preset, partial(self.state.set_render_preset, preset))
            action.setCheckable(True)
            action.setData(preset)
            self.render_group.addAction(action)
            render_menu.addAction(action)
        view_menu.addAction(self.smooth_action)
        self.view_menu = view_menu  # the viewer tool bar's Tissue Overlay joins it (see _build_toolbar)
        view_menu.addAction(self.reset_camera_action)
        view_menu.addSeparator()
        view_menu.addAction(self.prev_volume_action)
        view_menu.addAction(self.next_volume_action)
        view_menu.addSeparator()
        self.panels_menu = view_menu.addMenu("&Panels")
        for dock in self.docks.values():
            self.panels_menu.addAction(dock.toggleViewAction())

        help_menu = bar.addMenu("&Help")
        help_menu.addAction(self.about_action)
        self.help = install_help(self, help_menu)  # User Guide (F1), Keyboard Shortcuts (Ctrl+/)
        self.intended_use_notice = install_intended_use_notice(self, self.settings)  # first run only
        self._rebuild_recent_menu()

    def _build_toolbar(self) -> None:
        bar = self.addToolBar("Main")
        bar.setObjectName("mainToolbar")
        self.main_toolbar = bar
        bar.setMovable(False)
        bar.addAction(self.open_action)
        bar.addAction(self.save_action)
        bar.addSeparator()
        bar.addAction(self.generate_action)
        bar.addAction(self.cancel_action)
        # Window/level, orientation, interpolation, crosshair, zoom, 4D time points: the viewer's tool bar
        self.viewer_toolbar = install_viewer_toolbar(self)
        self.wl_box, self.convention_box = self.viewer_toolbar.preset_box, self.viewer_toolbar.convention_box
        self.tissue_toolbar = self.viewer_toolbar.tissue_toolbar  # the tissue overlay: on/off, map, opacity
        self.view_menu.insertAction(self.reset_camera_action, self.tissue_toolbar.tissue_action)
        self.view_menu.insertMenu(self.view_menu.actions()[0], self.viewer_toolbar.layout_menu)
        self.layout_actions = self.viewer_toolbar.layout_group.actions()
        self.viewer.layout_changed.connect(self._on_viewer_layout_changed)
        self.state.overlay_changed.connect(self._on_state_overlay_changed)
        self.state.display_changed.connect(self._on_state_display_changed)

    def _build_status_bar(self) -> None:
        # A message too long for the room beside the fields ends in "…" (whole in the tooltip).
        self.setStatusBar(ElidingStatusBar())
        status = self.statusBar()
        self.readout_label = QLabel("")
        self.readout_label.setObjectName("readout")
        # Wide enough for "voxel (i, j, k)  RAS (x, y, z) mm  value v" not to jitter as the pointer moves;
        # no wider, so a 1024-px window leaves the message beside it some room (420 cut most messages).
        self.readout_label.setMinimumWidth(340)
        self.device_label = QLabel("device: auto")
        self.space_label = QLabel("")
        self.space_label.setObjectName("space")
        self.space_label.hide()
        self.voxel_label = QLabel("")
        self.voxel_label.setObjectName("voxelSize")
        self.voxel_label.hide()
        status.addPermanentWidget(self.readout_label)
        status.addPermanentWidget(self.space_label)
        status.addPermanentWidget(self.voxel_label)
        status.addPermanentWidget(self.device_label)
        # A message longer than the room beside the readout is cut at its right; the whole of it is one
        # hover away.
        status.messageChanged.connect(self._on_status_message_changed)

    def _on_status_message_changed(self, message: str) -> None:
        self.statusBar().setToolTip(message)

    # -- models --------------------------------------------------------------------------------------

    def _load_models(self) -> None:
        from engine.models.registry import DEFAULT_MODEL_ID

        sources = self.registry.list()
        last = self.settings.value("model/last", "", type=str)
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
        self.show_status(f"Model {source.spec.name} opened from {folder}")
        return True

    # -- telemetry -----------------------------------------------------------------------------------

    def _on_telemetry_start_timeout(self) -> None:
        if self.isVisible():  # not for a window closed before the timer fired
            self.start_telemetry()

    def start_telemetry(self) -> None:
        """Create (if needed) and start the sampler, and the Metrics dock's redraws. Idempotent."""
        if self.sampler is None:
            from engine.telemetry import Sampler

            self.sampler = Sampler()
            self.show_metrics_source(self.remote.metrics_source_for(self.state.form.device))
        self.sampler.start()
        self.metrics_dock.start()

    def show_metrics_source(self, remote_source=None) -> None:
        """The Metrics dock shows an engine server's metrics while it is the chosen device, else this machine's."""
        source = remote_source if remote_source is not None else self.sampler
        if source is not None and source is not self.metrics_dock.source:
            self.metrics_dock.set_source(source)

    def _on_form_changed(self, name: str) -> None:
        if name == "device" and not self.state.job_running:
            self.device_label.setText(f"device: {self.generation.device_text(self.state.form.device)}")

    def _on_viewer_layout_changed(self, name: str) -> None:
        self.settings.setValue("display/layout", name)  # remembered at once, as the form is

    def _on_sampling_panel_width_wanted(self, width: int) -> None:
        # As wide as the form, if the window has room (the Session dock gives some); else the form scrolls.
        widen_dock(self, self.docks["generateDock"], width)

    def _on_form_changed_save(self, name: str) -> None:
        self.settings.setValue(FORM_KEY, json.dumps(self.state.form.to_dict()))
        if name == "model" and self.state.form.model is not None:
            self.settings.setValue("model/last", self.state.form.model.id)
        self.settings.sync()

    def _on_state_shown_changed(self, entry) -> None:
        # Save works on the shown volume, whatever made it; a denoising preview is not a result yet.
        self.save_action.setEnabled(entry is not None and entry.kind != "preview")
        self.save_as_action.setEnabled(self.save_action.isEnabled())
        self._update_title()
        # The space the shown volume's millimetres are in (the readout's RAS or MNI coordinates).
        self.space_label.setVisible(entry is not None and entry.kind != "preview")
        # The voxel size, and the modality of a model that takes one (NV-Generate-MR-Brain).
        self.voxel_label.setVisible(entry is not None)
        if entry is not None:
            spacing = "\u00d7".join(f"{v:.3g}" for v in entry.spacing)
            modality = (entry.provenance.get("output") or {}).get("modality")
            self.voxel_label.setText(f"{spacing} mm" + (f" \u00b7 {modality}" if modality else ""))
            self.voxel_label.setToolTip(
                "Voxel size of the shown volume" + (f"; modality {modality}" if modality else "")
            )
        if entry is not None:
            self.space_label.setText(f"Space: {entry.space_name}")
            self.space_label.setToolTip(
                f"The readout's millimetres are coordinates of {entry.space}"
                if entry.space
                else "The readout's millimetres are scanner coordinates: no template space is named"
            )

    # -- files ---------------------------------------------------------------------------------------

    def open_file_dialog(self) -> None:
        start = self.settings.value("files/last_dir", str(Path.home()), type=str)
        paths, _ = QFileDialog.getOpenFileNames(self, "Open NIfTI volume", start, NIFTI_FILTER)
        for path in paths:
            self.open_path(path)

    def open_path(self, path: str | Path) -> None:
        """Load a NIfTI file (and the tissue maps beside it) in the background; it joins the session and is
        shown when read."""
        path = Path(path)
        if remember_recent(self.settings):  # (Vault > Remember Recent Files and Folders)
            self.settings.setValue("files/last_dir", str(path.parent))
        self.show_status(f"Opening {path.name}...")
        self.runner.run_task(
            "open",
            open_volume,
            path,
            finished=self._on_file_loaded,
            failed=partial(self._on_file_failed, path),
        )

    def _on_file_loaded(self, opened: Volume) -> None:
        name = opened.path.name if opened.path else "volume"
        entry = VolumeEntry(name, volume=opened, kind="opened")
        self.state.add_volume(entry)
        self._rebuild_recent_menu()
        self._save_recent()
        message = f"Opened {name}"
        if entry.tissue:
            message += f" with tissue maps {', '.join(entry.tissue_names)}"
        for note in opened.notes:
            log.warning("%s: %s", name, note)
        if opened.notes:  # said, never fatal: the image and the other maps are there
            more = f" (and {len(opened.notes) - 1} more; see the log)" if len(opened.notes) > 1 else ""
            message += f"; {opened.notes[0]}{more}"
        self.show_status(message, 15000 if opened.notes else 5000)
        self.volume_opened.emit(entry)

    def _on_file_failed(self, path: Path, message: str) -> None:
        self.show_status(f"Could not open {path.name}", 5000)
        self.show_error("Cannot open file", message)

    def _update_title(self) -> None:
        """'seed 42 · ddpm[*] — VolSynth Studio': the shown volume, with Qt's modified mark while unsaved."""
        entry = self.state.shown
        if entry is None or entry.kind == "preview":
            self.setWindowTitle("VolSynth Studio")
            self.setWindowModified(False)
            return
        self.setWindowTitle(f"{entry.name.replace('[*]', '[**]')}[*] \u2014 VolSynth Studio")
        self.setWindowModified(entry.needs_saving)

    def save_shown(self) -> None:
        """File > Save (Ctrl+S): write the shown volume to the file it was saved to, or ask where first."""
        entry = self.state.shown
        if entry is None or entry.kind == "preview":
            return
        if entry.saved_file is not None:
            self.save_entry(entry, entry.saved_file)
        else:
            self.save_file_dialog()

    def save_file_dialog(self) -> None:
        entry = self.state.shown
        if entry is None or entry.kind == "preview":
            return
        start_dir = self.settings.value("files/last_save_dir", str(Path.home()), type=str)
        stem = file_stem(entry.name)
        path, _ = QFileDialog.getSaveFileName(
            self, "Save volume as NIfTI", str(Path(start_dir) / f"{stem}.nii.gz"), NIFTI_FILTER
        )
        if path:
            if not is_nifti(path):
                path += ".nii.gz"
            self.save_entry(entry, path)

    def save_entry(self, entry: VolumeEntry, path: str | Path) -> None:
        """Write a session volume as NIfTI + JSON provenance sidecar, and its tissue maps beside it (all or
        none), in the background."""
        path = Path(path)
        if remember_recent(self.settings):
            self.settings.setValue("files/last_save_dir", str(path.parent))
        provenance = dict(entry.provenance) or {
            "source": str(entry.path) if entry.path else "VolSynth Studio session"
        }
        provenance.setdefault("synthetic", entry.synthetic)
        self.show_status(f"Saving {path.name}...")
        write = partial(
            save_volume_files,
            path,
            entry.data,
            entry.affine,
            provenance=provenance,
            synthetic=entry.synthetic,
            tissue=entry.tissue,
            space=entry.space,
        )
        self.runner.run_task(
            "save",
            write,
            finished=partial(self._on_file_saved, entry),
            failed=partial(self._on_save_failed, path),
        )

    def _on_file_saved(self, entry: VolumeEntry, path) -> None:
        self.state.mark_saved(entry, str(path), file=path)
        self.state.recent.add(path)
        self._rebuild_recent_menu()
        self._save_recent()
        maps = f" and {len(entry.tissue)} tissue maps" if entry.tissue else ""
        self.show_status(f"Saved {path} (+ provenance sidecar{maps})", 8000)

    def _on_save_failed(self, path: Path, message: str) -> None:
        self.show_error("Cannot save", message)

    def _rebuild_recent_menu(self) -> None:
        self.recent_menu.clear()
        paths = self.state.recent.paths()
        for path in paths:
            action = self.recent_menu.addAction(Path(path).name)
            action.setToolTip(path)
            action.setStatusTip(path)
            action.triggered.connect(partial(self.open_path, path))
        self.recent_menu.setEnabled(bool(paths))

    def _save_recent(self) -> None:
        self.settings.setValue("files/recent", json.dumps(self.state.recent.paths()))

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if any(is_nifti(url.toLocalFile()) for url in urls):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event) -> None:  # noqa: N802
        paths = [url.toLocalFile() for url in event.mimeData().urls() if is_nifti(url.toLocalFile())]
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

    def _on_reset_camera_action(self) -> None:
        self.viewer.view3d.reset_camera()

    # -- view ----------------------------------------------------------------------------------------

    def _on_wl_preset_chosen(self, preset: str) -> None:
        self.state.apply_window_preset(preset)

    def _on_smooth_action_toggled(self, checked: bool) -> None:
        self.state.smooth_display = bool(checked)
        self.state.display_changed.emit()

    def _on_state_display_changed(self) -> None:
        self.convention_box.setCurrentIndex(CONVENTIONS.index(self.state.convention))
        for action in self.convention_group.actions():
            action.setChecked(action.data() == self.state.convention)
        for action in self.render_group.actions():
            action.setChecked(action.data() == self.state.render_preset)
        self.smooth_action.setChecked(self.state.smooth_display)

    def _on_state_window_changed(self, window: float, level: float) -> None:
        self.wl_box.setCurrentText(self.state.window_preset)
        for action in self.wl_group.actions():
            action.setChecked(action.text() == self.state.window_preset)

    def _on_state_crosshair_changed(self, ras) -> None:
        text = self.viewer.axial.crosshair_readout()
        if text:
            self.readout_label.setText("\u271b " + text)

    def _on_state_overlay_changed(self) -> None:
        self._on_state_crosshair_changed(self.state.crosshair_ras)  # the readout names the tissue under it

    def _on_view_hovered(self, text: str) -> None:
        self.readout_label.setText(text or self.viewer.axial.crosshair_readout())

    def _step_volume(self, step: int) -> None:
        volumes = self.state.volumes
        if not volumes or self.state.job_running:
            return
        index = volumes.index(self.state.shown) if self.state.shown in volumes else 0
        self.state.show(volumes[(index + step) % len(volumes)])

    # -- messages ------------------------------------------------------------------------------------

    def show_status(self, text: str, timeout_ms: int = 0) -> None:
        self.statusBar().showMessage(text, timeout_ms)

    def show_error(self, title: str, message: str) -> None:
        """An error for the user: the engine's message in a dialog, never a traceback."""
        self.errors_shown.append(message)
        QMessageBox.critical(self, title, message)

    def show_about(self) -> None:
        dialog = AboutDialog(self.state.selected_model, self)
        dialog.exec()

    # -- settings ------------------------------------------------------------------------------------

    def _restore_settings(self) -> None:
        s = self.settings
        geometry = s.value("window/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1500, 920)
        state = s.value("window/state")
        if state is not None:
            self.restoreState(state)
        try:
            recent = json.loads(s.value("files/recent", "[]", type=str))
        except (TypeError, ValueError):
            recent = []
        for path in reversed(recent):
            if isinstance(path, str):
                self.state.recent.add(path)
        self._rebuild_recent_menu()
        convention = s.value("display/convention", "radiological", type=str)
        if convention in CONVENTIONS:
            self.state.convention = convention
        preset = s.value("display/window_preset", WINDOW_PRESETS[0], type=str)
        self.state.window_preset = preset if preset in WINDOW_PRESETS else WINDOW_PRESETS[0]
        render = s.value("display/render_preset", RENDER_PRESETS[0], type=str)
        if render in RENDER_PRESETS:
            self.state.render_preset = render
        self.state.smooth_display = s.value("display/smooth", True, type=bool)
        self.state.iso_fraction = s.value("display/iso_fraction", self.state.iso_fraction, type=float)
        self.state.set_tissue_opacity(
            s.value("display/tissue_opacity", self.state.tissue_opacity, type=float)
        )
        self.state.set_tissue_choice(s.value("display/tissue_choice", self.state.tissue_choice, type=str))
        self.state.set_show_tissue(s.value("display/show_tissue", False, type=bool))
        self.state.set_show_crosshair(s.value("display/show_crosshair", True, type=bool))
        layout = s.value("display/layout", DEFAULT_LAYOUT, type=str)
        self.viewer.set_layout(layout if layout in LAYOUTS else DEFAULT_LAYOUT)
        self.viewer.view3d.sync_controls()
        self.viewer.view3d.preset_box.setCurrentText(self.state.render_preset)
        self._on_state_display_changed()
        self._on_state_window_changed(*self.state.window)
        try:
            saved_form = json.loads(s.value(FORM_KEY, "{}", type=str))
        except (TypeError, ValueError):
            saved_form = {}
        self.state.form.restore(saved_form)  # before the models load: a model's saved values wait for it

    def save_settings(self) -> None:
        s = self.settings
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState())
        if self.state.selected_model is not None:
            s.setValue("model/last", self.state.selected_model.id)
        s.setValue("display/convention", self.state.convention)
        s.setValue(
            "display/window_preset",
            self.state.window_preset if self.state.window_preset in WINDOW_PRESETS else WINDOW_PRESETS[0],
        )
        s.setValue("display/render_preset", self.state.render_preset)
        s.setValue("display/smooth", self.state.smooth_display)
        s.setValue("display/iso_fraction", self.state.iso_fraction)
        s.setValue("display/tissue_opacity", self.state.tissue_opacity)
        s.setValue("display/tissue_choice", self.state.tissue_choice)
        s.setValue("display/show_tissue", self.state.show_tissue)
        s.setValue("display/layout", self.viewer.layout_name)
        s.setValue("display/show_crosshair", self.state.show_crosshair)
        s.setValue(FORM_KEY, json.dumps(self.state.form.to_dict()))
        self._save_recent()
        s.sync()

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
        self.metrics_dock.stop()
        if self.sampler is not None:
            self.sampler.stop()
        self.viewer.view3d.close_interactor()
        super().closeEvent(event)

    def _on_devices_listed(self, devices) -> None:
        self.sampling_panel.set_devices(devices)
        self.optimization_panel.refresh(import_engine=False)


def _list_devices():
    from engine.machine.devices import available_devices

    return available_devices()


class AboutDialog(QDialog):
    """Versions of everything that matters for a bug report, and the selected model's card."""

    def __init__(self, source, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About VolSynth Studio")
        self.resize(720, 560)
        tabs = QTabWidget()
        versions = QTextBrowser()
        versions.setHtml(self.versions_html())
        tabs.addTab(versions, "About")
        card = QTextBrowser()
        card.setOpenExternalLinks(False)
        text = source.model_card() if source is not None else ""
        card.setMarkdown(text or "This model has no model card.")
        tabs.addTab(card, f"Model card: {source.spec.name}" if source is not None else "Model card")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(tabs)
        layout.addWidget(buttons)

    @staticmethod
    def versions() -> dict[str, str]:
        import sys

        import PySide6

        from engine import __version__

        found = {
            "VolSynth": __version__,
            "Python": platform.python_version(),
            "PySide6 / Qt": f"{PySide6.__version__} / {PySide6.QtCore.qVersion()}",
            "numpy": np.__version__,
        }
        for name in ("torch", "monai", "pyvista", "vtk", "nibabel"):
            module = sys.modules.get(name)
            found[name] = getattr(module, "__version__", "?") if module else "not loaded yet"
        found["platform"] = platform.platform()
        return found

    def versions_html(self) -> str:
        rows = "".join(
            f"<tr><td><b>{k}</b></td><td>&nbsp;&nbsp;{v}</td></tr>" for k, v in self.versions().items()
        )
        from app.core.intended_use import INTENDED_USE_HEADLINE, INTENDED_USE_TEXT

        return (
            "<h2>VolSynth Studio</h2>"
            f"<p style='color:#b45309'><b>{INTENDED_USE_HEADLINE}</b></p><p>{INTENDED_USE_TEXT}</p>"
            "<p>Synthesizes 3D brain MRI with diffusion models. "
            "Every generated volume is marked <b>synthetic</b> in its file and provenance record.</p>"
            f"<table>{rows}</table>"
        )


def default_settings() -> QSettings:
    return QSettings(
        QApplication.organizationName() or "VolSynth", QApplication.applicationName() or "VolSynth Studio"
    )
