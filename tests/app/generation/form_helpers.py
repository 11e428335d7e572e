"""The Generate features on ``AppServices`` without the main window: the Generate panel with its Optimization
section, the generation controller, what was measured here (and its tune controller), the Session panel and
Compare Settings, each installed as the main window installs it, for the tests of those features."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from PySide6.QtCore import Qt

from app.compare import CompareController, install_compare
from app.core.measured_settings import MeasuredSettings
from app.docks.metrics_dock import MetricsDock
from app.generation.controller import GenerationController, install_generation
from app.generation.tuning import TuneController, install_tuning
from app.panels.optimization_panel import OptimizationPanel, install_optimization_panel
from app.panels.sampling_panel import SamplingPanel
from app.panels.session_panel import SessionPanel
from app.services import AppServices
from app.window.menus import add_generation_actions

GENERATION_TIMEOUT_MS = 240_000  # a tiny model's run, on a 2-core machine that may be busy


@dataclass
class GenerateFeatures:
    services: AppServices
    sampling_panel: SamplingPanel
    session_panel: SessionPanel
    generation: GenerationController
    optimization_panel: OptimizationPanel
    measured: MeasuredSettings
    tuning: TuneController
    compare: CompareController

    @property
    def state(self):
        return self.services.state

    @property
    def host(self):
        """The window the features live in (its menus and status bar)."""
        return self.services.parent

    def select(self, model_id: str) -> None:
        self.state.select_model(self.state.model_by_id(model_id))


def install_generate_features(services: AppServices) -> GenerateFeatures:
    """The Generate panel (docked), its generation and Optimization section, Measure Settings, the Session panel
    and Compare Settings, wired in the order the main window wires them."""
    sampling_panel = SamplingPanel(services.state)
    services.add_dock(sampling_panel, "Generate", Qt.DockWidgetArea.LeftDockWidgetArea, "generateDock")
    session_panel = SessionPanel(services.state)
    services.add_dock(session_panel, "Session", Qt.DockWidgetArea.RightDockWidgetArea, "sessionDock")
    generation = install_generation(services, sampling_panel, MetricsDock())
    add_generation_actions(services.menus, generation)
    measured = MeasuredSettings()
    optimization_panel = install_optimization_panel(
        services, sampling_panel, generation.about_to_start, measured
    )
    tuning = install_tuning(services, optimization_panel, measured)
    compare = install_compare(services, generation.device_text, generation.cancel_action, measured)
    return GenerateFeatures(
        services=services,
        sampling_panel=sampling_panel,
        session_panel=session_panel,
        generation=generation,
        optimization_panel=optimization_panel,
        measured=measured,
        tuning=tuning,
        compare=compare,
    )


@pytest.fixture
def features(qtbot, app_services) -> GenerateFeatures:
    """The Generate features on the test's ``AppServices``, once their start-up look-ups (what was measured
    here for the selected model) have ended."""
    installed = install_generate_features(app_services)
    qtbot.waitUntil(lambda: not app_services.runner.jobs, timeout=30_000)
    return installed


def generate(qtbot, features: GenerateFeatures, *, steps: int | None = None, click: bool = False) -> str:
    """Run the Generate panel's request (``steps`` typed into it first, if given), started with Ctrl+G in the
    host window or, with ``click``, the Generate button; wait for its end and for the runner to let go of its
    job. Returns the outcome: "finished", "cancelled", "failed" or "abandoned"."""
    if steps is not None:
        features.sampling_panel.steps_spin.setValue(steps)
    with qtbot.waitSignal(features.generation.ended, timeout=GENERATION_TIMEOUT_MS) as ended:
        if click:
            qtbot.mouseClick(features.sampling_panel.generate_button, Qt.MouseButton.LeftButton)
        else:
            qtbot.keyClick(features.host, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)  # Ctrl+G
    qtbot.waitUntil(lambda: not features.services.runner.jobs, timeout=10_000)
    return ended.args[0]


def click_item(qtbot, combo, text: str) -> None:
    """Open the combo box's list with a click and pick the item in it with the keys, as a person does (a
    click inside a list that has only just opened is taken by Qt as the end of the opening click)."""
    qtbot.mouseClick(combo, Qt.MouseButton.LeftButton)
    view = combo.view()
    qtbot.waitUntil(view.isVisible, timeout=5_000)
    row = combo.findText(text)
    assert row >= 0, f"no {text!r} among {[combo.itemText(i) for i in range(combo.count())]}"
    qtbot.keyClick(view, Qt.Key.Key_Home)
    for _ in range(row):
        qtbot.keyClick(view, Qt.Key.Key_Down)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5_000)
    assert combo.currentText() == text
