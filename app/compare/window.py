"""Compare Settings: the Generate panel's request run with two optimization settings, side by side.

The window runs ``engine.compare.compare_settings`` in a worker thread (the same ``Worker.generation`` a
generation uses, through an adapter that looks like a backend: app/core/compare_runs.py), then shows:

- A as soon as its run is done, then B and B - A, in linked slice views (one crosshair, one window for A
  and B; the difference has its own window centred on zero, drawn in a diverging colour table with a
  colour bar), any plane;
- per-step latency, decode time, sampling-loop time, peak memory, what applied (and why not), with B's
  speed as a multiple of A's (one wording everywhere) and the noise rule's verdict on each
  (``engine.metrics.speed_verdict``); the bold headline is the part B's settings change (``Comparison.headline``:
  the decode for a decoder setting, the U-Net step for a U-Net one, else end to end); the table exports to
  CSV;
- how far B's volume moved from A's: PSNR, SSIM, max and mean |B - A|;
- the top operators of the kernel-profiled steps of each run.

Choices that cannot (fully) apply on the chosen device are greyed in the A and B boxes, with the reason
(``engine.optimization.apply.expected_report``, asked in a worker thread since it imports torch).

The request (model, seed, conditioning, steps, guidance, device) is the Generate panel's, with batch 1 and
no previews: a preview decode inside the loop would distort the step times being compared.
"""

from __future__ import annotations

import html
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import numpy as np
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QKeySequence,
    QLinearGradient,
    QPainter,
    QShortcut,
    QStandardItemModel,
    qRgb,
)
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QStackedWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.compare.numbers import (  # noqa: F401 - speed_text, verdict_text, WARNING_COLOUR: importable here too
    WARNING_COLOUR,
    ComparisonNumbers,
    speed_text,
    verdict_text,
)
from app.compare.outputs import CSV_DIR_KEY, ComparisonOutputs  # noqa: F401 - CSV_DIR_KEY: importable here too
from app.compare.quality import QualityView
from app.core.compare_runs import (
    SideReady,
    availability,
    comparing_backend,
    difference_window,
    repeat_job,
)
from app.core.measured_settings import FASTEST_HERE, MeasuredSettings
from app.core.optimization_presets import BLOCK_SOURCE as OPTIMIZATION_BLOCK
from app.core.optimization_presets import PRESET_TIPS, PRESETS, preset_values
from app.core.session import AppState
from app.core.volumes import VolumeEntry
from app.services import AppServices
from app.services.job_view import JobStrip
from app.services.shortcuts import SHORTCUTS
from app.services.workers import Job, Worker
from app.viewer.slice_view import SliceView
from app.widgets.eliding_combo_box import ElidingComboBox
from engine.api.optimization_config import NAMED_SETTINGS

PANEL_SETTINGS = "Generate panel settings"
SINGLE_SETTINGS_HEADING = "Single settings (volsynth bench names)"
NOT_MEASURED_YET = "not measured here yet (Generate > Measure Settings on This Machine)"
A_KEY, B_KEY = "compare/a", "compare/b"  # QSettings: the last choices
PLANES = ("axial", "coronal", "sagittal")
SIDES = ("a", "b", "diff")
# The window's keys come from the one shortcut table (app/services/shortcuts.py), which Help lists.
# They are portable key strings ("Ctrl+Return", "Esc"), never a platform StandardKey.
RUN_KEY, CANCEL_KEY = str(SHORTCUTS["compare.run"].keys), str(SHORTCUTS["compare.cancel"].keys)
COMPARE_KEYS: tuple[tuple[str, str], ...] = tuple(
    (str(SHORTCUTS[name].keys), SHORTCUTS[name].what)
    for name in ("compare.run", "compare.cancel", "compare.planes")
)
METHOD_NOTE = (
    "One run of each, A then B, in this process; Repeat runs both again, interleaved, and the verdicts count "
    "every run (the noise rule needs 3 a side). Step statistics leave out step 1 (warm-up) and the "
    "kernel-profiled steps."
)
DEFAULT_REPEATS = 2  # with the first run: the 3 runs a side the noise rule needs to decide


