"""The Generate side of the app on ``AppServices``, as the main window installs it, without the window: the
Generate panel and its run controller (with its Generate and Cancel in the Generate menu), the Optimization
section, the Session list, the Metrics dock, the status bar's fields, the file commands that open and save
volumes, and the features installed beside them: engine servers (Generate > Connect to Engine Server...) and
Compare Settings.

Tests of a feature that needs a run (an engine server, recovery, the Metrics dock, a stuck step) build this
on the ``app_services`` fixture (``generating``) and install their feature beside it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from PySide6.QtCore import Qt

from app.compare import CompareController, install_compare
from app.core.measured_settings import MeasuredSettings
from app.docks.metrics_dock import MetricsDock
from app.generation import GenerationController, install_generation
from app.panels.optimization_panel import OptimizationPanel, install_optimization_panel
from app.panels.sampling_panel import SamplingPanel
from app.panels.session_panel import SessionPanel
from app.remote import RemoteController, install_remote
from app.services import AppServices
from app.services.metrics_sources import MetricsSources
from app.window.menus import add_generation_actions
from app.window.status_bar import WindowStatus
from app.window.volume_files import VolumeFiles


@dataclass
class Generating:
    """What a user generates with: ``services`` (whose ``open_path`` reads into the session through
    ``files`` and whose ``show_device`` is the ``status`` bar's field), the Generate ``panel``, its
    ``generation`` controller, the ``optimization`` section, the ``session`` list, the Metrics ``dock`` runs
    are marked on, the engine servers' ``remote`` controller and ``compare`` (Compare Settings)."""

    services: AppServices
    panel: SamplingPanel
    generation: GenerationController
    optimization: OptimizationPanel
    session: SessionPanel
    dock: MetricsDock
    files: VolumeFiles
    status: WindowStatus
    remote: RemoteController
    compare: CompareController

    def select(self, model_id: str, **changes) -> None:
        """The model chosen in the picker, then the form's fields set (steps, batch_size, device...)."""
        state = self.services.state
        state.select_model(state.model_by_id(model_id))
        if changes:
            state.form.set(**changes)

    def wait_ended(self, qtbot, timeout: int = 120_000) -> str:
        """Waits for the run's end, then for its writes (recovery, say); the outcome."""
        with qtbot.waitSignal(self.generation.ended, timeout=timeout) as blocker:
            pass
        qtbot.waitUntil(lambda: not self.services.runner.jobs, timeout=30_000)
        return blocker.args[0]

    def show_metrics(self, qtbot) -> MetricsDock:
        """The Metrics dock in front, its sampler running and its first plots drawn."""
        self.services.telemetry.start()
        self.dock.parentWidget().raise_()
        sources = self.services.telemetry
        qtbot.waitUntil(lambda: sources.sampler is not None and sources.sampler.running, timeout=10_000)
        qtbot.waitUntil(lambda: self.dock.on_screen() and self.dock.plots_built, timeout=10_000)
        return self.dock


def install_generating(services: AppServices, sampler=None) -> Generating:
    """The Generate panel, Session list and Metrics dock in the services' host, wired as the main window
    wires them (app/window/main_window.py). ``sampler``: the ``engine.telemetry`` source of this machine's
    metrics (by default a ``Sampler`` made when the telemetry starts); the caller stops the telemetry of
    one it gives (``generating.services.telemetry.stop()``)."""
    state = services.state
    if sampler is not None:
        telemetry = MetricsSources(MetricsDock(sampler), sampler, lambda: state.form.device)
        services = dataclasses.replace(services, telemetry=telemetry)
    files = VolumeFiles(
        state,
        services.runner,
        services.settings,
        show_status=services.show_status,
        show_error=services.show_error,
        volume_opened=services.volume_opened.emit,
        parent=services.parent,
    )
    status = WindowStatus(services.parent.statusBar())
    state.shown_changed.connect(status.show_volume)
    services = dataclasses.replace(services, open_path=files.open_path, show_device=status.show_device)
    panel = SamplingPanel(state)
    session = SessionPanel(state)
    dock = services.telemetry.dock
    services.add_dock(panel, "Generate", Qt.DockWidgetArea.LeftDockWidgetArea, name="generateDock")
    services.add_dock(session, "Session", Qt.DockWidgetArea.RightDockWidgetArea, name="sessionDock")
    services.add_dock(dock, "Metrics", Qt.DockWidgetArea.RightDockWidgetArea, name="metricsDock")
    generation = install_generation(services, panel, dock)
    add_generation_actions(services.menus, generation)
    measured = MeasuredSettings()
    optimization = install_optimization_panel(services, panel, generation.about_to_start, measured)
    session.save_requested.connect(files.save_file_dialog)
    remote = install_remote(services, panel)
    compare = install_compare(services, generation.device_text, generation.cancel_action, measured)
    return Generating(
        services, panel, generation, optimization, session, dock, files, status, remote, compare
    )


@pytest.fixture
def generating(app_services):
    """The Generate side on ``app_services`` (see the module); its engine servers are let go at the end, as
    closing the window does."""
    generating = install_generating(app_services)
    yield generating
    app_services.runner.shutdown()
    generating.remote.close()
