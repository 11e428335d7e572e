"""The Cohort dialog: write a cohort spec, run it (locally or on a Ray cluster), watch it, open its volumes.

What every volume is (model, sampler, steps, guidance, modality, size, spacing, optimization settings) is the
Generate panel's, read from the generation form whenever it changes and again at Run: the dialog shows it and
keeps no copy. Seeds, draws, how the conditions vary, the device and a typed plan are the dialog's own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import cast

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QPixmap, QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.cohort.draft import (
    MODES,
    CohortDraft,
    DeviceChoice,
    default_name,
    estimate_seconds,
    last_step_seconds,
    load_montage,
    local_devices,
    montage_caption,
    montage_picks,
    parallel_workers,
    settings_text,
    step_device_kind,
    torch_settings_problem,
)
from app.core.display import modality_title
from app.services import AppServices
from app.services.job_view import JobStrip
from app.services.workers import Job, Worker
from app.widgets.theme import NOTE_COLOUR
from engine.errors import EngineError
from engine.formatting import count_of, format_duration


def cohort_worker(
    spec,
    root: str,
    address: str | None,
    workers: int | None,
    device: str = "auto",
    xla_plan: str | None = None,
    xla_devices: int | None = None,
) -> Worker:
    """A worker that runs ``engine.cohort.run_cohort``; ``cancel()`` stops it after the items in flight.

    ``device`` is the engine's (auto, cpu, cuda, xla); on xla, ``xla_devices`` in all, split into groups
    of ``xla_plan``'s mesh, one worker each. It reports ``engine.cohort.CohortProgress`` as ``progressed``
    and the ``CohortSummary`` as ``finished`` (``stopped`` says whether Stop ended it).
    """
    xla = {"xla_plan": xla_plan, "xla_devices": xla_devices} if device == "xla" else {}

    def work(worker: Worker):
        from engine.cohort import run_cohort

        return run_cohort(
            spec,
            root,
            address=address,
            workers=workers,
            device=device,
            **xla,
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
        for changed in (self.a.valueChanged, self.b.valueChanged, self.n.valueChanged):
            changed.connect(on_change)
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


class FittingImage(QLabel):
    """An image scaled into whatever room the layout gives it (a fixed 480x320 was cut off in a small
    dialog); its size never follows the image, so rescaling cannot change the layout."""

    def __init__(self) -> None:
        super().__init__()
        self._source: QPixmap | None = None
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setMinimumSize(1, 1)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)

    def set_image(self, pixmap: QPixmap) -> None:
        self._source = pixmap
        self._fit()

    def _fit(self) -> None:
        if self._source is not None:
            self.setPixmap(
                self._source.scaled(
                    max(1, self.width()),
                    max(1, self.height()),
                    Qt.AspectRatioMode.KeepAspectRatio,
                    Qt.TransformationMode.SmoothTransformation,
                )
            )

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(event)
        self._fit()


class CohortDialog(QDialog):
    """Generate > Cohort...: the spec, the run, the finished volumes and a montage of a sample of them."""

    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        """A finished volume is opened with ``services.open_path``; the run goes through ``services.runner``."""
        super().__init__(parent)
        state = services.state
        self.state, self.runner, self.open_path = state, services.runner, services.open_path
        self.setWindowTitle("Cohort")
        self.draft = CohortDraft.from_form(state.form)
        # The name and output folder follow the model until the user writes their own.
        self.name_typed = self.out_typed = False
        self.machine = local_devices()
        self.choice = DeviceChoice()
        self.step_s = last_step_seconds(state.volumes, step_device_kind(self.choice, self.machine))
        # Seconds per step measured by this dialog's runs, per device kind (cpu, cuda, xla): the estimate's.
        self.run_step_s: dict[str, float] = {}
        self.run_device_kind = "cpu"  # the kind of device the running cohort's step times come from
        self.plan_typed = False  # the user wrote the plan: the Plan view's plan no longer replaces it
        self.job: Job | None = None
        self.summary = None
        self.finished_paths: list[str] = []
        self._build()
        self._offer_form_plan()
        self._on_device_edited()
        state.form.changed.connect(self._on_form_changed)

    # -- layout ----------------------------------------------------------------------------------------
    def _build(self) -> None:
        # Everything in a scroll area that scrolls up and down only: on a small screen (1024x700) the rows
        # stay whole and the dialog fits; the focused widget is scrolled into view.
        self.scroll_area = QScrollArea()
        self.scroll_area.setObjectName("cohortScroll")
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        content = QWidget()
        self.scroll_area.setWidget(content)
        page = QVBoxLayout(self)
        page.setContentsMargins(0, 0, 0, 0)
        page.addWidget(self.scroll_area)
        outer = QVBoxLayout(content)
        spec_box = QGroupBox("Cohort")
        form = QFormLayout(spec_box)
        self.spec_form = form
        self.name_edit = QLineEdit(self.draft.name)
        self.name_edit.textEdited.connect(self._on_name_typed)
        form.addRow("Name", self.name_edit)
        self.model_label = QLabel()
        self.model_label.setObjectName("cohortModel")
        form.addRow("Model", self.model_label)
        self.sampler_label = QLabel()
        self.sampler_label.setObjectName("cohortSampling")
        self.sampler_label.setWordWrap(True)
        form.addRow("Sampling", self.sampler_label)
        self.optimization_label = QLabel()
        self.optimization_label.setObjectName("cohortOptimization")
        self.optimization_label.setWordWrap(True)
        form.addRow("Optimization", self.optimization_label)
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
        self._first_condition_row = form.rowCount()  # the conditions' rows start here
        self._add_condition_rows()
        for widget in (self.seeds_spin, self.draws_spin, self.draw_seed_spin):
            widget.valueChanged.connect(self._on_draft_edited)
        self.name_edit.textChanged.connect(self._on_draft_edited)
        self.count_label = QLabel()
        self.count_label.setObjectName("cohortCount")
        form.addRow("Volumes", self.count_label)
        outer.addWidget(spec_box)

        run_box = QGroupBox("Run")
        grid = QGridLayout(run_box)
        self.out_edit = QLineEdit(self._default_out())
        self.out_edit.textEdited.connect(self._on_out_typed)
        self.browse_button = browse = QPushButton("Browse...")
        browse.clicked.connect(self._on_browse_clicked)
        grid.addWidget(QLabel("Output folder"), 0, 0)
        grid.addWidget(self.out_edit, 0, 1)
        grid.addWidget(browse, 0, 2)
        self.address_edit = QLineEdit()
        self.address_edit.setPlaceholderText("empty: this computer; or a Ray cluster, ray://host:10001")
        self.address_edit.textChanged.connect(self._on_device_edited)
        self.workers_spin = QSpinBox()
        self.workers_spin.setRange(0, 1024)
        self.workers_spin.setSpecialValueText("auto")
        self.workers_spin.valueChanged.connect(self._on_device_edited)
        cluster_row = QHBoxLayout()
        cluster_row.addWidget(self.address_edit, 1)
        cluster_row.addWidget(QLabel("Workers"))
        cluster_row.addWidget(self.workers_spin)
        grid.addWidget(QLabel("Cluster address"), 1, 0)
        grid.addLayout(cluster_row, 1, 1, 1, 2)
        self._build_device_rows(grid, 2)
        buttons = QHBoxLayout()
        self.run_button = QPushButton("&Run Cohort")
        self.run_button.clicked.connect(self._on_run_clicked)
        # The running cohort's progress, its line and Stop (after the volumes in flight).
        self.strip = JobStrip(self, cancel_text="&Stop", cancel_tip="Stop after the volumes in flight")
        self.stop_button = self.strip.cancel_button
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.stop_button)
        grid.addLayout(buttons, 6, 0, 1, 3)
        self.progress, self.status = self.strip.progress_bar, self.strip.progress_label
        self.status.setText("Not started")
        grid.addWidget(self.progress, 7, 0, 1, 3)
        grid.addWidget(self.status, 8, 0, 1, 3)
        grid.setColumnStretch(1, 1)
        outer.addWidget(run_box)
        for first, second in zip(self._run_tab_order, self._run_tab_order[1:], strict=False):
            QWidget.setTabOrder(first, second)

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
        self.montage_label = FittingImage()
        self.montage_caption = QLabel("")
        self.montage_caption.setObjectName("montageCaption")
        self.montage_caption.setWordWrap(True)
        montage_column = QVBoxLayout()
        montage_column.addWidget(self.montage_label, 1)
        montage_column.addWidget(self.montage_caption)
        done_layout.addLayout(montage_column, 2)
        outer.addWidget(done_box, 1)

    def _add_condition_rows(self) -> None:
        """A row per condition of the model, at the draft's values, above the volume count."""
        model = self.state.form.model
        for cond in model.spec.conditioning if model is not None else ():
            if cond.name in self.draft.conditions:
                row = ConditionRow(cond, self.draft.conditions[cond.name].a, self._on_draft_edited)
                self.spec_form.insertRow(self._first_condition_row + len(self.rows), cond.label, row)
                self.rows.append(row)

    def _replace_condition_rows(self) -> None:
        """Another model: its conditions, from the start (the last model's grids mean nothing here)."""
        for row in self.rows:
            self.spec_form.removeRow(row)
        self.rows = []
        self._add_condition_rows()

    def _default_out(self) -> str:
        return str(Path.home() / "volsynth-cohorts" / self.draft.name)

    def _on_name_typed(self, _text: str) -> None:
        self.name_typed = True

    def _on_out_typed(self, _text: str) -> None:
        self.out_typed = True

    def _build_device_rows(self, grid: QGridLayout, row: int) -> None:
        """Rows ``row``..``row + 3``: the device (and on XLA the device count), on XLA the plan and what the
        engine makes of them; the note on the torch optimization settings XLA refuses."""
        self.device_combo = QComboBox()
        self.device_combo.setObjectName("cohortDevice")
        m = self.machine
        count = f" \u00d7{m.cuda_gpus}" if m.cuda_gpus > 1 else ""
        cuda = f"CUDA ({m.cuda_name}{count})" if m.cuda_gpus else "CUDA"
        items = (
            ("auto", "Auto", True, "A GPU per worker when the cluster has GPUs, else the CPU"),
            ("cpu", "CPU", True, "The torch backend on CPU cores, whatever the cluster has"),
            (
                "cuda",
                cuda,
                m.cuda_gpus > 0,
                "One worker per CUDA GPU (torch)"
                if m.cuda_gpus
                else "No CUDA GPU on this machine (torch sees none)",
            ),
            (
                "xla",
                "XLA devices",
                m.jax,
                "The XLA (JAX) backend: one worker per group of devices, a group being a plan's mesh"
                if m.jax
                else "JAX is not installed: pip install 'volsynth-studio[xla]'",
            ),
        )
        for value, text, enabled, tip in items:
            self.device_combo.addItem(text, value)
            index = self.device_combo.count() - 1
            self.device_combo.setItemData(index, tip, Qt.ItemDataRole.ToolTipRole)
            cast(QStandardItemModel, self.device_combo.model()).item(index).setEnabled(enabled)
        self.device_combo.currentIndexChanged.connect(self._on_device_edited)
        # As wide as its longest entry: not stretched over the row when the XLA fields beside it are hidden.
        self.device_combo.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        label = QLabel("&Device")
        label.setBuddy(self.device_combo)
        self.xla_devices_spin = QSpinBox()
        self.xla_devices_spin.setObjectName("cohortXlaDevices")
        self.xla_devices_spin.setRange(1, 64)
        self.xla_devices_spin.setValue(self.choice.xla_devices)
        self.xla_devices_spin.valueChanged.connect(self._on_device_edited)
        self.xla_devices_spin.setToolTip(
            "XLA devices to use in all, split into groups of the plan's mesh, one worker each. On TPU: chips. "
            "Off-TPU each worker starts its own fake host CPU devices: they prove a sharded run right, not fast"
        )
        devices_label = QLabel("XLA de&vices")
        devices_label.setBuddy(self.xla_devices_spin)
        self.xla_devices_note = self._note_label()
        device_row = QHBoxLayout()
        for widget in (self.device_combo, devices_label, self.xla_devices_spin):
            device_row.addWidget(widget)
        device_row.addWidget(self.xla_devices_note, 1)
        device_row.addStretch(0)  # takes the room only while the note (stretch 1) is hidden
        grid.addWidget(label, row, 0)
        grid.addLayout(device_row, row, 1, 1, 2)

        self.plan_edit = QLineEdit()
        self.plan_edit.setObjectName("cohortXlaPlan")
        self.plan_edit.setPlaceholderText("empty: one device per worker; or a plan: dp2, d2xh2, dp2xd2/cut@2")
        self.plan_edit.textEdited.connect(self._on_plan_typed)
        self.plan_edit.textChanged.connect(self._on_device_edited)
        plan_label = QLabel("&Plan")
        plan_label.setBuddy(self.plan_edit)
        self.plan_note = self._note_label("cohortPlanNote")
        grid.addWidget(plan_label, row + 1, 0)
        grid.addWidget(self.plan_edit, row + 1, 1, 1, 2)
        grid.addWidget(self.plan_note, row + 2, 1, 1, 2)
        # Shown on XLA only: the device count, the plan and what the engine makes of them.
        self.xla_widgets: tuple[QWidget, ...] = (
            devices_label,
            self.xla_devices_spin,
            self.xla_devices_note,
            plan_label,
            self.plan_edit,
            self.plan_note,
        )

        self.torch_note = self._note_label("cohortTorchSettings")
        self.drop_settings_check = QCheckBox("Run this cohort &without them (plain float32)")
        self.drop_settings_check.toggled.connect(self._on_device_edited)
        notes = QVBoxLayout()
        notes.addWidget(self.torch_note)
        notes.addWidget(self.drop_settings_check)
        grid.addLayout(notes, row + 3, 0, 1, 3)
        self._run_tab_order = [
            self.out_edit,
            self.browse_button,
            self.address_edit,
            self.workers_spin,
            self.device_combo,
            self.xla_devices_spin,
            self.plan_edit,
            self.drop_settings_check,
        ]

    @staticmethod
    def _note_label(name: str = "") -> QLabel:
        label = QLabel()
        label.setObjectName(name or "hint")
        label.setWordWrap(True)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        return label

    # -- the device ------------------------------------------------------------------------------------
    def _offer_form_plan(self) -> None:
        """The plan the Plan view put into the generation form ("Use this plan") is the default plan text,
        until the user writes one."""
        plan = self.state.form.xla_plan
        if plan and not self.plan_typed and self.plan_edit.text() != plan:
            self.plan_edit.setText(plan)

    def _on_plan_typed(self, _text: str) -> None:
        self.plan_typed = True

    def _cluster(self) -> bool:
        return bool(self.address_edit.text().strip())

    def _read_device(self) -> None:
        c = self.choice
        c.device = self.device_combo.currentData() or "auto"
        c.xla_devices = self.xla_devices_spin.value()
        c.xla_plan = self.plan_edit.text().strip()

    def _workers(self) -> int | None:
        return self.workers_spin.value() or None

    def _guidance_scale(self) -> float:
        """The guidance each volume runs with: the Generate panel's, else the model's default."""
        if self.draft.request.guidance_scale is not None:
            return float(self.draft.request.guidance_scale)
        model = self.state.form.model
        spec = model.spec if model is not None else None
        return float(spec.default_guidance_scale) if spec is not None and spec.supports_guidance else 1.0

    def _plan_problem(self) -> str:
        return self.choice.plan_problem(
            self._workers(),
            tpu=self.machine.tpu,
            cluster=self._cluster(),
            guidance_scale=self._guidance_scale(),
        )

    def device_problem(self) -> str:
        """Why Run cannot start on the chosen device ("" when it can)."""
        c = self.choice
        if c.device != "xla":
            return ""
        problem = self._plan_problem()
        if problem:
            return problem
        if (
            torch_settings_problem(self.draft.request.optimization)
            and not self.drop_settings_check.isChecked()
        ):
            return "Torch optimization settings cannot run on XLA devices (see above)"
        return ""

    def _on_device_edited(self, *_args) -> None:
        self._read_device()
        c, m = self.choice, self.machine
        on_xla = c.device == "xla"
        for widget in self.xla_widgets:
            widget.setVisible(on_xla)
        if on_xla:
            if m.tpu:
                note = "TPU chips of this computer (the Ray cluster must have that many)"
            elif self._cluster():
                note = "the cluster's TPU chips; off-TPU, fake host CPU devices (correctness, not speed)"
            else:
                note = "off-TPU: fake host CPU devices, for correctness, not speed"
            self.xla_devices_note.setText(note)
            problem = self._plan_problem()
            text = problem or c.describe(self._workers(), tpu=m.tpu, cluster=self._cluster())
            form_plan = self.state.form.xla_plan
            if not problem and form_plan and c.xla_plan == form_plan:
                origin = self.state.form.xla_plan_origin or "the Plan view"
                text += f" (the plan from {origin})"
            if not problem and c.xla_plan == "best":
                text = "best: each worker's backend chooses the best plan for its group of TPU chips"
            self.plan_note.setText(text)
            colour = NOTE_COLOUR if problem else ""
            self.plan_note.setStyleSheet(f"color: {colour};" if colour else "")
        torch_problem = torch_settings_problem(self.draft.request.optimization) if on_xla else ""
        self.torch_note.setText(
            torch_problem + " Change them in the Generate panel, choose CPU or CUDA, or run without them."
            if torch_problem
            else ""
        )
        self.torch_note.setStyleSheet(f"color: {NOTE_COLOUR};")
        self.torch_note.setVisible(bool(torch_problem))
        self.drop_settings_check.setVisible(bool(torch_problem))
        kind = step_device_kind(c, m)
        self.step_s = self.run_step_s.get(kind) or last_step_seconds(self.state.volumes, kind)
        self._on_draft_edited()
        self._update_run_button()

    def _update_run_button(self) -> None:
        problem = self.draft.problem or self.device_problem()
        self.run_button.setEnabled(self.job is None and not problem)
        self.run_button.setToolTip(f"Cannot run: {problem}" if problem else "")

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
        d, request = self.draft, self.draft.request
        model = self.state.form.model
        steps = request.steps or (model.spec.default_steps if model is not None else 0)
        self.model_label.setText(model.spec.name if model is not None else "no model selected")
        output = ""
        if request.modality:  # the model chooses per request: say what every volume of the cohort will be
            output += f", {modality_title(request.modality)}"
        if request.output_size:
            output += ", " + "\u00d7".join(str(n) for n in request.output_size)
        if request.voxel_spacing_mm:
            output += " at " + "\u00d7".join(f"{v:g}" for v in request.voxel_spacing_mm) + " mm"
        guidance = "default" if request.guidance_scale is None else f"{request.guidance_scale:g}"
        self.sampler_label.setText(
            f"{request.sampler or 'default sampler'}, {steps} steps, guidance {guidance}{output} "
            "(from the Generate panel)"
        )
        self.optimization_label.setText(
            f"{settings_text(request.optimization)} (from the Generate panel)"
            + (f". Cannot run: {d.problem}" if d.problem else "")
        )
        self.optimization_label.setStyleSheet(f"color: {NOTE_COLOUR};" if d.problem else "")
        self.draws_spin.setEnabled(d.has_distribution)
        count = d.count
        kind = step_device_kind(self.choice, self.machine)
        where = {"xla": "on XLA", "cuda": "on CUDA", "cpu": "on CPU"}[kind]
        at_once = parallel_workers(self.choice, self._workers(), self.machine, cluster=self._cluster())
        eta = estimate_seconds(count, steps, self.step_s, at_once)
        if eta is None:
            estimate = f"time unknown until a volume has been generated {where}"
        else:
            parallel = f", {at_once} at a time" if at_once > 1 else ""
            estimate = f"about {format_duration(eta)} ({self.step_s:.2f} s per step, last measured {where}{parallel})"
        self.count_label.setText(f"{count_of(count, 'volume')} \u00b7 {estimate}")

    # -- running ---------------------------------------------------------------------------------------
    def _on_browse_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Cohort output folder", self.out_edit.text())
        if folder:
            self.out_edit.setText(folder)

    def _on_run_clicked(self) -> None:
        self._follow_form()  # what the Generate panel holds now, whatever was said of it before
        self._read_widgets()
        self._read_device()
        problem = self.draft.problem or self.device_problem()
        if problem:
            self.status.setText(f"Cannot run: {problem}")
            return
        draft = self.draft
        if self.choice.device == "xla" and self.drop_settings_check.isChecked():
            # the engine refuses torch settings on XLA
            draft = dataclasses.replace(draft, request=draft.request.replace(optimization={}))
        try:
            spec = draft.to_spec()
        except EngineError as exc:
            self.status.setText(f"Cannot run: {exc}")
            return
        self.done_list.clear()
        self.finished_paths = []
        where = self.plan_note.text() if self.choice.device == "xla" else ""
        starting = f"Starting Ray and {count_of(spec.count, 'volume')}" + (
            f" on {where}..." if where else "..."
        )
        self.status.setText(starting)  # said before the worker is made (it may take a moment)
        self.run_device_kind = step_device_kind(self.choice, self.machine)
        worker = cohort_worker(
            spec,
            self.out_edit.text().strip(),
            self.address_edit.text().strip() or None,
            self._workers(),
            **self.choice.run_options(),
        )
        self.job = self.runner.run(
            "cohort",
            worker,
            what="Cohort",
            done=self._on_cohort_finished,
            strip=self.strip,
            text=starting,
            cancelling_text="Stopping after the volumes in flight...",
            progressed=self._on_cohort_progressed,
            describe=self._progress_line,
            failed=self._on_cohort_failed,  # said in the dialog's line
            ended=self._on_cohort_ended,
        )
        self.run_button.setEnabled(False)

    @staticmethod
    def _progress_line(p) -> tuple[float | None, str]:
        eta = f", ETA {format_duration(p.eta_s)}" if p.eta_s is not None else ""
        extra = f" ({p.participant}: {p.message})" if p.event in ("retry", "failed") else ""
        text = (
            f"{p.done}/{p.total} done, {p.failed} failed, {p.retries} retried \u00b7 "
            f"{p.rate_per_min:.2f} volumes/min{eta}{extra}"
        )
        return ((p.done + p.failed) / p.total if p.total else None), text

    def _on_cohort_progressed(self, p) -> None:
        if p.step_s and p.step_s != self.run_step_s.get(self.run_device_kind):
            self.run_step_s[self.run_device_kind] = p.step_s
            self._on_device_edited()  # the estimate follows the step time measured in this run
        if p.event == "done":
            self.finished_paths.append(p.path)
            item = QListWidgetItem(f"{p.participant}  {Path(p.path).name}")
            item.setData(Qt.ItemDataRole.UserRole, p.path)
            self.done_list.addItem(item)
            self.montage_button.setEnabled(True)

    def _on_cohort_finished(self, summary) -> None:
        self.summary = summary
        word = "Stopped" if summary.stopped else "Finished"
        where = summary.devices_text() or summary.device.upper()
        self.status.setText(
            f"{word}: {summary.done}/{summary.total} volumes in {summary.root}, {summary.failed} failed, "
            f"{summary.retries} retried ({summary.volumes_per_min:.2f} volumes/min) on {where}, "
            f"{count_of(summary.workers, 'worker')}"
        )

    def _on_cohort_failed(self, message: str) -> None:
        self.status.setText(f"Cohort failed: {message}")

    def _on_cohort_ended(self, _outcome: str) -> None:
        self.job = None
        self._follow_form()  # what changed in the Generate panel while the cohort ran

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
        self.montage_caption.setText(
            montage_caption(montage_picks(self.finished_paths), len(self.finished_paths))
        )
        self.montage_label.set_image(QPixmap.fromImage(qimage))

    def showEvent(self, event) -> None:  # noqa: N802 - Qt API
        if self.job is None:
            self._follow_form()
        super().showEvent(event)

    def _on_form_changed(self, _name: str) -> None:
        if self.job is None:  # a running cohort keeps what it started with; the dialog follows when it ends
            self._follow_form()

    def _follow_form(self) -> None:
        """The Generate panel's request as it is now (model, sampler, steps, guidance, modality, size, spacing,
        optimization settings) and its Plan view plan; another model's conditions from the start, and its name
        and output folder unless the user wrote their own."""
        if self.draft.follow(self.state.form):
            self._replace_condition_rows()
            if not self.name_typed:
                self.name_edit.setText(default_name(self.state.form))
                self.draft.name = self.name_edit.text()
            if not self.out_typed:
                self.out_edit.setText(self._default_out())
        self._offer_form_plan()
        self._on_device_edited()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt API
        if self.job is not None:
            self.job.cancel()
        super().closeEvent(event)
