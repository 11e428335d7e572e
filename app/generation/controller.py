"""The generation lifecycle of one main window: start a run from the form, show its progress and previews,
add its volumes to the session, cancel it, and mark it on the Metrics dock.

The worker (app/services/workers.py) drives the engine generator in its own thread; this controller lives in the GUI
thread and only receives the worker's signals. Progress is shown in the Generate panel and in the status
bar, so it stays visible whatever docks are open.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from functools import partial
from typing import Any, Protocol

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QProgressBar

from app.core.generation_form import REMOTE_PREFIX
from app.core.progress import QUIET_NOTE_S
from app.core.volumes import preview_affine
from app.panels.layout_fence import LayoutFence
from app.panels.sampling_panel import SamplingPanel
from app.services import AppServices
from app.services.shortcuts import make_action
from app.services.workers import Job, Worker
from app.viewer.tissue_toolbar import TISSUE_SHORTCUT
from app.widgets.eliding_label import ElidingLabel
from engine.formatting import count_of

log = logging.getLogger(__name__)

PREVIEW_INTERVAL_MS = 200  # draw previews at most 5 times a second
# A cancelled run that has not stopped after this long is abandoned: long enough for any real step of the
# shipped model on a CPU to end (about 1 s each here), short enough that nobody reaches for kill.
CANCEL_DEADLINE_S = 10.0
CANCEL_TICK_MS = 250  # how often the "abandoned in N s" count-down is redrawn
# The Generate panel's progress line and the status line when a run ends without a volume (a failure's own
# message is in the error dialog; the runner says "Generation cancelled").
ENDED_WORDS = {
    "failed": "Failed",
    "cancelled": "Cancelled",
    "abandoned": f"Abandoned: the run did not stop within {CANCEL_DEADLINE_S:.0f} s; its result will be dropped",
}
ENDED_STATUS = {
    "failed": "Generation failed",
    "abandoned": "Generation abandoned (it did not stop when cancelled)",
}
# The status bar's progress text at most: 'Step 12/50 · 3.4 it/s · ETA 0:11' fits whole.
STATUS_ETA_MAX_PX = 420


class RunMarks(Protocol):
    """Where runs are marked for the user (the Metrics dock): a run's start, and its end with its outcome."""

    def add_run_start(self, run_id: str) -> object: ...

    def add_run_end(self, run_id: str, outcome: str, summary: dict | None) -> object: ...


