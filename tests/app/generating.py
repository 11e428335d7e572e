"""The Generate side of the app on ``AppServices``, installed as the main window installs it, without the window:
the Generate panel and its run controller (Generate and Cancel in the Generate menu), the Optimization section,
Measure Settings, the Session list, the Metrics dock, the status bar's fields, the file commands that open and
save volumes, engine servers (Generate > Connect to Engine Server...) and Compare Settings.

The pieces other rigs share (the file commands, the docked Session list, the docked Generate panel, its run
controller) are built here once: ``volume_files``, ``dock_session_panel``, ``dock_generate_panel``, ``install_runs``. Tests of a
feature that needs a run take the ``generating`` fixture (each package's conftest imports it) and install their
feature beside it; ``tests.app.runs.generate`` runs the Generate panel's request as a user does.
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
from app.generation.tuning import TuneController, install_tuning
from app.panels.optimization_panel import OptimizationPanel, install_optimization_panel
from app.panels.sampling_panel import SamplingPanel
from app.panels.session_panel import SessionPanel
from app.remote import RemoteController, install_remote
from app.services import AppServices
from app.services.metrics_sources import MetricsSources
from app.window.menus import add_generation_actions
from app.window.status_bar import WindowStatus
from app.window.volume_files import VolumeFiles


def volume_files(services: AppServices) -> VolumeFiles:
    """File > Open, Save and Save As on the services, as the window makes them."""
    return VolumeFiles(
        services.state,
        services.runner,
        services.settings,
        show_status=services.show_status,
        show_error=services.show_error,
        volume_opened=services.volume_opened.emit,
        parent=services.parent,
    )


def dock_session_panel(services: AppServices) -> SessionPanel:
    """The Session list in a dock on the right of the host, as in the window."""
    panel = SessionPanel(services.state)
    services.add_dock(panel, "Session", Qt.DockWidgetArea.RightDockWidgetArea, name="sessionDock")
    return panel


def dock_generate_panel(services: AppServices) -> SamplingPanel:
    """The Generate panel in a dock on the left of the host, as in the window."""
    panel = SamplingPanel(services.state)
    services.add_dock(panel, "Generate", Qt.DockWidgetArea.LeftDockWidgetArea, name="generateDock")
    return panel


def install_runs(
    services: AppServices, panel: SamplingPanel, metrics_dock: MetricsDock | None = None
) -> GenerationController:
    """The Generate panel's run controller (marking runs on ``metrics_dock``) with Generate and Cancel in the
    Generate menu, as the window installs them."""
    generation = install_generation(services, panel, metrics_dock or MetricsDock())
    add_generation_actions(services.menus, generation)
    return generation


@dataclass
class Generating:
    """What a user generates with, named as the main window names it: ``services`` (whose ``open_path`` reads
    into the session through ``files`` and whose ``show_device`` is the ``status`` bar's field), the Generate
    panel and its ``generation`` controller, the Optimization section, Measure Settings (``measured``, run by
    ``tuning``), the Session list, the Metrics dock runs are marked on, the engine servers' ``remote``
    controller and Compare Settings."""

    services: AppServices
    sampling_panel: SamplingPanel
    generation: GenerationController
    optimization_panel: OptimizationPanel
    session_panel: SessionPanel
    metrics_dock: MetricsDock
    files: VolumeFiles
    status: WindowStatus
    remote: RemoteController
    compare: CompareController
    measured: MeasuredSettings
    tuning: TuneController

    @property
    def state(self):
        return self.services.state

    @property
    def runner(self):
        return self.services.runner

    @property
    def host(self):
        """The window the features live in (its menus, docks and status bar)."""
        return self.services.parent

    def select(self, model_id: str, **changes) -> None:
        """The model chosen in the picker, then the form's fields set (steps, batch_size, device...)."""
        self.state.select_model(self.state.model_by_id(model_id))
        if changes:
            self.state.form.set(**changes)

    def wait_ended(self, qtbot, timeout: int = 120_000) -> str:
        """Waits for the run's end, then for its writes (recovery, say); the outcome."""
        with qtbot.waitSignal(self.generation.ended, timeout=timeout) as blocker:
            pass
        qtbot.waitUntil(lambda: not self.runner.jobs, timeout=30_000)
        return blocker.args[0]

    def show_metrics(self, qtbot) -> MetricsDock:
        """The Metrics dock in front, its sampler running and its first plots drawn."""
        self.services.telemetry.start()
        self.metrics_dock.parentWidget().raise_()
        sources = self.services.telemetry
        qtbot.waitUntil(lambda: sources.sampler is not None and sources.sampler.running, timeout=10_000)
        qtbot.waitUntil(
            lambda: self.metrics_dock.on_screen() and self.metrics_dock.plots_built, timeout=10_000
        )
        return self.metrics_dock


def install_generating(services: AppServices, sampler=None) -> Generating:
    """The Generate side in the services' host, wired in the order the main window wires it
    (app/window/main_window.py). ``sampler``: the ``engine.telemetry`` source of this machine's metrics (by
    default a ``Sampler`` made when the telemetry starts); the caller stops the telemetry of one it gives
    (``generating.services.telemetry.stop()``)."""
    state = services.state
    if sampler is not None:
        telemetry = MetricsSources(MetricsDock(sampler), sampler, lambda: state.form.device)
        services = dataclasses.replace(services, telemetry=telemetry)
    files = volume_files(services)
    status = WindowStatus(services.parent.statusBar())
    state.shown_changed.connect(status.show_volume)
    services = dataclasses.replace(services, open_path=files.open_path, show_device=status.show_device)
    metrics_dock = services.telemetry.dock
    sampling_panel = dock_generate_panel(services)
    session_panel = dock_session_panel(services)
    services.add_dock(metrics_dock, "Metrics", Qt.DockWidgetArea.RightDockWidgetArea, name="metricsDock")
    generation = install_runs(services, sampling_panel, metrics_dock)
    measured = MeasuredSettings()
    optimization_panel = install_optimization_panel(
        services, sampling_panel, generation.about_to_start, measured
    )
    tuning = install_tuning(services, optimization_panel, measured)
    session_panel.save_requested.connect(files.save_file_dialog)
    remote = install_remote(services, sampling_panel)
    compare = install_compare(services, generation.device_text, generation.cancel_action, measured)
    return Generating(
        services=services,
        sampling_panel=sampling_panel,
        generation=generation,
        optimization_panel=optimization_panel,
        session_panel=session_panel,
        metrics_dock=metrics_dock,
        files=files,
        status=status,
        remote=remote,
        compare=compare,
        measured=measured,
        tuning=tuning,
    )


@pytest.fixture
def generating(qtbot, app_services):
    """The Generate side on ``app_services`` (see the module), once its start-up look-ups (what was measured here
    for the selected model) have ended; its engine servers are let go at the end, as closing the window does."""
    installed = install_generating(app_services)
    qtbot.waitUntil(lambda: not app_services.runner.jobs, timeout=30_000)
    yield installed
    app_services.runner.shutdown()
    installed.remote.close()