def _diverging_table() -> list[int]:
    """256 colours, blue (B < A) through near-black (no difference) to orange-red (B > A).

    Dark in the middle, like matplotlib's "berlin": on the dark theme, voxels where A and B agree fade into
    the background and only differences catch the eye."""
    anchors = [
        (0.0, (158, 202, 255)),
        (0.25, (40, 120, 210)),
        (0.5, (17, 17, 17)),
        (0.75, (215, 80, 40)),
        (1.0, (255, 190, 150)),
    ]
    table = []
    for index in range(256):
        x = index / 255
        for (x0, c0), (x1, c1) in zip(anchors, anchors[1:], strict=False):
            if x <= x1:
                t = (x - x0) / (x1 - x0)
                r, g, b = (round(a + t * (z - a)) for a, z in zip(c0, c1, strict=True))
                break
        table.append(qRgb(r, g, b))
    return table


DIVERGING = _diverging_table()


class DifferenceView(SliceView):
    """A slice view of B - A drawn through the diverging colour table (the window maps to the table's ends),
    through the slice view's public ``colour_table``."""

    colour_table = DIVERGING


class ColourBar(QWidget):
    """The diverging colour table with the values at its ends and centre, following a state's window."""

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.setObjectName("compareColourBar")
        # Room for the bar and the widest label ("-0.000123" or "+1.23e-05"), so nothing is clipped.
        self.setMinimumWidth(30 + self.fontMetrics().horizontalAdvance("+8.88e-88"))
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Expanding)
        self.setToolTip(
            "B − A: orange where B is brighter than A, blue where darker, dark where they agree. "
            "Right-drag in the difference view to change the range."
        )
        state.window_changed.connect(self._on_state_window_changed)

    def limits(self) -> tuple[float, float]:
        """The values at the bottom and top of the bar (the difference view's window)."""
        window, level = self.state.window
        return level - window / 2, level + window / 2

    def labels(self) -> tuple[str, str, str]:
        """The values at the top, centre and bottom; none before there is a difference to show (the
        placeholder window's +1 / +0.5 / 0 read as numbers of a run that had not happened)."""
        if self.state.shown is None:
            return "", "", ""
        low, high = self.limits()
        return f"{high:+.3g}", f"{(low + high) / 2:+.3g}".replace("+0", "0"), f"{low:+.3g}"

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        metrics = painter.fontMetrics()
        top, bottom = metrics.height() // 2 + 2, self.height() - metrics.height() // 2 - 2
        bar = QRectF(4, top, 14, max(1, bottom - top))
        gradient = QLinearGradient(bar.bottomLeft(), bar.topLeft())
        for index in range(0, 256, 15):
            gradient.setColorAt(index / 255, QColor.fromRgb(DIVERGING[index]))
        gradient.setColorAt(1.0, QColor.fromRgb(DIVERGING[255]))
        painter.fillRect(bar, gradient)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawRect(bar)
        high, middle, low = self.labels()
        x = int(bar.right()) + 5
        for text, y in ((high, bar.top()), (middle, bar.center().y()), (low, bar.bottom())):
            if not text:
                continue
            painter.drawLine(int(bar.right()), int(y), x - 1, int(y))
            painter.drawText(x, int(y + metrics.ascent() / 2 - 1), text)
        painter.end()

    def _on_state_window_changed(self, *_args) -> None:
        self.update()