class GenerationController(QObject):
    """Runs the form's request. Signals: ``preview_drawn(step)``, ``ended(outcome)`` with outcome one of
    "finished", "cancelled", "failed" or "abandoned" (a cancel that did not stop within
    ``CANCEL_DEADLINE_S``: the run is left to end on its own and its result dropped)."""

    preview_drawn = Signal(int)
    ended = Signal(str)
    about_to_start = Signal()  # last checks of the form (the Optimization section's against the device)

    def __init__(
        self,
        services: AppServices,
        panel: SamplingPanel,
        metrics_dock: RunMarks,
        parent: QObject | None = None,
    ) -> None:
        """Runs are marked on the metrics of the machine they run on (``services.telemetry``), shown on
        ``metrics_dock``; where the last run ran goes in the status bar (``services.show_device``)."""
        super().__init__(parent)
        self.services = services
        self.state = services.state
        self.form = services.state.form
        self.panel = panel
        self.runner = services.runner
        self.backends = services.backends
        self.settings = services.settings
        self.show_status = services.show_status
        self.metrics_dock = metrics_dock
        self._job: Job | None = None
        # Only the latest preview is kept: (data, step, total, stride).
        self._pending_preview: tuple[Any, int, int, Any] | None = None
        self._last_preview_drawn = -math.inf  # time.monotonic() of the last preview drawn
        self._model_affine: Any = None
        self._model_xyz: tuple[int, int, int] = (0, 0, 0)  # the model's output grid, set at each start
        self._telemetry_run: tuple[str, Any] | None = None  # (run id, the metrics source it is marked on)
        self._run_device = ""
        self._cancel_deadline: float | None = None  # time.monotonic() when a cancelled run is abandoned
        # The last finished run, for its details: the engine's timings and the steps that carried a preview.
        self.last_run: dict[str, Any] = {}
        self._preview_steps: list[int] = []

        self.generate_action = make_action(
            parent,
            "&Generate",
            self.generate,
            "generate.run",
            "Generate a volume with the Generate panel's settings",
        )
        self.cancel_action = make_action(
            parent, "&Cancel Generation", self.cancel, "generate.cancel", "Stop the running generation"
        )
        self.cancel_action.setEnabled(False)
        self.random_seed_action = make_action(
            parent, "&Random Seed", self.panel.pick_random_seed, "generate.random_seed", "Pick a random seed"
        )

        # Status-bar progress: visible with any docks open (the Generate panel may be hidden or tabbed).
        self.status_progress = QProgressBar()
        self.status_progress.setObjectName("statusProgress")
        self.status_progress.setRange(0, 100)
        self.status_progress.setMaximumWidth(160)
        self.status_progress.setTextVisible(True)
        self.status_progress.hide()
        # A permanent status-bar field: a long stage message ("planning the best split of ... over 8 XLA
        # devices ...") is elided to the room the bar has, whole in its tooltip (the Generate panel's progress
        # line wraps it in full); a plain label widened the window past the screen.
        self.status_eta = ElidingLabel(max_width=STATUS_ETA_MAX_PX)
        self.status_eta.setObjectName("statusEta")
        # Its text changes at every step: fenced, so that does not lay out the whole window each time.
        self.status_eta_box = LayoutFence(self.status_eta)
        self.status_eta_box.hide()

        self._cancel_timer = QTimer(self, interval=CANCEL_TICK_MS)
        self._cancel_timer.timeout.connect(self._on_cancel_timer_timeout)
        self._preview_timer = QTimer(self, interval=PREVIEW_INTERVAL_MS)
        self._preview_timer.timeout.connect(self._on_preview_timer_timeout)
        self.panel.generate_requested.connect(self._on_panel_generate_requested)
        self.panel.cancel_requested.connect(self.cancel)
        self.state.job_changed.connect(self._on_state_job_changed)
        self.state.progress_changed.connect(self._on_state_progress_changed)

    @property
    def running(self) -> bool:
        return self._job is not None

    # -- starting and stopping -----------------------------------------------------------------------

    def generate(self) -> bool:
        """What Generate (button, Ctrl+G) does: start the form's run, or say why it cannot start."""
        if self.form.model is None or self.state.job_running:
            return False
        self.about_to_start.emit()
        blocked = self.form.blocked_reason()
        if blocked:  # the button is off and says why; a shortcut press says it here
            self.show_status(f"Cannot generate: {blocked.splitlines()[0]}", 10000)
            return False
        return self.start()

    def _on_panel_generate_requested(self) -> None:
        self.generate()

    def start(self, request=None) -> bool:
        """Start a run of ``request`` (by default the form's). Returns False, after telling the user, if it
        cannot start."""
        from engine.errors import EngineError

        if self._job is not None or self.form.model is None:
            return False
        try:
            request = request if request is not None else self.form.to_request()
        except (EngineError, ValueError) as exc:
            self.services.show_error("Cannot generate", str(exc))
            return False
        spec = self.form.model.spec
        self._model_affine = spec.affine()
        _channels, x, y, z = spec.output_shape[:4]
        self._model_xyz = (x, y, z)
        self._run_device = self.form.device
        self.state.follow_previews = True
        self._preview_steps = []
        worker = Worker.generation(request, partial(self.backends.get, self.form.device))
        self._begin_run_telemetry(self.form.device)
        self._job = self.runner.run(
            "generate",
            worker,
            what="Generation",
            done=self._on_run_finished,
            progressed=self._on_run_progressed,
            ended=self._on_run_ended,
            holds_engine=True,
        )
        self.panel.progress_label.setText("Starting...")  # this run's; other jobs leave the panel's line
        self.settings.setValue("model/last", self.form.model.id)
        self.show_status(
            f"Generating with {spec.name} on {self.device_text(self.form.device)} "
            f"({request.sampler or 'default sampler'}, seed {request.seed})..."
        )
        self._preview_timer.start()
        return True

    def cancel(self) -> None:
        """Cancel (button, Esc): stop at the next step, or abandon the run after ``CANCEL_DEADLINE_S``."""
        if self._job is None or self._cancel_deadline is not None:
            return
        self._job.cancel()
        self._cancel_deadline = time.monotonic() + CANCEL_DEADLINE_S
        self._cancel_timer.start()
        self._show_cancel_countdown()

    def _show_cancel_countdown(self) -> None:
        deadline = self._cancel_deadline if self._cancel_deadline is not None else time.monotonic()
        left = max(0, math.ceil(deadline - time.monotonic()))
        text = f"Cancelling at the next step... (abandoned in {left} s if it does not stop)"
        self.panel.progress_label.setText(text)
        self.show_status(text)

    def _on_cancel_timer_timeout(self) -> None:
        if self._job is None or self._cancel_deadline is None:
            self._cancel_timer.stop()
        elif time.monotonic() >= self._cancel_deadline:
            self.abandon()
        else:
            self._show_cancel_countdown()

    def abandon(self) -> None:
        """Give up on the running generation now: a local step is left to finish with its result dropped; an
        engine server is asked to cancel and the connection is closed. The window is free at once."""
        job = self._job
        if job is None:
            return
        self._stop_cancel_countdown()
        self.backends.discard(self._run_device)  # the next run must not share the stuck one's backend
        self.runner.abandon(job)  # ended for the user now: _on_run_ended("abandoned")

    def ran_on(self, provenance: dict) -> str:
        """Where the run happened, for people: an engine server by the name the device list gives it,
        this machine's device as the engine resolved it ("cpu", "cuda:0 (NVIDIA ...)"), not "Auto"."""
        if self._run_device.startswith(REMOTE_PREFIX):
            return self.device_text(self._run_device)
        device = str(provenance.get("device") or self._run_device)
        name = provenance.get("device_name")
        return f"{device} ({name})" if name and device.startswith("cuda") else device

    def device_text(self, device: str) -> str:
        """The device as the Generate panel lists it (an engine server by its address)."""
        return self.panel.device_label(device)

    # -- the job's reports (JobRunner.run) -------------------------------------------------------------

    def _on_run_progressed(self, progress) -> None:
        self.state.report_progress(
            progress.stage, progress.step, progress.total, progress.elapsed_s, progress.message
        )
        if progress.preview is not None:
            self._preview_steps.append(progress.step)
            self._pending_preview = (progress.preview, progress.step, progress.total, progress.preview_stride)
            # Drawn with the bar's step when the last one is old enough: waiting for the timer put the
            # preview up to a tick behind the bar. Faster previews wait for the timer (at most 5 a second).
            if time.monotonic() - self._last_preview_drawn >= PREVIEW_INTERVAL_MS / 1000:
                self._draw_pending_preview()
        if self._cancel_deadline is not None:  # a step that ended after Cancel: the count-down stays shown
            self._show_cancel_countdown()

    def _on_preview_timer_timeout(self) -> None:
        tracker = self.state.progress
        if self._cancel_deadline is None and tracker.quiet_s() >= QUIET_NOTE_S:
            self.state.progress_changed.emit(tracker)  # "waiting 1:12 for the next report" keeps counting
        self._draw_pending_preview()

    def _draw_pending_preview(self) -> None:
        if self._pending_preview is None:
            return
        data, step, total, stride = self._pending_preview
        self._pending_preview = None
        if not self.state.follow_previews:  # the user chose a volume to look at during the run
            return
        self._last_preview_drawn = time.monotonic()
        affine = preview_affine(self._model_affine, self._model_xyz, data.shape, stride)
        self.state.show_preview(data, affine, step, total)
        self.preview_drawn.emit(step)

    def _on_run_finished(self, result) -> None:
        self._stop_cancel_countdown()
        self._preview_timer.stop()
        self._pending_preview = None
        summary = self._end_run_telemetry("finished")
        if summary is not None:  # before add_result, so every volume's provenance (and sidecar) carries it
            result.provenance["telemetry"] = summary
        entries = self.state.add_result(result, show=self.state.follow_previews)
        total = result.provenance.get("timings", {}).get("total_s", 0.0)
        self.last_run = {
            "timings": dict(result.provenance.get("timings", {})),
            "step_times_s": list(result.provenance.get("step_times_s", [])),
            "preview_steps": list(self._preview_steps),
            "request": result.request.to_dict(),
        }
        where = self.ran_on(result.provenance)
        self.panel.show_finished(f"Done in {total:.1f} s \u00b7 {where}")
        self.panel.progress_bar.setValue(100)
        maps = ""
        if entries and entries[0].tissue:
            maps = f" with tissue maps {', '.join(entries[0].tissue_names)}"
            if not self.state.show_tissue:
                maps += f" ({TISSUE_SHORTCUT} overlays them)"
        self.show_status(
            f"Generated {count_of(len(entries), 'volume')}{maps} in {total:.1f} s on {where}", 10000
        )
        self.services.show_device(where)

    def _on_run_ended(self, outcome: str) -> None:
        """After the run's thread ended (or the run was abandoned): the panel and status line say how, unless
        the result already did; the runner has shown a failure's message and freed the engine."""
        self._stop_cancel_countdown()
        self._job = None
        if outcome != "finished":
            self._end_run_telemetry(outcome)
            self._stop_previews()
            self.panel.show_finished(ENDED_WORDS[outcome])
        if outcome in ENDED_STATUS:
            self.show_status(ENDED_STATUS[outcome], 10000)  # replaces "Generating with ..."
        self.ended.emit(outcome)

    def _stop_previews(self) -> None:
        self._preview_timer.stop()
        self._pending_preview = None
        if self.state.shown is not None and self.state.shown.kind == "preview":
            self.state.show(self.state.volumes[-1] if self.state.volumes else None)

    def _stop_cancel_countdown(self) -> None:
        self._cancel_timer.stop()
        self._cancel_deadline = None

    def _on_state_job_changed(self, running: bool) -> None:
        self.generate_action.setEnabled(not running)
        self.cancel_action.setEnabled(running)
        self.random_seed_action.setEnabled(not running)
        self.status_progress.setVisible(running)
        self.status_eta_box.setVisible(running)
        if running:
            self.status_progress.setValue(0)
            self.status_eta.setText("Starting...")

    def _on_state_progress_changed(self, tracker) -> None:
        self.status_progress.setUpdatesEnabled(False)  # one scheduled paint, not setValue's own repaint
        self.status_progress.setValue(tracker.percent)
        self.status_progress.setFormat(
            f"{tracker.step}/{tracker.total}" if tracker.stage == "denoise" else "%p%"
        )
        self.status_progress.setUpdatesEnabled(True)
        self.status_eta.setText(tracker.text())

    # -- telemetry -----------------------------------------------------------------------------------

    def _begin_run_telemetry(self, device: str) -> None:
        """Mark a run on the metrics of the machine it runs on (an engine server's, for a remote device)."""
        try:
            source = self.services.telemetry.run_source(device)
            run_id = f"gen-{uuid.uuid4().hex[:12]}"
            source.mark_run_start(run_id)
        except Exception:  # noqa: BLE001 - telemetry must never stop a generation
            log.warning("could not start run telemetry", exc_info=True)
            return
        self._telemetry_run = (run_id, source)
        self.metrics_dock.add_run_start(run_id)

    def _end_run_telemetry(self, outcome: str) -> dict | None:
        """End the running generation's telemetry run; its summary dict, or None if none was running."""
        run, self._telemetry_run = self._telemetry_run, None
        if run is None:
            return None
        run_id, source = run
        try:
            summary = source.mark_run_end(run_id)
        except Exception:  # noqa: BLE001
            log.warning("could not end run telemetry", exc_info=True)
            return None
        self.metrics_dock.add_run_end(run_id, outcome, summary)
        return summary


def install_generation(
    services: AppServices, sampling_panel: SamplingPanel, metrics_dock: RunMarks
) -> GenerationController:
    """Give the main window its Generate, Cancel and Random Seed actions (placed by its menus and tool bar),
    the status bar's progress and the run lifecycle, for the request of ``sampling_panel``; runs are marked
    on ``metrics_dock``."""
    controller = GenerationController(services, sampling_panel, metrics_dock, parent=services.parent)
    services.add_status_widget(controller.status_eta_box)
    services.add_status_widget(controller.status_progress)
    return controller
