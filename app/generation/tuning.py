"""Generate > Measure Settings on This Machine (Ctrl+Shift+M): ``volsynth tune`` in the background.

Besides the settings, it measures what trades fidelity for speed: step caching (the panel's default, the
forecast) and half the model's steps, each timed like the settings and judged on a whole schedule against
fp32's (``engine.measure.tune``'s trades), within the stated time budget (``MEASURE_BUDGET_S``).

Looks up what was measured for the selected model on this machine whenever the model changes (the
``MeasuredSettings`` model the Optimization panel's presets are a view of), offers the measurement the first
time a model is used here, runs it in a worker thread with progress and cancel, and pauses it while a
generation runs (the measurement would slow the generation and the generation would spoil the timings).
"""

from __future__ import annotations

import threading
from functools import partial

from app.core.measured_settings import (
    MEASURE_BUDGET_S,
    MEASURED_CACHE_ROWS,
    MeasuredSettings,
    budget_words,
)
from app.panels.optimization_panel import OptimizationPanel
from app.services import AppServices
from app.services.shortcuts import SHORTCUTS, make_action
from app.services.workers import Job, Worker

TUNE_SHORTCUT = SHORTCUTS["generate.measure"].keys
JOB_NAME = "tune"


def _lookup(source):
    """The stored result for ``source`` on this machine (imports torch for the probe: a worker thread)."""
    from engine.optimization.tune_store import load_result

    return load_result(source.weights_sha256())


def _tune_job(source, device: str, budget_s: float, pause: threading.Event, rows, trades):
    from engine.measure.tune import tune

    return tune(
        str(source.path), device, budget_s=budget_s, rows=rows, trades=trades, should_pause=pause.is_set
    )


class TuneController:
    """Owns the measuring job and keeps ``measured`` in step with the selected model."""

    BUDGET_S = MEASURE_BUDGET_S
    ROWS: list[str] | None = None  # every candidate row (tests measure fewer on their tiny models)
    CACHE_ROWS: tuple[str, ...] = MEASURED_CACHE_ROWS

    def trades(self, spec) -> list[str]:
        """Step caching and half the model's steps: what Measure now adds to the settings."""
        return [*self.CACHE_ROWS, f"steps:{max(1, spec.default_steps // 2)}"]

    def __init__(self, services: AppServices, measured: MeasuredSettings) -> None:
        self.state, self.runner, self.measured = services.state, services.runner, measured
        self.show_status = services.show_status
        parent = services.parent
        self.job: Job | None = None
        self._pause = threading.Event()  # set while a generation runs: the tuner waits between its runs
        self.action = make_action(
            parent,
            "M&easure Settings on This Machine...",
            self.start,
            "generate.measure",
            f"Measure which optimization settings, step caching and fewer steps pay for this model on this "
            f"machine, with what each costs in quality ({budget_words()}, in the background); the presets then "
            "show what was measured here",
        )
        self.cancel_action = make_action(parent, "Cancel Measuring", self.cancel)
        self.cancel_action.setEnabled(False)
        self.state.model_selected.connect(self._on_state_model_selected)
        self.state.job_changed.connect(self._on_state_job_changed)
        self.state.form.changed.connect(self._on_form_changed)
        self._on_state_model_selected(self.state.selected_model)

    def _local_source(self):
        source = self.state.selected_model
        if source is None or self.state.form.remote or not hasattr(source, "weights_sha256"):
            return None
        return source

    def start(self) -> None:
        source = self._local_source()
        if source is None:
            self.show_status("Measuring runs on this machine: choose a local model and device first")
            return
        if self.job is not None:
            return
        self.measured.set_running(True, "starting\u2026")
        worker = Worker.generator(
            partial(
                _tune_job,
                source,
                self.state.form.device,
                self.BUDGET_S,
                self._pause,
                self.ROWS,
                self.trades(source.spec),
            )
        )
        self.job = self.runner.run(
            JOB_NAME,
            worker,
            what="Measuring",
            done=partial(self._on_job_finished, source.spec.id),
            progressed=self._on_job_progressed,  # the Optimization section says it where the presets are
            failed=self._on_job_failed,
            cancelling_text="cancelling (ending the measuring processes)\u2026",
            ended=self._on_job_ended,
        )
        self.action.setEnabled(False)
        self.cancel_action.setEnabled(True)

    def cancel(self) -> None:
        if self.job is not None:
            self.measured.set_running(True, self.job.cancelling_text)
            self.job.cancel()

    # -- job events (GUI thread) ----------------------------------------------------------------------

    def _on_job_progressed(self, progress) -> None:
        self.measured.set_running(True, f"{progress.message} \u00b7 {progress.elapsed_s:.0f} s")

    def _on_job_finished(self, model_id: str, result) -> None:
        self.measured.set_running(False)
        self.measured.set_result(model_id, result)
        best = self.measured.fastest()
        self.show_status(
            f"Measured {len(result['rows'])} settings in {result['method']['wall_s']:.0f} s; fastest here: "
            f"{best['name'] if best else 'fp32'}"
        )

    def _on_job_failed(self, message: str) -> None:
        self.measured.set_error(f"Measuring failed: {message}")

    def _on_job_ended(self, outcome: str) -> None:
        self.job = None
        if outcome == "cancelled":  # the runner said "Measuring cancelled"; and nothing half-measured stays
            self.measured.set_running(False, "")
            self.show_status("Measuring cancelled; nothing was kept", 5000)
        self.action.setEnabled(True)
        self.cancel_action.setEnabled(False)
        if self.measured.running:
            self.measured.set_running(False)

    # -- keeping the lookup current -------------------------------------------------------------------

    def _on_state_model_selected(self, _source) -> None:
        if self.runner.closing:  # the window is closing (servers disconnect, models go): look nothing up
            return
        source = self._local_source()
        if source is None:
            self.measured.forget()
            return
        self.runner.run_task(
            "tune-lookup", _lookup, source, finished=partial(self._on_lookup_finished, source.spec.id)
        )

    def _on_lookup_finished(self, model_id: str, result) -> None:
        selected = self.state.selected_model
        if selected is not None and selected.spec.id == model_id:
            self.measured.set_result(model_id, result)

    def _on_form_changed(self, name: str) -> None:
        if name == "device":
            self._on_state_model_selected(self.state.selected_model)

    def _on_state_job_changed(self, running: bool) -> None:
        if running:
            self._pause.set()
        else:
            self._pause.clear()


def install_tuning(
    services: AppServices, optimization_panel: OptimizationPanel, measured: MeasuredSettings
) -> TuneController:
    """Give the main window Generate > Measure Settings on This Machine, which the Optimization section's
    (``optimization_panel``) Measure and Cancel buttons also start and stop."""
    controller = TuneController(services, measured)
    services.menus.generate.addSeparator()
    services.menus.generate.addAction(controller.action)
    services.menus.generate.addAction(controller.cancel_action)
    optimization_panel.measure_requested.connect(controller.start)
    optimization_panel.cancel_measure_requested.connect(controller.cancel)
    return controller
