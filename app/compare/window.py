"""Compare Settings: the Generate panel's request run with two optimization settings, side by side.

The window runs ``engine.compare.compare_settings`` in a worker thread (the same ``GenerationWorker`` a
generation uses, through an adapter that looks like a backend), then shows:

- A, B and B - A in linked slice views (one crosshair, one window for A and B; the difference has its own
  window centred on zero), any plane;
- per-step latency, sampling-loop time, peak memory, what applied (and why not), with B's ratio to A;
- how far B's volume moved from A's: PSNR, SSIM, max and mean |B - A|;
- the top operators of the kernel-profiled steps of each run.

The request (model, seed, conditioning, steps, guidance, device) is the Generate panel's, with batch 1 and
no previews: a preview decode inside the loop would distort the step times being compared.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.display import format_bytes
from app.core.session import AppState
from app.core.volumes import VolumeEntry
from app.panels.optimization_panel import BLOCK_SOURCE as OPTIMIZATION_BLOCK
from app.panels.optimization_panel import PRESETS, preset_values
from app.viewer.slice_view import SliceView
from app.workers import GenerationWorker
from engine.optimization_config import NAMED_SETTINGS

PANEL_SETTINGS = "Generate panel settings"
A_KEY, B_KEY = "compare/a", "compare/b"  # QSettings: the last choices
PLANES = ("axial", "coronal", "sagittal")
SIDES = ("a", "b", "diff")
METHOD_NOTE = (
    "One run of each, A then B, in this process. Step statistics leave out step 1 (warm-up) and the "
    "kernel-profiled steps. For ratios to quote, use `volsynth bench` (repeated, interleaved, one "
    "process per run)."
)


class ComparingBackend:
    """Looks like a backend to ``GenerationWorker``: ``sample(request)`` runs the whole comparison."""

    def __init__(self, backend, a, b, labels: tuple[str, str], profile_steps: int) -> None:
        self.backend, self.a, self.b, self.labels, self.profile_steps = backend, a, b, labels, profile_steps

    def sample(self, request):
        from engine.compare import compare_settings

        return compare_settings(
            self.backend, request, self.a, self.b, self.labels, kernel_profile_steps=self.profile_steps
        )


def _comparing_backend(pool, device: str, a, b, labels, profile_steps) -> ComparingBackend:
    return ComparingBackend(pool.get(device), a, b, labels, profile_steps)


def difference_window(diff: np.ndarray) -> tuple[float, float]:
    """(window, level) for a B - A volume: centred on zero, wide enough for 99.9 % of the voxels."""
    spread = float(np.percentile(np.abs(diff), 99.9)) if diff.size else 0.0
    if not spread > 0:
        spread = float(np.abs(diff).max()) if diff.size else 0.0
    return max(2.0 * spread, 1e-6), 0.0


def _ratio(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.2f}x"


class CompareWindow(QWidget):
    """A top-level window owned by the main window; ``start()`` runs, ``cancel()`` stops at the next step."""

    comparison_ended = Signal(str)  # "finished", "cancelled" or "failed"

    def __init__(self, main_window) -> None:
        super().__init__(main_window, Qt.WindowType.Window)
        self.main = main_window
        self.setWindowTitle("Compare Settings \u2014 VolSynth Studio")
        self.setObjectName("compareWindow")
        self.comparison = None
        self._job = None
        self.states = {side: AppState() for side in SIDES}
        for state in self.states.values():
            state.convention = main_window.state.convention

        layout = QVBoxLayout(self)
        layout.addWidget(self._build_controls())
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self._build_views())
        splitter.addWidget(self._build_numbers())
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        layout.addWidget(splitter, 1)
        self._link_views()
        self._update_source()
        self._set_running(False)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.start)
        QShortcut(QKeySequence("Esc"), self, activated=self.cancel)
        for index in range(len(PLANES)):
            QShortcut(
                QKeySequence(str(index + 1)), self, activated=partial(self.plane_box.setCurrentIndex, index)
            )
        main_window.state.model_selected.connect(self._on_main_changed)
        main_window.state.job_changed.connect(self._on_main_changed)
        panel = main_window.sampling_panel
        for spin in (panel.seed_spin, panel.steps_spin, panel.guidance_spin):
            spin.valueChanged.connect(self._update_source)
        panel.device_box.currentIndexChanged.connect(self._update_source)

    # -- building ------------------------------------------------------------------------------------

    def _build_controls(self) -> QWidget:
        box = QGroupBox("Run")
        grid = QGridLayout(box)
        self.a_box, self.b_box = QComboBox(), QComboBox()
        for combo, key, default in ((self.a_box, A_KEY, "Exact fp32"), (self.b_box, B_KEY, PANEL_SETTINGS)):
            combo.addItems([*PRESETS, PANEL_SETTINGS])
            combo.insertSeparator(combo.count())
            combo.addItems(
                [name for name in NAMED_SETTINGS if name != "fp32"]
            )  # the names `volsynth bench` uses
            saved = self.main.settings.value(key, default, type=str)
            combo.setCurrentText(saved if combo.findText(saved) >= 0 else default)
            combo.setToolTip(
                f"{PANEL_SETTINGS}: the Optimization section of the Generate panel, as set now. "
                "Below the line: the named settings of `volsynth bench` and `volsynth compare`."
            )
            combo.currentTextChanged.connect(partial(self.main.settings.setValue, key))
        self.profile_spin = QSpinBox()
        self.profile_spin.setRange(0, 10)
        self.profile_spin.setValue(2)
        self.profile_spin.setToolTip(
            "Denoising steps of each run to kernel-profile with torch.profiler (from step "
            "2; step 1 warms up). Profiled steps run slower and are left out of the "
            "latency numbers."
        )
        self.source_label = QLabel()
        self.source_label.setObjectName("compareSource")
        self.source_label.setWordWrap(True)
        self.run_button = QPushButton("Run Comparison")
        self.run_button.setToolTip("Run A, then B, on the same seed (Ctrl+Return)")
        self.run_button.clicked.connect(self.start)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop at the next step (Esc)")
        self.cancel_button.clicked.connect(self.cancel)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 100)
        self.progress_label = QLabel("")
        grid.addWidget(QLabel("A"), 0, 0)
        grid.addWidget(self.a_box, 0, 1)
        grid.addWidget(QLabel("B"), 0, 2)
        grid.addWidget(self.b_box, 0, 3)
        grid.addWidget(QLabel("Profiled steps"), 0, 4)
        grid.addWidget(self.profile_spin, 0, 5)
        grid.addWidget(self.run_button, 0, 6)
        grid.addWidget(self.cancel_button, 0, 7)
        grid.addWidget(self.source_label, 1, 0, 1, 8)
        grid.addWidget(self.progress_bar, 2, 0, 1, 4)
        grid.addWidget(self.progress_label, 2, 4, 1, 4)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        return box

    def _build_views(self) -> QWidget:
        widget = QWidget()
        grid = QGridLayout(widget)
        grid.setContentsMargins(0, 0, 0, 0)
        self.plane_box = QComboBox()
        self.plane_box.addItems([p.capitalize() for p in PLANES])
        self.plane_box.setToolTip("Plane shown in all three views (keys 1, 2, 3)")
        self.plane_box.currentIndexChanged.connect(self._on_plane_box_changed)
        self.readout_label = QLabel("")
        self.readout_label.setObjectName("compareReadout")
        top = QHBoxLayout()
        top.addWidget(QLabel("Plane"))
        top.addWidget(self.plane_box)
        top.addSpacing(16)
        top.addWidget(self.readout_label, 1)
        grid.addLayout(top, 0, 0, 1, 3)
        self.titles: dict[str, QLabel] = {}
        self.stacks: dict[str, QStackedWidget] = {}
        self.views: dict[str, dict[str, SliceView]] = {}
        for column, side in enumerate(SIDES):
            title = QLabel({"a": "A", "b": "B", "diff": "B \u2212 A"}[side])
            title.setObjectName(f"compareTitle-{side}")
            title.setAlignment(Qt.AlignmentFlag.AlignCenter)
            stack = QStackedWidget()
            self.views[side] = {}
            for plane in PLANES:
                view = SliceView(self.states[side], plane)
                view.hovered.connect(partial(self._on_view_hovered, side))
                stack.addWidget(view)
                self.views[side][plane] = view
            self.titles[side], self.stacks[side] = title, stack
            grid.addWidget(title, 1, column)
            grid.addWidget(stack, 2, column)
            grid.setColumnStretch(column, 1)
        grid.setRowStretch(2, 1)
        return widget

    def _build_numbers(self) -> QWidget:
        widget = QWidget()
        layout = QVBoxLayout(widget)
        layout.setContentsMargins(0, 0, 0, 0)
        self.summary_label = QLabel("Run a comparison to see what B buys against A.")
        self.summary_label.setObjectName("compareSummary")
        self.summary_label.setWordWrap(True)
        layout.addWidget(self.summary_label)
        row = QHBoxLayout()
        self.table = self._table(["A", "B", "B vs A"])
        row.addWidget(self.table, 3)
        self.kernel_tables = {}
        self.kernel_titles = {}
        for side in ("a", "b"):
            column = QVBoxLayout()
            self.kernel_titles[side] = QLabel(f"{side.upper()}: top operators")
            self.kernel_titles[side].setWordWrap(True)
            self.kernel_tables[side] = self._table(["share", "ms/step", "calls", "operator"])
            column.addWidget(self.kernel_titles[side])
            column.addWidget(self.kernel_tables[side], 1)
            row.addLayout(column, 2)
        layout.addLayout(row, 1)
        bottom = QHBoxLayout()
        note = QLabel(METHOD_NOTE)
        note.setWordWrap(True)
        note.setObjectName("compareNote")
        bottom.addWidget(note, 1)
        self.add_button = QPushButton("Add A and B to Session")
        self.add_button.setToolTip(
            "Add both volumes to the session list, with their provenance, to save or vault"
        )
        self.add_button.clicked.connect(self.add_to_session)
        self.save_button = QPushButton("Save...")
        self.save_button.setToolTip(
            "Write a.nii.gz, b.nii.gz, difference.nii.gz and compare.json to a folder"
        )
        self.save_button.clicked.connect(self._on_save_clicked)
        bottom.addWidget(self.add_button)
        bottom.addWidget(self.save_button)
        layout.addLayout(bottom)
        return widget

    @staticmethod
    def _table(headers: list[str]) -> QTableWidget:
        table = QTableWidget(0, len(headers))
        table.setHorizontalHeaderLabels(headers)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        table.setWordWrap(True)
        return table

    def _link_views(self) -> None:
        for side, state in self.states.items():
            state.crosshair_changed.connect(partial(self._on_crosshair_changed, side))
        for side in ("a", "b"):
            self.states[side].window_changed.connect(partial(self._on_window_changed, side))

    # -- running -------------------------------------------------------------------------------------

    def settings_for(self, combo: QComboBox, panel_settings) -> Any:
        """The OptimizationConfig a side's choice stands for."""
        from engine.optimization_config import OptimizationConfig

        choice = combo.currentText()
        if choice == PANEL_SETTINGS:
            return OptimizationConfig.from_dict(panel_settings.optimization or {})
        if choice in PRESETS:
            return OptimizationConfig.from_dict(preset_values(choice))
        return OptimizationConfig.from_dict(NAMED_SETTINGS[choice])

    def start(self) -> bool:
        """Start a comparison from the Generate panel's request. False (and says why) if it cannot start."""
        from engine.errors import EngineError

        if self._job is not None:
            return False
        if self.main.state.job_running:
            self._fail_early("A generation is running. Wait for it to finish or cancel it, then compare.")
            return False
        panel = self.main.sampling_panel
        if self.main.state.selected_model is None:
            self._fail_early("Choose a model in the Generate panel first.")
            return False
        settings = panel.settings()
        # Refused optimization settings matter only when a side uses the panel's; any other block (a model
        # the chosen server lacks...) stops a comparison as it stops Generate.
        uses_panel = PANEL_SETTINGS in (self.a_box.currentText(), self.b_box.currentText())
        blocked = panel.generate_blocked_reason(ignore=() if uses_panel else (OPTIMIZATION_BLOCK,))
        if blocked:
            self._fail_early(f"Cannot run this request: {blocked}")
            return False
        settings.batch_size, settings.preview_interval = 1, 0
        try:
            request = settings.to_request()
            config_a = self.settings_for(self.a_box, settings)
            config_b = self.settings_for(self.b_box, settings)
        except EngineError as exc:
            self._fail_early(str(exc))
            return False
        labels = (config_a.summary(), config_b.summary())
        if labels[0] == labels[1]:
            labels = (f"A {labels[0]}", f"B {labels[1]}")
        provider = partial(
            _comparing_backend,
            self.main.backends,
            settings.device,
            config_a,
            config_b,
            labels,
            self.profile_spin.value(),
        )
        self._job = self.main.runner.start(
            "compare",
            GenerationWorker(request, provider),
            progressed=self._on_job_progressed,
            finished=self._on_job_finished,
            failed=self._on_job_failed,
            cancelled=self._on_job_cancelled,
            ended=self._on_job_ended,
        )
        self._started = time.monotonic()
        self.main.state.set_job_running(True)  # one engine job at a time: Generate waits for this
        self._set_running(True)
        self.progress_bar.setValue(0)
        self.progress_label.setText(f"Starting: A = {labels[0]}, B = {labels[1]}")
        return True

    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()
            self.progress_label.setText("Cancelling at the next step...")

    def _fail_early(self, message: str) -> None:
        self.progress_label.setText(message)
        self.main.show_error("Cannot compare", message)

    def _set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running and not self.main.state.job_running)
        self.cancel_button.setEnabled(running)
        for widget in (self.a_box, self.b_box, self.profile_spin):
            widget.setEnabled(not running)
        has_result = self.comparison is not None and not running
        self.add_button.setEnabled(has_result)
        self.save_button.setEnabled(has_result)

    def _on_job_progressed(self, progress) -> None:
        self.progress_bar.setValue(int(round(100 * progress.fraction)))
        self.progress_label.setText(progress.message)

    def _on_job_finished(self, comparison) -> None:
        self.comparison = comparison
        self.progress_bar.setValue(100)
        self.progress_label.setText(f"Done in {time.monotonic() - self._started:.1f} s")
        self.show_comparison(comparison)
        self.comparison_ended.emit("finished")

    def _on_job_failed(self, message: str) -> None:
        self.progress_label.setText("Failed")
        self.main.show_error("Comparison failed", message)
        self.comparison_ended.emit("failed")

    def _on_job_cancelled(self) -> None:
        self.progress_label.setText("Cancelled")
        self.comparison_ended.emit("cancelled")

    def _on_job_ended(self) -> None:
        self._job = None
        self.main.state.set_job_running(False)
        self._set_running(False)

    # -- showing -------------------------------------------------------------------------------------

    def show_comparison(self, comparison) -> None:
        """Fill the views and tables from an ``engine.compare.Comparison``."""
        a, b = comparison.a, comparison.b
        affine = np.asarray(a.result.affine)
        volumes = {"a": a.result.volume(), "b": b.result.volume(), "diff": comparison.difference()}
        for side, data in volumes.items():
            data = data[0] if data.ndim == 4 else data
            name = {"a": f"A {a.label}", "b": f"B {b.label}", "diff": "B - A"}[side]
            self.states[side].show(
                VolumeEntry(
                    name=name,
                    data=np.ascontiguousarray(data, dtype=np.float32),
                    affine=affine,
                    kind="generated",
                    synthetic=True,
                )
            )
        self.states["diff"].set_window(*difference_window(volumes["diff"]))
        self.titles["a"].setText(f"A \u00b7 {a.label}")
        self.titles["b"].setText(f"B \u00b7 {b.label}")
        self.titles["diff"].setText(
            "B \u2212 A"
            + (
                "  (identical)"
                if comparison.max_abs_err == 0
                else f"  (max |B\u2212A| {comparison.max_abs_err:.3g})"
            )
        )
        self.summary_label.setText(self.summary_text(comparison))
        self._fill_table(comparison)
        for side, measured in (("a", a), ("b", b)):
            self._fill_kernels(side, measured)
        self._set_running(False)

    @staticmethod
    def summary_text(comparison) -> str:
        speed = comparison.speedup_per_step
        if speed is None:
            pace = "step times not measured (too few steps)"
        elif speed >= 1:
            pace = f"B is {speed:.2f}x as fast as A per step"
        else:
            pace = f"B is {1 / speed:.2f}x slower than A per step"
        psnr = "identical volumes" if math.isinf(comparison.psnr_db) else f"PSNR {comparison.psnr_db:.1f} dB"
        ssim = "" if comparison.ssim is None else f", SSIM {comparison.ssim:.4f}"
        return (
            f"<b>{pace}</b> (whole loop: {_ratio(comparison.speedup_loop)} as fast). "
            f"Volume moved: <b>{psnr}</b>{ssim}, max |B\u2212A| {comparison.max_abs_err:.3g}, "
            f"mean |B\u2212A| {comparison.mean_abs_err:.3g}."
        )

    def _fill_table(self, comparison) -> None:
        a, b = comparison.a, comparison.b

        def step(side) -> str:
            return (
                "n/a"
                if side.step_ms_median is None
                else f"{side.step_ms_median:.1f} ms (IQR {side.step_ms_iqr:.1f})"
            )

        def applied(side) -> str:
            return ", ".join(side.applied()) or "none (fp32)"

        def not_applied(side) -> str:
            return "\n".join(f"{name}: {reason}" for name, reason in side.not_applied()) or "\u2014"

        if a.peak_kind == "cuda_allocator":
            memory_rows = [
                (
                    "Peak memory (CUDA allocator)",
                    format_bytes(a.peak_bytes),
                    format_bytes(b.peak_bytes),
                    _ratio(b.peak_bytes / a.peak_bytes) if a.peak_bytes else "n/a",
                )
            ]
        else:
            # RSS is the process's: memory A freed stays mapped and B reuses it, so B's growth is understated
            # and a ratio would flatter B. `volsynth bench` measures each setting in its own process.
            memory_rows = [
                (
                    "Peak memory (process RSS)",
                    format_bytes(a.peak_bytes),
                    format_bytes(b.peak_bytes),
                    "n/a (1 process)",
                ),
                (
                    "  RSS growth in the run",
                    format_bytes(a.peak_over_start_bytes),
                    format_bytes(b.peak_over_start_bytes),
                    "understated for B",
                ),
            ]
        speed = comparison.speedup_per_step
        rows = [
            ("Step (median)", step(a), step(b), f"{_ratio(speed)} as fast" if speed else "n/a"),
            ("Steps measured", str(a.steps_measured), str(b.steps_measured), ""),
            (
                "Sampling loop",
                f"{a.loop_s:.2f} s",
                f"{b.loop_s:.2f} s",
                f"{_ratio(comparison.speedup_loop)} as fast",
            ),
            *memory_rows,
            ("Applied", applied(a), applied(b), ""),
            ("Did not apply", not_applied(a), not_applied(b), ""),
        ]
        self.table.setRowCount(len(rows))
        self.table.setVerticalHeaderLabels([r[0] for r in rows])
        for row, (_, *cells) in enumerate(rows):
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.table.setItem(row, column, item)
        self.table.resizeRowsToContents()

    def _fill_kernels(self, side: str, measured) -> None:
        table, title = self.kernel_tables[side], self.kernel_titles[side]
        profile = measured.kernel_profile
        if not profile or not profile.get("operators"):
            title.setText(f"{side.upper()} \u00b7 {measured.label}: no kernel profile (profiled steps 0)")
            table.setRowCount(0)
            return
        steps = profile["steps"]
        span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}\u2013{steps[-1]}"
        title.setText(
            f"{side.upper()} \u00b7 {measured.label}: top operators by {profile['clock'].upper()} self "
            f"time, {span}, {profile['total_ms_per_step']:.1f} ms per step"
        )
        operators = profile["operators"][:10]
        table.setRowCount(len(operators))
        for row, op in enumerate(operators):
            cells = (
                f"{100 * op['share']:.1f} %",
                f"{op['self_ms_per_step']:.2f}",
                f"{op['calls_per_step']:.0f}",
                op["name"],
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(op["name"])
                if column < 3:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                table.setItem(row, column, item)
        table.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        for column in range(3):
            table.horizontalHeader().setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)

    # -- actions -------------------------------------------------------------------------------------

    def add_to_session(self) -> None:
        if self.comparison is None:
            return
        seed = self.comparison.a.result.request.seed
        for side in (self.comparison.a, self.comparison.b):
            self.main.state.add_result(side.result, label=f"seed {seed} \u00b7 {side.label}")
        self.main.show_status("Added A and B to the session", 5000)

    def _on_save_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Save Comparison To Folder")
        if folder:
            self.save_to(folder)

    def save_to(self, folder) -> None:
        """Write the comparison's files in a worker thread (``engine.compare.save_comparison``)."""
        if self.comparison is None:
            return
        from engine.compare import save_comparison

        self.save_button.setEnabled(False)
        self.main.runner.run_task(
            "save-compare",
            save_comparison,
            self.comparison,
            folder,
            finished=self._on_saved,
            failed=self._on_save_failed,
        )

    def _on_saved(self, paths) -> None:
        self.save_button.setEnabled(self.comparison is not None)
        folder = paths[0].parent if paths else ""
        self.progress_label.setText(f"Saved {len(paths)} files to {folder}")
        self.main.show_status(f"Comparison saved to {folder}", 10000)

    def _on_save_failed(self, message: str) -> None:
        self.save_button.setEnabled(self.comparison is not None)
        self.main.show_error("Could not save the comparison", message)

    # -- linking and events --------------------------------------------------------------------------

    def _on_crosshair_changed(self, source: str, ras) -> None:
        for side, state in self.states.items():
            if side != source and state.shown is not None:
                state.set_crosshair(ras)  # returns at once when already there, so no ping-pong

    def _on_window_changed(self, source: str, window: float, level: float) -> None:
        other = self.states["b" if source == "a" else "a"]
        if other.window != (window, level):
            other.set_window(window, level, preset=self.states[source].window_preset)

    def _on_plane_box_changed(self, index: int) -> None:
        for stack in self.stacks.values():
            stack.setCurrentIndex(index)

    def _on_view_hovered(self, side: str, text: str) -> None:
        name = {"a": "A", "b": "B", "diff": "B\u2212A"}[side]
        self.readout_label.setText(f"{name}: {text}" if text else "")

    def _on_main_changed(self, *_args) -> None:
        if self._job is None:
            self._update_source()
            self._set_running(False)

    def _update_source(self, *_args) -> None:
        """Describe the request the run will use. Read from the panel's controls, not ``settings()``: that runs
        the settings hooks, and the optimization panel's may import torch, which must not happen here."""
        panel = self.main.sampling_panel
        source = self.main.state.selected_model
        if source is None:
            self.source_label.setText("No model selected in the Generate panel.")
            return
        guidance = f"{panel.guidance_spin.value():g}" if panel.guidance_spin.isEnabled() else "1 (none)"
        self.source_label.setText(
            f"Request from the Generate panel: <b>{source.spec.name}</b> \u00b7 seed {panel.seed_spin.value()} "
            f"\u00b7 {panel.steps_spin.value()} steps \u00b7 guidance {guidance} \u00b7 device "
            f"{panel.device_box.currentText()} \u00b7 batch 1, no previews"
        )

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        self._update_source()  # the Generate panel may have changed while this window was hidden
        super().showEvent(event)

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.cancel()  # a closed window's run would go on unseen; stop it
        super().closeEvent(event)
