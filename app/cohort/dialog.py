"""The Cohort dialog: write a cohort spec, run it (locally or on a Ray cluster), watch it, open its volumes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.cohort.draft import MODES, CohortDraft, estimate_seconds, last_step_seconds, load_montage
from app.workers import Worker
from engine.errors import EngineError
from engine.formatting import format_duration


def cohort_worker(spec, root: str, address: str | None, workers: int | None) -> Worker:
    """A worker that runs ``engine.cohort.run_cohort``; ``cancel()`` stops it after the items in flight.

    It reports ``engine.cohort.CohortProgress`` as ``progressed`` and the ``CohortSummary`` as ``finished``
    (``stopped`` says whether Stop ended it).
    """

    def work(worker: Worker):
        from engine.cohort import run_cohort

        return run_cohort(
            spec,
            root,
            address=address,
            workers=workers,
            on_progress=worker.progressed.emit,
            should_stop=lambda: worker.cancel_requested,
        )

    return Worker(work, what="cohort")


class ConditionRow(QWidget):
    """One condition: mode (default / fixed / grid / normal / uniform) and its two or three numbers."""

    def __init__(self, condition, value: float, on_change) -> None:
        super().__init__()
        self.condition = condition
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.mode = QComboBox()
        self.mode.addItems(MODES)
        self.a, self.b = QDoubleSpinBox(), QDoubleSpinBox()
        for box in (self.a, self.b):
            box.setRange(-1e6, 1e6)
            box.setDecimals(2)
        self.a.setValue(value)
        self.b.setValue(condition.max)
        self.n = QSpinBox()
        self.n.setRange(1, 1000)
        self.n.setValue(3)
        self.hint = QLabel()
        for widget in (self.mode, self.a, self.b, self.n, self.hint):
            layout.addWidget(widget)
        self.mode.currentTextChanged.connect(self._on_mode_changed)
        for box in (self.a, self.b, self.n):
            box.valueChanged.connect(on_change)
        self.mode.currentTextChanged.connect(on_change)
        self._on_mode_changed(self.mode.currentText())

    def _on_mode_changed(self, mode: str) -> None:
        hints = {
            "default": f"model default ({self.condition.default:g})",
            "fixed": "value",
            "grid": "from, to, count",
            "normal": "mean, sd (clipped to the model's range)",
            "uniform": "min, max",
        }
        self.a.setEnabled(mode != "default")
        self.b.setEnabled(mode in ("grid", "normal", "uniform"))
        self.n.setEnabled(mode == "grid")
        unit = f" {self.condition.unit}" if self.condition.unit else ""
        self.hint.setText(hints[mode] + (unit if mode != "default" else ""))

    def write(self, draft) -> None:
        cond = draft.conditions[self.condition.name]
        cond.mode, cond.a, cond.b, cond.n = (
            self.mode.currentText(),
            self.a.value(),
            self.b.value(),
            self.n.value(),
        )


class CohortDialog(QDialog):
    """Generate > Cohort...: the spec, the run, the finished volumes and a montage of a sample of them."""

    def __init__(
        self, state, runner, open_path: Callable[[str], None], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.state, self.runner, self.open_path = state, runner, open_path
        self.setWindowTitle("Cohort")
        self.draft = CohortDraft.from_form(state.form)
        self.step_s = last_step_seconds(state.volumes)
        self.job = None
        self.summary = None
        self.finished_paths: list[str] = []
        self._build()
        self._on_draft_edited()

    # -- layout ----------------------------------------------------------------------------------------
    def _build(self) -> None:
        outer = QVBoxLayout(self)
        spec_box = QGroupBox("Cohort")
        form = QFormLayout(spec_box)
        self.name_edit = QLineEdit(self.draft.name)
        form.addRow("Name", self.name_edit)
        model = self.state.form.model
        self.model_label = QLabel(model.spec.name if model is not None else "no model selected")
        form.addRow("Model", self.model_label)
        self.sampler_label = QLabel()
        form.addRow("Sampling", self.sampler_label)
        self.seeds_spin = QSpinBox()
        self.seeds_spin.setRange(1, 10_000)
        self.seeds_spin.setValue(2)
        form.addRow("Seeds per point", self.seeds_spin)
        self.draws_spin = QSpinBox()
        self.draws_spin.setRange(1, 10_000)
        self.draws_spin.setValue(5)
        form.addRow("Draws (distributions)", self.draws_spin)
        self.draw_seed_spin = QSpinBox()
        self.draw_seed_spin.setRange(0, 2**31 - 1)
        form.addRow("Draw seed", self.draw_seed_spin)
        self.rows: list[ConditionRow] = []
        if model is not None:
            for cond in model.spec.conditioning:
                row = ConditionRow(cond, self.draft.conditions[cond.name].a, self._on_draft_edited)
                self.rows.append(row)
                form.addRow(cond.label, row)
        for widget in (self.seeds_spin, self.draws_spin, self.draw_seed_spin):
            widget.valueChanged.connect(self._on_draft_edited)
        self.name_edit.textChanged.connect(self._on_draft_edited)
        self.count_label = QLabel()
        self.count_label.setObjectName("cohortCount")
        form.addRow("Volumes", self.count_label)
        outer.addWidget(spec_box)

        run_box = QGroupBox("Run")
        grid = QGridLayout(run_box)
        self.out_edit = QLineEdit(str(Path.home() / "volsynth-cohorts" / self.draft.name))
        browse = QPushButton("Browse...")
        browse.clicked.connect(self._on_browse_clicked)
        grid.addWidget(QLabel("Output folder"), 0, 0)
        grid.addWidget(self.out_edit, 0, 1)
        grid.addWidget(browse, 0, 2)
        self.address_edit = QLineEdit()
        self.address_edit.setPlaceholderText("empty: this computer; or a Ray cluster, ray://host:10001")
        grid.addWidget(QLabel("Cluster address"), 1, 0)
        grid.addWidget(self.address_edit, 1, 1, 1, 2)
        self.workers_spin = QSpinBox()
        self.workers_spin.setRange(0, 1024)
        self.workers_spin.setSpecialValueText("auto")
        grid.addWidget(QLabel("Workers"), 2, 0)
        grid.addWidget(self.workers_spin, 2, 1)
        buttons = QHBoxLayout()
        self.run_button = QPushButton("Run Cohort")
        self.run_button.clicked.connect(self._on_run_clicked)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self._on_stop_clicked)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.stop_button)
        grid.addLayout(buttons, 3, 0, 1, 3)
        self.progress = QProgressBar()
        self.status = QLabel("Not started")
        self.status.setWordWrap(True)
        grid.addWidget(self.progress, 4, 0, 1, 3)
        grid.addWidget(self.status, 5, 0, 1, 3)
        outer.addWidget(run_box)

        done_box = QGroupBox("Finished volumes (double-click to open in the viewer)")
        done_layout = QHBoxLayout(done_box)
        self.done_list = QListWidget()
        self.done_list.itemActivated.connect(self._on_done_item_activated)
        done_layout.addWidget(self.done_list, 1)
        side = QVBoxLayout()
        self.open_button = QPushButton("Open in Viewer")
        self.open_button.clicked.connect(self._on_open_clicked)
        self.montage_button = QPushButton("Montage")
        self.montage_button.setEnabled(False)
        self.montage_button.clicked.connect(self._on_montage_clicked)
        side.addWidget(self.open_button)
        side.addWidget(self.montage_button)
        side.addStretch(1)
        done_layout.addLayout(side)
        self.montage_label = QLabel()
        self.montage_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        done_layout.addWidget(self.montage_label, 2)
        outer.addWidget(done_box, 1)

    # -- the spec --------------------------------------------------------------------------------------
    def _read_widgets(self) -> None:
        d = self.draft
        d.name = self.name_edit.text().strip()
        d.seeds = self.seeds_spin.value()
        d.draws = self.draws_spin.value()
        d.draw_seed = self.draw_seed_spin.value()
        for row in self.rows:
            row.write(d)

    def _on_draft_edited(self, *_args) -> None:
        self._read_widgets()
        d = self.draft
        steps = d.steps or (self.state.form.model.spec.default_steps if self.state.form.model else 0)
        self.sampler_label.setText(
            f"{d.sampler or 'default sampler'}, {steps} steps, guidance "
            f"{'default' if d.guidance_scale is None else f'{d.guidance_scale:g}'} (from the Generate panel)"
        )
        self.draws_spin.setEnabled(d.has_distribution)
        count = d.count
        eta = estimate_seconds(count, steps, self.step_s, max(1, self.workers_spin.value()))
        if eta is None:
            estimate = "time unknown until a volume has been generated"
        else:
            estimate = f"about {format_duration(eta)} ({self.step_s:.2f} s per step, last measured)"
        self.count_label.setText(f"{count} volumes \u00b7 {estimate}")

    # -- running ---------------------------------------------------------------------------------------
    def _on_browse_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Cohort output folder", self.out_edit.text())
        if folder:
            self.out_edit.setText(folder)

    def _on_run_clicked(self) -> None:
        self._read_widgets()
        try:
            spec = self.draft.to_spec()
        except EngineError as exc:
            self.status.setText(f"Cannot run: {exc}")
            return
        self.done_list.clear()
        self.finished_paths = []
        self.progress.setRange(0, spec.count)
        self.progress.setValue(0)
        self.status.setText(f"Starting Ray and {spec.count} volumes...")
        worker = cohort_worker(
            spec,
            self.out_edit.text().strip(),
            self.address_edit.text().strip() or None,
            self.workers_spin.value() or None,
        )
        self.job = self.runner.start(
            "cohort",
            worker,
            progressed=self._on_cohort_progressed,
            finished=self._on_cohort_finished,
            failed=self._on_cohort_failed,
            ended=self._on_cohort_ended,
        )
        self.run_button.setEnabled(False)
        self.stop_button.setEnabled(True)

    def _on_stop_clicked(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.status.setText("Stopping after the volumes in flight...")

    def _on_cohort_progressed(self, p) -> None:
        if p.step_s and p.step_s != self.step_s:
            self.step_s = p.step_s
            self._on_draft_edited()  # the estimate follows the step time measured in this run
        if p.event == "done":
            self.finished_paths.append(p.path)
            item = QListWidgetItem(f"{p.participant}  {Path(p.path).name}")
            item.setData(Qt.ItemDataRole.UserRole, p.path)
            self.done_list.addItem(item)
            self.montage_button.setEnabled(True)
        self.progress.setValue(p.done + p.failed)
        eta = f", ETA {format_duration(p.eta_s)}" if p.eta_s is not None else ""
        extra = f" ({p.participant}: {p.message})" if p.event in ("retry", "failed") else ""
        self.status.setText(
            f"{p.done}/{p.total} done, {p.failed} failed, {p.retries} retried \u00b7 "
            f"{p.rate_per_min:.2f} volumes/min{eta}{extra}"
        )

    def _on_cohort_finished(self, summary) -> None:
        self.summary = summary
        word = "Stopped" if summary.stopped else "Finished"
        self.status.setText(
            f"{word}: {summary.done}/{summary.total} volumes in {summary.root}, {summary.failed} failed, "
            f"{summary.retries} retried ({summary.volumes_per_min:.2f} volumes/min)"
        )

    def _on_cohort_failed(self, message: str) -> None:
        self.status.setText(f"Cohort failed: {message}")

    def _on_cohort_ended(self) -> None:
        self.job = None
        self.run_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    # -- results ---------------------------------------------------------------------------------------
    def _on_done_item_activated(self, item: QListWidgetItem) -> None:
        self.open_path(item.data(Qt.ItemDataRole.UserRole))

    def _on_open_clicked(self) -> None:
        item = self.done_list.currentItem()
        if item is not None:
            self._on_done_item_activated(item)

    def _on_montage_clicked(self) -> None:
        self.montage_button.setEnabled(False)
        self.runner.run_task(
            "cohort-montage",
            load_montage,
            list(self.finished_paths),
            finished=self._on_montage_loaded,
            failed=self._on_cohort_failed,
        )

    def _on_montage_loaded(self, image: np.ndarray) -> None:
        self.montage_button.setEnabled(True)
        image = np.ascontiguousarray(image)
        self._montage_data = image  # QImage does not copy: keep the buffer alive
        qimage = QImage(
            image.data, image.shape[1], image.shape[0], image.shape[1], QImage.Format.Format_Grayscale8
        )
        pixmap = QPixmap.fromImage(qimage)
        self.montage_label.setPixmap(
            pixmap.scaled(
                480, 320, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation
            )
        )

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt API
        if self.job is not None:
            self.job.cancel()
        super().closeEvent(event)