class CompareWindow(QWidget):
    """A top-level window owned by the main window; ``start()`` runs, ``cancel()`` stops at the next step.

    ``device_text`` names a device as the Generate panel does; ``measured`` is what `volsynth tune` measured
    here (the ratios and "Fastest here").
    """

    comparison_ended = Signal(str)  # "finished", "cancelled" or "failed"
    side_shown = Signal(str)  # "a": A's run is done and shown while B runs
    csv_written = Signal(str)  # the path of an exported table
    availability_checked = Signal()  # the choices that cannot apply on the chosen device are greyed

    def __init__(
        self,
        services: AppServices,
        device_text: Callable[[str], str],
        measured: MeasuredSettings,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.services, self.device_text, self.measured = services, device_text, measured
        self.setWindowTitle("Compare Settings \u2014 VolSynth Studio")
        self.setObjectName("compareWindow")
        self.comparison = None
        self.unavailable: dict[str, str] = {}  # choice -> why it cannot apply on the chosen device
        self._device_key: str | None = None  # the device the reasons were checked for
        self._availability_key: tuple | None = None
        self._job: Job | None = None
        self._device = ""
        self.states = {side: AppState() for side in SIDES}
        for state in self.states.values():
            state.convention = services.state.convention

        layout = QVBoxLayout(self)
        layout.addWidget(self._build_controls())
        self.outputs = ComparisonOutputs(services, self, self.progress_label.setText)
        self.outputs.csv_written.connect(self.csv_written)
        self.outputs.saved.connect(self._on_outputs_saved)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self._build_views())
        # The numbers of one run of each, and the quality view over many seeds (app/compare/quality.py).
        self.tabs = QTabWidget()
        self.tabs.setObjectName("compareTabs")
        self.tabs.addTab(self._build_numbers(), "Speed and Volume")
        self.quality = QualityView(services, self.quality_request)
        self.tabs.addTab(self.quality, "Quality over Seeds")
        self.tabs.setTabToolTip(
            1,
            "A's and B's settings against fp32 over many seeds, with fp32 on other seeds as the noise floor",
        )
        splitter.addWidget(self.tabs)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        layout.addWidget(splitter, 1)
        self._link_views()
        self._update_source()
        self._set_running(False)
        # The keypad's Enter is a different key from Return; the hint says "Enter", so both run.
        for keys in (RUN_KEY, RUN_KEY.replace("Return", "Enter")):
            QShortcut(QKeySequence(keys), self).activated.connect(self.start)
        QShortcut(QKeySequence(CANCEL_KEY), self).activated.connect(self.cancel)
        for index in range(len(PLANES)):
            QShortcut(QKeySequence(str(index + 1)), self).activated.connect(
                partial(self.plane_box.setCurrentIndex, index)
            )
        services.state.model_selected.connect(self._on_main_changed)
        services.state.job_changed.connect(self._on_main_changed)
        services.state.form.changed.connect(self._update_source)
        services.state.form.changed.connect(self._on_form_changed)
        measured.changed.connect(self._on_measured_changed)
        self._label_choices()

    # -- building ------------------------------------------------------------------------------------

    def _build_controls(self) -> QWidget:
        box = QGroupBox("Run")
        grid = QGridLayout(box)
        # Eliding: in a narrow window "Fastest here (≥ 40 dB) · bf16, 1.30x fp32 here" ends in "…", not cut.
        self.a_box, self.b_box = ElidingComboBox(), ElidingComboBox()
        for combo, key, default in ((self.a_box, A_KEY, "Exact fp32"), (self.b_box, B_KEY, PANEL_SETTINGS)):
            # The presets by the names the Optimization section gives them, with what was measured here.
            for name in (FASTEST_HERE, *PRESETS, PANEL_SETTINGS):
                combo.addItem(name, name)
            combo.insertSeparator(combo.count())
            combo.addItem(SINGLE_SETTINGS_HEADING)  # a heading: no data, never chosen
            cast(QStandardItemModel, combo.model()).item(combo.count() - 1).setEnabled(False)
            for name in NAMED_SETTINGS:  # the names `volsynth bench` uses
                if name != "fp32":
                    combo.addItem(name, name)
            saved = self.services.settings.value(key, default, type=str)
            combo.setCurrentIndex(max(0, combo.findData(saved if combo.findData(saved) >= 0 else default)))
            combo.setToolTip(
                f"{FASTEST_HERE} and the presets: as in the Generate panel's Optimization section, each with "
                f"what was measured on this machine (Generate > Measure Settings on This Machine). "
                f"{PANEL_SETTINGS}: that section as set now. "
                "Below the line: the single settings of `volsynth bench` and `volsynth compare`. "
                "Greyed: cannot apply on the chosen device (the reason follows the name)."
            )
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(18)
            combo.view().setTextElideMode(Qt.TextElideMode.ElideNone)
            combo.currentIndexChanged.connect(partial(self._on_choice_box_changed, combo, key))
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
        # The running comparison's progress, its line and Cancel.
        self.strip = JobStrip(self, cancel_tip="Stop at the next step (Esc)")
        self.progress_bar, self.progress_label = self.strip.progress_bar, self.strip.progress_label
        self.progress_label.setWordWrap(False)
        self.cancel_button = self.strip.cancel_button
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
            # Long settings ("streamed+dec:bf16 · channels-last") wrap rather than being cut off.
            title.setWordWrap(True)
            title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            stack = QStackedWidget()
            self.views[side] = {}
            for plane in PLANES:
                view = (DifferenceView if side == "diff" else SliceView)(self.states[side], plane)
                view.empty_text = (
                    "B \u2212 A appears when both runs are done"
                    if side == "diff"
                    else f"Run the comparison ({RUN_KEY.replace('Return', 'Enter')})"
                )
                view.hovered.connect(partial(self._on_view_hovered, side))
                stack.addWidget(view)
                self.views[side][plane] = view
            self.titles[side], self.stacks[side] = title, stack
            grid.addWidget(title, 1, column)
            if side == "diff":
                self.colour_bar = ColourBar(self.states["diff"])
                holder = QHBoxLayout()
                holder.setSpacing(4)
                holder.addWidget(stack, 1)
                holder.addWidget(self.colour_bar)
                grid.addLayout(holder, 2, column)
            else:
                grid.addWidget(stack, 2, column)
            grid.setColumnStretch(column, 1)
        grid.setRowStretch(2, 1)
        return widget

    def _build_numbers(self) -> QWidget:
        widget = QWidget()
        layout = QVBoxLayout(widget)
        layout.setContentsMargins(0, 0, 0, 0)
        # The headline, the A / B / B-vs-A table and each side's top operators (app/compare/numbers.py)
        self.numbers = ComparisonNumbers()
        self.summary_label, self.table = self.numbers.summary_label, self.numbers.table
        self.kernel_tables, self.kernel_titles = self.numbers.kernel_tables, self.numbers.kernel_titles
        layout.addWidget(self.numbers, 1)
        bottom = QHBoxLayout()
        note = QLabel(METHOD_NOTE)
        note.setWordWrap(True)
        note.setObjectName("compareNote")
        bottom.addWidget(note, 1)
        # Repeat: the same comparison N more times, interleaved, so the noise rule can decide.
        self.repeat_spin = QSpinBox()
        self.repeat_spin.setRange(1, 20)
        self.repeat_spin.setValue(DEFAULT_REPEATS)
        self.repeat_spin.setSuffix(" more")
        self.repeat_spin.setToolTip("How many more runs of A and of B Repeat makes")
        self.repeat_button = QPushButton("&Repeat")
        self.repeat_button.setToolTip(
            "Run A and B again (interleaved: B first every other time, so a change in the machine's load falls "
            "on both alike) and update the numbers and verdicts with every run"
        )
        self.repeat_button.clicked.connect(self.repeat)
        bottom.addWidget(self.repeat_spin)
        bottom.addWidget(self.repeat_button)
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
        self.export_button = QPushButton("Export Table as CSV...")
        self.export_button.setToolTip("Write the numbers table (A, B, B vs A) to a .csv file")
        self.export_button.clicked.connect(self._on_export_clicked)
        bottom.addWidget(self.add_button)
        bottom.addWidget(self.export_button)
        bottom.addWidget(self.save_button)
        layout.addLayout(bottom)
        return widget

    @property
    def table_rows(self) -> list[tuple[str, ...]]:
        """The numbers table as exported (header row first); empty before a comparison."""
        return self.numbers.table_rows

    def _link_views(self) -> None:
        for side, state in self.states.items():
            state.crosshair_changed.connect(partial(self._on_crosshair_changed, side))
        for side in ("a", "b"):
            self.states[side].window_changed.connect(partial(self._on_window_changed, side))

    # -- running -------------------------------------------------------------------------------------

    @staticmethod
    def choice(combo: QComboBox) -> str:
        """The setting a side's box has chosen, by name (the item text may carry a reason after it)."""
        return combo.currentData() or combo.currentText()

    def choice_values(self) -> dict[str, dict[str, Any]]:
        """Every choice in the boxes as OptimizationConfig fields (the panel's as the form has it now)."""
        values = {name: preset_values(name) for name in PRESETS}
        fastest = self.measured.fastest_values()
        if fastest is not None:
            values[FASTEST_HERE] = {**preset_values("Exact fp32"), **fastest}
        values[PANEL_SETTINGS] = dict(self.services.state.form.optimization or {})
        values.update({name: dict(NAMED_SETTINGS[name]) for name in NAMED_SETTINGS if name != "fp32"})
        return values

    def settings_for(self, combo: QComboBox, form) -> Any:
        """The OptimizationConfig a side's choice stands for (``form``: the main window's GenerationForm)."""
        from engine.api.optimization_config import OptimizationConfig
        from engine.errors import InvalidRequest

        choice = self.choice(combo)
        if choice == PANEL_SETTINGS:
            return OptimizationConfig.from_dict(form.optimization or {})
        if choice == FASTEST_HERE:
            fastest = self.measured.fastest_values()
            if fastest is None:
                raise InvalidRequest(f"{FASTEST_HERE}: {NOT_MEASURED_YET}")
            return OptimizationConfig.from_dict({**preset_values("Exact fp32"), **fastest})
        if choice in PRESETS:
            return OptimizationConfig.from_dict(preset_values(choice))
        return OptimizationConfig.from_dict(NAMED_SETTINGS[choice])

    def start(self) -> bool:
        """Start a comparison from the Generate panel's request. False (and says why) if it cannot start."""
        from engine.errors import EngineError

        if self._job is not None:
            return False
        if self.services.state.job_running:
            self._fail_early("A generation is running. Wait for it to finish or cancel it, then compare.")
            return False
        form = self.services.state.form
        if form.model is None:
            self._fail_early("Choose a model in the Generate panel first.")
            return False
        # Refused optimization settings matter only when a side uses the panel's; any other block (a model
        # the chosen server lacks...) stops a comparison as it stops Generate.
        uses_panel = PANEL_SETTINGS in (self.choice(self.a_box), self.choice(self.b_box))
        blocked = form.blocked_reason(ignore=() if uses_panel else (OPTIMIZATION_BLOCK,))
        if blocked:
            self._fail_early(f"Cannot run this request: {blocked}")
            return False
        try:
            request = form.to_request(batch_size=1, preview_interval=0)
            config_a = self.settings_for(self.a_box, form)
            config_b = self.settings_for(self.b_box, form)
        except EngineError as exc:
            self._fail_early(str(exc))
            return False
        labels = (config_a.summary(), config_b.summary())
        if labels[0] == labels[1]:
            labels = (f"A {labels[0]}", f"B {labels[1]}")
        provider = partial(
            comparing_backend,
            self.services.backends,
            form.device,
            config_a,
            config_b,
            labels,
            self.profile_spin.value(),
        )
        self._device = form.device  # where Repeat runs again
        self._job = self.services.runner.run(
            "compare",
            Worker.generation(request, provider),
            what="Comparison",
            done=self._on_job_finished,
            strip=self.strip,
            text=f"Starting: A = {labels[0]}, B = {labels[1]}",
            cancelling_text="Cancelling at the next step...",
            progressed=self._on_job_progressed,
            ended=self._on_job_ended,
            holds_engine=True,  # one engine job at a time: Generate waits for this
        )
        self._started = time.monotonic()
        self.comparison = None
        for side in SIDES:  # the last comparison's volumes go: A shows when its run is done, B after
            self.states[side].show(None)
        self._labels = labels
        self._set_title("a", f"A \u00b7 {labels[0]} \u00b7 running...")
        self._set_title("b", f"B \u00b7 {labels[1]} \u00b7 waiting for A")
        self.titles["diff"].setText("B \u2212 A")
        self.summary_label.setText("Running A, then B...")
        self.numbers.clear_tables()
        self._set_running(True)
        self._set_empty_texts("A is running...", "B runs once A is done")
        return True

    def repeat(self) -> bool:
        """Run the shown comparison's A and B ``repeat_spin`` more times; False (and says why) if it cannot."""
        if self._job is not None or self.comparison is None:
            return False
        if self.services.state.job_running:
            self._fail_early("A generation is running. Wait for it to finish or cancel it, then repeat.")
            return False
        times = self.repeat_spin.value()
        self._job = self.services.runner.run(
            "compare-repeat",
            Worker.generator(
                partial(repeat_job, self.services.backends, self._device, self.comparison, times)
            ),
            what="Comparison",
            done=self._on_repeat_finished,
            strip=self.strip,
            text=f"Repeating A and B {times} more time(s), interleaved",
            cancelling_text="Cancelling at the next step...",
            ended=self._on_job_ended,
            holds_engine=True,
        )
        self._started = time.monotonic()
        self._set_running(True)
        return True

    def _on_repeat_finished(self, comparison) -> None:
        self.comparison = comparison
        runs = 1 + len(comparison.repeats)
        self.progress_label.setText(
            f"Done in {time.monotonic() - self._started:.1f} s: {runs} runs of each, the numbers count them all"
        )
        self.numbers.show_comparison(comparison)

    def quality_request(self):
        """What the quality view judges: the Generate panel's request (batch 1, no previews), A's and B's
        settings by label (fp32 on both sides: fp32 judged against itself on other seeds), and the device."""
        from engine.errors import InvalidRequest

        form = self.services.state.form
        if form.model is None:
            raise InvalidRequest("Choose a model in the Generate panel first.")
        uses_panel = PANEL_SETTINGS in (self.choice(self.a_box), self.choice(self.b_box))
        blocked = form.blocked_reason(ignore=() if uses_panel else (OPTIMIZATION_BLOCK,))
        if blocked:
            raise InvalidRequest(f"Cannot run this request: {blocked}")
        request = form.to_request(batch_size=1, preview_interval=0)
        settings: dict[str, Any] = {}
        for side, combo in (("A", self.a_box), ("B", self.b_box)):
            config = self.settings_for(combo, form)
            if config.summary() != "fp32" or side == "B":
                settings.setdefault(f"{side}: {config.summary()}", config)
        return request, settings, form.device

    def cancel(self) -> None:
        """Esc, Cancel or closing the window: the running comparison, or quality report, stops at its next step."""
        if self._job is not None:
            self._job.cancel()
        self.quality.cancel()

    def _fail_early(self, message: str) -> None:
        self.progress_label.setText(message)
        self.services.show_error("Cannot compare", message)

    def _set_empty_texts(self, a: str, b: str) -> None:
        """What the A and B views say while they have no volume (a run in progress, or none yet)."""
        for side, text in (("a", a), ("b", b)):
            for view in self.views[side].values():
                view.empty_text = text
                view.update()

    def _set_running(self, running: bool) -> None:
        if not running:
            idle = f"Run the comparison ({RUN_KEY.replace('Return', 'Enter')})"
            self._set_empty_texts(idle, idle)
        self.run_button.setEnabled(not running and not self.services.state.job_running)
        self.cancel_button.setEnabled(running)
        for widget in (self.a_box, self.b_box, self.profile_spin):
            widget.setEnabled(not running)
        has_result = self.comparison is not None and not running
        self.repeat_button.setEnabled(has_result and not self.services.state.job_running)
        self.repeat_spin.setEnabled(has_result)
        self.add_button.setEnabled(has_result)
        self.save_button.setEnabled(has_result)
        self.export_button.setEnabled(has_result)

    def _on_job_progressed(self, progress) -> None:
        if isinstance(progress, SideReady):  # A is done: shown while B runs (the strip shows the steps)
            self.show_side(progress.side, progress.measured)

    def _on_job_finished(self, comparison) -> None:
        self.comparison = comparison
        self.progress_label.setText(f"Done in {time.monotonic() - self._started:.1f} s")
        self.show_comparison(comparison)

    def _on_job_ended(self, outcome: str) -> None:
        """After the run's thread ended: the runner has shown a failure and freed the engine."""
        self._job = None
        self._set_running(False)
        self.comparison_ended.emit(outcome)

    # -- outputs (app/compare/outputs.py) ----------------------------------------------------------------

    def add_to_session(self) -> None:
        if self.comparison is not None:
            self.outputs.add_to_session(self.comparison)

    def _on_export_clicked(self) -> None:
        self.outputs.ask_csv_path(self.table_rows)

    def _on_save_clicked(self) -> None:
        if self.comparison is not None:
            self.outputs.ask_folder(self.comparison)

    def save_to(self, folder) -> None:
        """Write the comparison's files to ``folder`` in the background."""
        if self.comparison is not None:
            self.save_button.setEnabled(False)
            self.outputs.save_to(self.comparison, folder)

    def _on_outputs_saved(self) -> None:
        self.save_button.setEnabled(self.comparison is not None)

    # -- showing -------------------------------------------------------------------------------------

    def _show_volume(self, side: str, data: np.ndarray, affine, name: str) -> None:
        data = data[0] if data.ndim == 4 else data
        self.states[side].show(
            VolumeEntry(
                name=name,
                data=np.ascontiguousarray(data, dtype=np.float32),
                affine=np.asarray(affine),
                kind="generated",
                synthetic=True,
            )
        )

    def _set_title(self, side: str, text: str) -> None:
        self.titles[side].setText(text)
        self.titles[side].setToolTip(text)

    def show_side(self, side: str, measured) -> None:
        """Show one finished run (A, while B still runs): its volume, title and step time."""
        self._show_volume(side, measured.result.volume(), measured.result.affine, f"A {measured.label}")
        step = "" if measured.step_ms_median is None else f" \u00b7 {measured.step_ms_median:.1f} ms/step"
        self._set_title(side, f"{side.upper()} \u00b7 {measured.label}{step}")
        if side == "a":  # B starts now
            self._set_title("b", f"B \u00b7 {self._labels[1]} \u00b7 running...")
            self._set_empty_texts("A is running...", "B is running...")
        pace = "" if measured.step_ms_median is None else f", {measured.step_ms_median:.1f} ms per step"
        self.summary_label.setText(f"A ({html.escape(measured.label)}) is done{pace}; running B...")
        self.side_shown.emit(side)

    def show_comparison(self, comparison) -> None:
        """Fill the views and tables from an ``engine.compare.Comparison``."""
        a, b = comparison.a, comparison.b
        affine = np.asarray(a.result.affine)
        volumes = {"a": a.result.volume(), "b": b.result.volume(), "diff": comparison.difference()}
        for side, data in volumes.items():
            name = {"a": f"A {a.label}", "b": f"B {b.label}", "diff": "B - A"}[side]
            self._show_volume(side, data, affine, name)
        diff = volumes["diff"][0] if volumes["diff"].ndim == 4 else volumes["diff"]
        self.states["diff"].set_window(*difference_window(diff))
        spread = self.states["diff"].window[0] / 2
        self._set_title("a", f"A \u00b7 {a.label}")
        self._set_title("b", f"B \u00b7 {b.label}")
        self.titles["diff"].setText(
            "B \u2212 A"
            + (
                "  (identical)"
                if comparison.max_abs_err == 0
                # The bar spans the 99.9th percentile, not the maximum: say so, and that beyond it is clipped.
                else f"  (max |B\u2212A| {comparison.max_abs_err:.3g}; the bar spans \u00b1{spread:.3g}, 99.9% of "
                "voxels, and larger differences show at its end colours)"
            )
        )
        self.numbers.show_comparison(comparison)
        self._set_running(False)

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

    def _on_choice_box_changed(self, combo: QComboBox, key: str, _index: int) -> None:
        self.services.settings.setValue(key, self.choice(combo))

    def refresh_availability(self) -> None:
        """Grey the choices that cannot apply on the chosen device (checked in a worker: it imports torch)."""
        form = self.services.state.form
        choices = self.choice_values()
        key = (
            form.device,
            getattr(form.model, "id", None),
            repr(sorted(choices[PANEL_SETTINGS].items())),
            repr(sorted(choices.get(FASTEST_HERE, {}).items())),
        )
        if key == self._availability_key:
            return
        self._availability_key = key
        spec = getattr(form.model, "spec", None)
        self.services.runner.run_task(
            "compare-availability",
            availability,
            form.device,
            choices,
            spec,
            finished=partial(self._on_availability_finished, key),
        )

    def _on_availability_finished(self, key: tuple, reasons: dict[str, str]) -> None:
        if key != self._availability_key:
            return  # the device changed again meanwhile; a newer answer is on its way
        self.unavailable = dict(reasons)
        self._device_key = key[0]
        self._label_choices()
        self.availability_checked.emit()

    def _label_choices(self) -> None:
        """Each choice's text: its name with what was measured here, or why it cannot apply (greyed)."""
        measured = self.measured
        device = self.device_text(self._device_key or self.services.state.form.device)
        for combo in (self.a_box, self.b_box):
            model = cast(QStandardItemModel, combo.model())
            for index in range(combo.count()):
                name = combo.itemData(index)
                if not name:
                    continue  # the separator and the heading
                item = model.item(index)
                if name == FASTEST_HERE and measured.fastest_values() is None:
                    item.setEnabled(False)
                    item.setText(f"{FASTEST_HERE} \u2014 {NOT_MEASURED_YET}")
                    item.setToolTip(measured.words(FASTEST_HERE))
                    continue
                reason = self.unavailable.get(name)
                if reason is not None:
                    item.setEnabled(False)
                    item.setText(f"{name} \u2014 not on {device}: {reason}")
                    item.setToolTip(f"Cannot fully apply on {device}: {reason}")
                    continue
                item.setEnabled(True)
                if name == FASTEST_HERE or name in PRESETS:
                    item.setText(measured.label(name))
                    item.setToolTip(f"{PRESET_TIPS.get(name, '')}\n{measured.words(name)}".strip())
                elif name == PANEL_SETTINGS:
                    item.setText(name)
                    item.setToolTip("The Optimization section of the Generate panel, as set now")
                else:
                    item.setText(measured.setting_label(name))
                    row = measured.setting_row(name)
                    item.setToolTip("" if row is None else f"Measured on this machine: {name}")

    def _on_measured_changed(self) -> None:
        self._label_choices()
        if self.isVisible():
            self.refresh_availability()

    def _on_form_changed(self, name: str = "") -> None:
        if name in ("device", "model", "optimization") and self.isVisible():
            self.refresh_availability()

    def _on_main_changed(self, *_args) -> None:
        if self._job is None:
            self._update_source()
            self._set_running(False)

    def _update_source(self, *_args) -> None:
        """Describe the request the run will use: the Generate panel's form."""
        form = self.services.state.form
        if form.model is None:
            self.source_label.setText("No model selected in the Generate panel.")
            return
        guidance = f"{form.guidance_scale:g}" if form.model.spec.supports_guidance else "1 (none)"
        device = self.device_text(form.device)
        self.source_label.setText(
            f"Request from the Generate panel: <b>{html.escape(form.model.spec.name)}</b> \u00b7 seed {form.seed} "
            f"\u00b7 {form.steps} steps \u00b7 guidance {guidance} \u00b7 device {html.escape(device)} "
            "\u00b7 batch 1, no previews"
        )

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        self._update_source()  # the Generate panel may have changed while this window was hidden
        self.refresh_availability()
        super().showEvent(event)
        if not event.spontaneous():
            # Opened by the user (Ctrl+Shift+G, the menu): the keyboard comes here at once. The platform's
            # activation arrives later (after the map, or never under a window manager that holds focus),
            # and until then the window's shortcuts (Ctrl+Return, Esc, 1-3) do not fire: a Ctrl+Return
            # pressed right after opening did nothing (issue 25's walk). Qt 6 marks setActiveWindow deprecated
            # in favour of activateWindow(), which is the asynchronous request that leaves that gap.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                QApplication.setActiveWindow(self)

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.cancel()  # a closed window's run would go on unseen; stop it
        super().closeEvent(event)
