"""The Generate panel: a view of the ``GenerationForm`` (model, sampler, steps, seed, conditioning, guidance,
batch, device) with Generate/Cancel and the run's progress.

Every control writes its field to the form when the user changes it and is redrawn from the form when the
form changes, so other parts (the Optimization section, the Compare window, engine servers) read and change
the form, never these widgets. The form's controls scroll; Generate, Cancel and the progress stay pinned
at the bottom so they are visible whatever else is open. Sections are added with ``add_section``.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QSlider,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.anatomy_display import condition_norm_note, condition_space_hint
from app.core.display import modality_title
from app.core.generation_form import (
    MAX_SEED,
    PREVIEW_CHOICES,
    condition_problem,
    extrapolation_note,
    random_seed,
)
from app.core.modality_notes import caveat_text, not_guaranteed
from app.core.model_words import picker_labels
from app.core.progress import ProgressTracker
from app.core.session import AppState
from app.panels.noted_row import noted_row
from app.panels.plan_line import PlanLine
from app.panels.run_box import RunBox
from app.widgets.theme import NOTE_COLOUR
from engine.api.request_fields import control_ranges

SLIDER_STEPS = 1000
BUSY_TEXT = "Waiting: another run is using the engine; Generate is free when it ends."
MIN_PANEL_WIDTH = 300


def _triple_text(values) -> str:
    return "\u00d7".join(f"{v:g}" for v in values)


class WheelGuard(QObject):
    """Wheel events over a value control change it only when it has focus; otherwise the panel scrolls.

    Scrolling a long form with the mouse must not change the sampler or the seed the pointer passes over.
    """

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            parent = watched.parentWidget()
            while parent is not None and not isinstance(parent, QAbstractScrollArea):
                parent = parent.parentWidget()
            if parent is not None:
                QApplication.sendEvent(parent.viewport(), event)
            return True
        return False

    def guard(self, widget: QWidget) -> None:
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # not WheelFocus: the wheel must not take focus
        widget.installEventFilter(self)


class ConditionControl(QWidget):
    """A slider and a spin box for one condition, in its own units and range, and a note under them.

    The spin box takes any number so that a value typed out of range is not silently cut to its first
    digits (160 max: typing 200 used to give 20); ``clamp`` brings it into range and the note says so.
    """

    edited = Signal(str, float)  # condition name, new value in range

    def __init__(self, condition, parent: QWidget | None = None, space: str | None = None) -> None:
        super().__init__(parent)
        self.condition = condition
        self.space = space  # the model's output space: a volume input is in its mL (MNI152 mL, say)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, SLIDER_STEPS)
        self.spin = QDoubleSpinBox()
        span = condition.max - condition.min
        decimals = 0 if span >= 100 else 1 if span >= 10 else 2
        self.spin.setDecimals(decimals)
        self.spin.setRange(-1e9, 1e9)
        self.spin.setKeyboardTracking(False)  # one value when the user presses Enter or leaves the field
        self.spin.setSingleStep(10**-decimals if decimals else max(1.0, round(span / 100)))
        self.spin.setSuffix(f" {condition.unit}" if condition.unit else "")
        # Sized for the condition's own numbers: the open range below would ask for room for ten digits
        # and squeeze the slider to nothing.
        widest = max((f"{v:.{decimals}f}" for v in (condition.min, condition.max)), key=len)
        self.spin.setFixedWidth(
            self.spin.fontMetrics().horizontalAdvance(f"-{widest}{self.spin.suffix()}") + 36
        )
        unit = f" {condition.unit}" if condition.unit else ""
        tip = f"{condition.label}: {condition.min:g} to {condition.max:g}{unit}"
        trained = getattr(condition, "trained_min", None), getattr(condition, "trained_max", None)
        if None not in trained:
            tip += f" (trained on {trained[0]:g} to {trained[1]:g}{unit})"
        if condition.description:
            tip += f"\n{condition.description}"
        self.setToolTip(tip)
        self.slider.setToolTip(tip)
        self.spin.setToolTip(tip)
        self.note = noted_row(self, self.slider, self.spin)  # out of the training or adult range, or clamped
        # Which space the number is in, and what it is natively ("MNI152 mL · ≈ 957 mL native"): the anatomy
        # check of the volume speaks of both.
        self.space_hint = QLabel()
        self.space_hint.setObjectName("hint")
        self.space_hint.setWordWrap(True)
        self.space_hint.hide()
        column = self.layout()
        assert isinstance(column, QVBoxLayout)  # noted_row lays the control out in one
        column.insertWidget(1, self.space_hint)
        self._clamped = ""
        self.slider.valueChanged.connect(self._on_slider_changed)
        self.spin.valueChanged.connect(self._on_spin_changed)

    def value(self) -> float:
        return float(self.spin.value())

    def show_value(self, value: float) -> None:
        """Show ``value`` (from the form) without emitting ``edited``."""
        for widget in (self.spin, self.slider):
            widget.blockSignals(True)
        self.spin.setValue(value)
        self.slider.setValue(self._position(value))
        for widget in (self.spin, self.slider):
            widget.blockSignals(False)
        self._update_note(value)

    def _position(self, value: float) -> int:
        c = self.condition
        return int(round((value - c.min) / (c.max - c.min) * SLIDER_STEPS))

    def _update_note(self, value: float) -> None:
        notes = [self._clamped] if self._clamped else []
        extrapolation = extrapolation_note(self.condition, value)
        if extrapolation:
            notes.append(extrapolation.capitalize())
        outside = condition_norm_note(self.condition, value, self.space)
        if outside:  # a value the slider offers that the check will flag: said before, not only after
            notes.append(outside)
        self.note.setText("\n".join(notes))
        self.note.setVisible(bool(notes))
        hint = condition_space_hint(self.condition, value, self.space)
        self.space_hint.setText(hint)
        self.space_hint.setVisible(bool(hint))

    def _on_slider_changed(self, position: int) -> None:
        c = self.condition
        value = c.min + (c.max - c.min) * position / SLIDER_STEPS
        self._clamped = ""
        self.spin.blockSignals(True)
        self.spin.setValue(value)
        self.spin.blockSignals(False)
        self._update_note(self.value())
        self.edited.emit(c.name, self.value())

    def _on_spin_changed(self, value: float) -> None:
        c = self.condition
        self._clamped = ""
        if not math.isfinite(value) or condition_problem(c, value):
            limit = c.max if value > c.max else c.min
            self._clamped = f"{value:g} is outside {c.min:g} to {c.max:g}: set to {limit:g}"
            value = limit
            self.spin.blockSignals(True)
            self.spin.setValue(value)
            self.spin.blockSignals(False)
        self.slider.blockSignals(True)
        self.slider.setValue(self._position(value))
        self.slider.blockSignals(False)
        self._update_note(value)
        self.edited.emit(c.name, float(value))


class SamplingPanel(QWidget):
    """Generation controls, a view of ``state.form``. Emits ``generate_requested()`` and ``cancel_requested()``."""

    generate_requested = Signal()
    cancel_requested = Signal()
    open_model_requested = Signal()
    width_wanted = Signal(int)  # the form grew wider than the panel: the window widens its dock if it can

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.form = state.form
        self.condition_controls: dict[str, ConditionControl] = {}
        self.wheel_guard = WheelGuard(self)

        self._added_devices: list[tuple[str, str]] = []  # (label, device) of engine servers connected
        model_row, seed_row = self._build_controls()
        model_group, sampling_group = self._build_groups(model_row, seed_row)
        self._lay_out(model_group, sampling_group)
        for widget in (
            self.model_box,
            self.sampler_box,
            self.steps_spin,
            self.seed_spin,
            self.guidance_spin,
            self.batch_spin,
            self.previews_box,
            self.device_box,
            self.modality_box,
            self.size_box,
        ):
            self.wheel_guard.guard(widget)

        state.models_changed.connect(self._on_state_models_changed)
        state.job_changed.connect(self._on_state_job_changed)
        state.progress_changed.connect(self._on_state_progress_changed)
        self.form.changed.connect(self._on_form_changed)
        self._show_previews()
        self.form.blocks_changed.connect(self._update_generate_button)
        self._on_state_models_changed()
        # A section that grows (the Optimization section's "All settings") asks its layout for room: widen
        # the panel then, not at the next window resize, so nothing is cut off at the right.
        self.form_widget.installEventFilter(self)
        self._fit_width()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if watched is self.form_widget and event.type() == QEvent.Type.LayoutRequest:
            self._fit_width()
        return super().eventFilter(watched, event)

    # -- extension hooks -----------------------------------------------------------------------------

    def add_section(self, title: str, widget: QWidget) -> QGroupBox:
        """Add a titled group of controls under the form (e.g. optimization settings); its value controls
        get the same wheel rule as the panel's own."""
        group = QGroupBox(title)
        inner = QVBoxLayout(group)
        inner.setContentsMargins(6, 6, 6, 6)
        inner.addWidget(widget)
        self._sections.addWidget(group)
        for child in widget.findChildren(QWidget):
            if isinstance(child, QComboBox | QAbstractSpinBox | QSlider):
                self.wheel_guard.guard(child)
        self._fit_width()
        return group

    def set_devices(self, devices: list[dict]) -> None:
        """Fill the device picker from ``engine.machine.devices.available_devices()``; added devices (engine servers) stay."""
        current = self.form.device
        self.device_box.blockSignals(True)
        self.device_box.clear()
        self.device_box.addItem("Auto", "auto")
        for device in devices:
            self.device_box.addItem(
                f"{device['id']}  \u2013  {device.get('name', '')}".strip(" \u2013"), device["id"]
            )
        for label, data in self._added_devices:
            self.device_box.addItem(label, data)
        self.device_box.blockSignals(False)
        self._show_device()
        if self.device_box.currentData() != current:
            self.form.set(device=self.device_box.currentData() or "auto")

    def add_device(self, label: str, data: str) -> None:
        """Add and select a device that is not on this machine (an engine server); it survives ``set_devices``."""
        self.remove_device(data)
        self._added_devices.append((label, data))
        self.device_box.addItem(label, data)
        self.form.set(device=data)

    def remove_device(self, data: str) -> None:
        self._added_devices = [(label, d) for label, d in self._added_devices if d != data]
        index = self.device_box.findData(data)
        if index >= 0:
            self.device_box.blockSignals(True)
            self.device_box.removeItem(index)
            self.device_box.blockSignals(False)
        if self.form.device == data:
            self.form.set(device="auto")

    def device_label(self, device: str) -> str:
        index = self.device_box.findData(device)
        return self.device_box.itemText(index) if index >= 0 else device

    def pick_random_seed(self) -> None:
        self.form.set(seed=random_seed())

    # -- drawing the form ----------------------------------------------------------------------------

    def _on_form_changed(self, name: str) -> None:
        if name == "model":
            self._show_model()
        elif name == "sampler":
            self._set_quietly(self.sampler_box.setCurrentText, self.sampler_box, self.form.sampler)
        elif name == "steps":
            self._set_quietly(self.steps_spin.setValue, self.steps_spin, self.form.steps)
        elif name == "seed":
            self._set_quietly(self.seed_spin.setValue, self.seed_spin, self.form.seed)
        elif name == "guidance_scale":
            self._set_quietly(
                self.guidance_spin.setValue, self.guidance_spin, self.form.guidance_scale or 1.0
            )
        elif name == "batch_size":
            self._set_quietly(self.batch_spin.setValue, self.batch_spin, self.form.batch_size)
        elif name == "preview_interval":
            self._show_previews()
        elif name == "device":
            self._show_device()
        elif name == "conditioning":
            for cname, control in self.condition_controls.items():
                control.show_value(self.form.conditioning.get(cname, control.condition.default))
        elif name == "modality":
            index = self.modality_box.findData(self.form.modality)
            self._set_quietly(self.modality_box.setCurrentIndex, self.modality_box, max(0, index))
            self._show_modality_caveat()
        elif name in ("output_size", "voxel_spacing_mm"):
            self._show_size()
        elif name == "xla_plan":
            self._show_plan()

    def _show_plan(self) -> None:
        """The plan line: the plan and where it came from, or the note saying why it was cleared."""
        self._sampling_form.setRowVisible(self.plan_widget, self.plan_widget.show_form(self.form))
        self._fit_width()

    def _on_plan_clear_clicked(self) -> None:
        self.form.clear_xla_plan("")

    @staticmethod
    def _set_quietly(setter, widget: QWidget, value) -> None:
        widget.blockSignals(True)
        setter(value)
        widget.blockSignals(False)

    def _show_device(self) -> None:
        index = self.device_box.findData(self.form.device)
        self._set_quietly(self.device_box.setCurrentIndex, self.device_box, max(0, index))

    def _show_model(self) -> None:
        source = self.form.model
        while self.conditioning_form.rowCount():
            self.conditioning_form.removeRow(0)
        self.condition_controls.clear()
        if source is None:
            self.model_info.setText("No model selected")
            self.conditioning_group.hide()
            self._update_generate_button()
            return
        index = self.model_box.findData(source.id)
        if index >= 0:
            self._set_quietly(self.model_box.setCurrentIndex, self.model_box, index)
        spec = source.spec
        shape = "\u00d7".join(str(s) for s in spec.output_shape[1:])
        spacing = "\u00d7".join(f"{s:g}" for s in spec.voxel_spacing_mm)
        info = f"{spec.kind} diffusion \u00b7 {shape} voxels \u00b7 {spacing} mm"
        extra = spec.extra or {}
        if getattr(spec, "modalities", ()) and extra.get("licence"):
            # What the folder says of itself (the full card: Help > About, Model card tab).
            info += f"\n{extra.get('version', '')} \u00b7 {extra['licence']} \u00b7 no tissue maps"
        self.model_info.setText(info)
        self.sampler_box.blockSignals(True)
        self.sampler_box.clear()
        self.sampler_box.addItems(list(spec.samplers))
        self.sampler_box.setCurrentText(self.form.sampler)
        self.sampler_box.blockSignals(False)
        # No more steps than the model's training timesteps (the engine refuses more).
        self.steps_spin.setMaximum(
            min(int(control_ranges()["steps"][1]), int(spec.schedule["num_train_timesteps"]))
        )
        self._set_quietly(self.steps_spin.setValue, self.steps_spin, self.form.steps)
        for condition in spec.conditioning:
            control = ConditionControl(condition, space=getattr(spec, "space", None))
            control.show_value(self.form.conditioning.get(condition.name, condition.default))
            control.edited.connect(self._on_condition_edited)
            self.wheel_guard.guard(control.slider)
            self.wheel_guard.guard(control.spin)
            self.condition_controls[condition.name] = control
            self.conditioning_form.addRow(condition.label, control)
        self.conditioning_group.setVisible(bool(spec.conditioning))
        self._show_output_choices(spec)
        self._fit_width()
        self._set_quietly(self.guidance_spin.setValue, self.guidance_spin, self.form.guidance_scale or 1.0)
        self._update_guidance_enabled()
        self._update_generate_button()

    def _show_output_choices(self, spec) -> None:
        """Modality and size pickers for a model that takes them (hidden for the others)."""
        modalities = tuple(getattr(spec, "modalities", ()) or ())
        geometry = getattr(spec, "geometry", None)
        self.modality_box.blockSignals(True)
        self.modality_box.clear()
        self._modality_caveats = not_guaranteed(spec) if modalities else {}
        for name, label in modalities:
            caveat = self._modality_caveats.get(name)
            title = modality_title(name)
            self.modality_box.addItem(f"{title} (not guaranteed)" if caveat else title, name)
            tip = f"{name} (class label {label})" + (f"\n{caveat_text(caveat)}" if caveat else "")
            self.modality_box.setItemData(self.modality_box.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
        self.modality_box.setCurrentIndex(max(0, self.modality_box.findData(self.form.modality)))
        self.modality_box.blockSignals(False)
        self._show_modality_caveat()
        self.size_box.blockSignals(True)
        self.size_box.clear()
        if geometry:
            size, spacing = spec.output_shape[1:], spec.voxel_spacing_mm
            self.size_box.addItem(f"Full {_triple_text(size)} at {_triple_text(spacing)} mm", None)
            preview = geometry.get("preview")
            if preview:
                self.size_box.addItem(
                    f"Preview {_triple_text(preview['size'])} at {_triple_text(preview['spacing_mm'])} mm",
                    (tuple(preview["size"]), tuple(preview["spacing_mm"])),
                )
        self.size_box.blockSignals(False)
        self._show_size()
        self.modality_box.setVisible(bool(modalities))
        self._show_modality_caveat()
        self.size_box.setVisible(bool(geometry))
        self.output_group.setVisible(bool(modalities) or bool(geometry))

    def _show_modality_caveat(self) -> None:
        """Under the picker, when the chosen contrast is one the model's owners do not guarantee, say so."""
        caveat = getattr(self, "_modality_caveats", {}).get(self.modality_box.currentData() or "")
        self.modality_note.setText(caveat_text(caveat) if caveat else "")
        self._output_form.setRowVisible(self.modality_note, bool(caveat))

    def _show_size(self) -> None:
        chosen = (
            (tuple(self.form.output_size), tuple(self.form.voxel_spacing_mm))
            if self.form.output_size is not None and self.form.voxel_spacing_mm is not None
            else None
        )
        index = next((i for i in range(self.size_box.count()) if self.size_box.itemData(i) == chosen), 0)
        self._set_quietly(self.size_box.setCurrentIndex, self.size_box, index)

    # -- building (one method per part, called in this order: the widgets' creation order is the Tab order)

    def _build_controls(self) -> tuple[QHBoxLayout, QHBoxLayout]:
        """The model, sampling and device controls; returns the model row and the seed row."""
        # -- model
        self.model_box = QComboBox()
        self.model_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_box.setMinimumContentsLength(14)
        self.model_box.currentIndexChanged.connect(self._on_model_box_changed)
        self.open_model_button = QToolButton()
        self.open_model_button.setText("\u2026")
        self.open_model_button.setToolTip("Open model folder... (VolSynth model or MONAI bundle)")
        self.open_model_button.clicked.connect(self.open_model_requested)
        self.model_info = QLabel()
        self.model_info.setObjectName("hint")
        self.model_info.setWordWrap(True)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model_box, 1)
        model_row.addWidget(self.open_model_button)

        # -- sampling: the number boxes' limits are the request fields' (engine.api.request_fields)
        limits = control_ranges()
        self.sampler_box = QComboBox()
        self.sampler_box.currentTextChanged.connect(self._on_sampler_box_changed)
        self.steps_spin = QSpinBox()
        self.steps_spin.setRange(*(int(v) for v in limits["steps"]))
        self.steps_spin.setToolTip("Denoising steps: more is slower and usually cleaner")
        self.steps_spin.valueChanged.connect(self._on_steps_spin_changed)
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(int(limits["seed"][0]), min(int(limits["seed"][1]), MAX_SEED))  # a 32-bit box
        # Room for ten digits, not the width Qt derives from the range's text plus margin: the Sampling
        # group then fits the Generate panel of a 1024-px window without scrolling sideways.
        self.seed_spin.setMinimumWidth(self.seed_spin.fontMetrics().horizontalAdvance("0" * 10) + 34)
        self.seed_spin.setToolTip("Same seed + same settings + same device = same volume")
        self.seed_spin.valueChanged.connect(self._on_seed_spin_changed)
        self.random_seed_button = QToolButton()
        self.random_seed_button.setText("Random")
        self.random_seed_button.setToolTip("Pick a random seed (Ctrl+R)")
        self.random_seed_button.clicked.connect(self.pick_random_seed)
        seed_row = QHBoxLayout()
        seed_row.addWidget(self.seed_spin, 1)
        seed_row.addWidget(self.random_seed_button)
        self.guidance_spin = QDoubleSpinBox()
        self.guidance_spin.setRange(*limits["guidance_scale"])
        self.guidance_spin.setSingleStep(0.5)
        self.guidance_spin.setValue(1.0)
        self.guidance_spin.setToolTip(
            "Classifier-free guidance: 1 = plain conditional sampling; higher follows "
            "the conditions more strictly"
        )
        self.guidance_spin.valueChanged.connect(self._on_guidance_spin_changed)
        self.guidance_label = QLabel("Guidance")
        self.batch_spin = QSpinBox()
        self.batch_spin.setRange(*(int(v) for v in limits["batch_size"]))
        self.batch_spin.setToolTip("Volumes generated together (same settings, consecutive noise)")
        self.batch_spin.valueChanged.connect(self._on_batch_spin_changed)
        # How often the run shows its current estimate: each preview of a latent model decodes it (in bf16
        # where the processor has native bf16 kernels, about 0.4 of the fp32 decode's time).
        self.previews_box = QComboBox()
        self.previews_box.setObjectName("previewsBox")
        for value, label in PREVIEW_CHOICES:
            self.previews_box.addItem(label, value)
        self.previews_box.setToolTip(
            "Previews of the volume while it denoises. Each one decodes the current estimate: on a CPU that "
            "costs a few steps' time, so fewer previews finish sooner. Remembered for the next start."
        )
        self.previews_box.currentIndexChanged.connect(self._on_previews_box_changed)
        self.device_box = QComboBox()
        self.device_box.addItem("Auto", "auto")
        self.device_box.addItem("CPU", "cpu")
        self.device_box.setToolTip("Where the model runs")
        self.device_box.currentIndexChanged.connect(self._on_device_box_changed)
        # -- an XLA server's plan for the next run (chosen in the Plan view), or why it was cleared
        self.plan_widget = PlanLine()
        self.plan_widget.clear_requested.connect(self._on_plan_clear_clicked)
        self.plan_label, self.plan_clear_button = self.plan_widget.label, self.plan_widget.clear_button
        self.plan_note = self.plan_widget.note
        return model_row, seed_row

    def _build_groups(self, model_row: QHBoxLayout, seed_row: QHBoxLayout) -> tuple[QGroupBox, QGroupBox]:
        """The Model and Sampling groups around the controls, and the Output and Conditioning groups."""
        model_group = QGroupBox("Model")
        model_form = QVBoxLayout(model_group)
        model_form.addLayout(model_row)
        model_form.addWidget(self.model_info)

        sampling_group = QGroupBox("Sampling")
        form = QFormLayout(sampling_group)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        form.addRow("Sampler", self.sampler_box)
        form.addRow("Steps", self.steps_spin)
        form.addRow("Seed", seed_row)
        form.addRow(self.guidance_label, self.guidance_spin)
        form.addRow("Batch", self.batch_spin)
        form.addRow("Previews", self.previews_box)
        form.addRow("Device", self.device_box)
        form.addRow("Plan", self.plan_widget)
        self._sampling_form = form
        form.setRowVisible(self.plan_widget, False)

        # -- output: modality and size, for models that let a request choose them (NV-Generate-MR-Brain)
        self.output_group = QGroupBox("Output")
        output_form = QFormLayout(self.output_group)
        output_form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.modality_box = QComboBox()
        self.modality_box.setToolTip("The MR contrast to generate (the model's class label for it)")
        self.modality_box.currentIndexChanged.connect(self._on_modality_box_changed)
        self.size_box = QComboBox()
        self.size_box.setToolTip(
            "Output size and voxel spacing. Preview: half the edges at twice the spacing (the same field of "
            "view), about 8x faster"
        )
        self.size_box.currentIndexChanged.connect(self._on_size_box_changed)
        self.modality_note = QLabel()
        self.modality_note.setObjectName("hint")
        self.modality_note.setStyleSheet(f"color: {NOTE_COLOUR};")
        self.modality_note.setWordWrap(True)
        output_form.addRow("Modality", self.modality_box)
        output_form.addRow("", self.modality_note)
        output_form.addRow("Size", self.size_box)
        self._output_form = output_form
        output_form.setRowVisible(self.modality_note, False)
        self.output_group.hide()

        self.conditioning_group = QGroupBox("Conditioning")
        self.conditioning_form = QFormLayout(self.conditioning_group)
        self.conditioning_form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop)
        return model_group, sampling_group

    def _lay_out(self, model_group: QGroupBox, sampling_group: QGroupBox) -> None:
        """The scrolling form (groups, then the added sections) over the pinned run box."""
        self._sections = QVBoxLayout()
        self._sections.setSpacing(8)
        self.form_widget = QWidget()
        controls = QVBoxLayout(self.form_widget)
        controls.setContentsMargins(8, 8, 8, 8)
        controls.setSpacing(8)
        controls.addWidget(model_group)
        controls.addWidget(sampling_group)
        controls.addWidget(self.output_group)
        controls.addWidget(self.conditioning_group)
        controls.addLayout(self._sections)
        controls.addStretch(1)
        self.scroll_area = QScrollArea()
        self.scroll_area.setWidget(self.form_widget)
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        # Normally never needed (the panel asks for the form's width, see _fit_width); on a screen too
        # narrow for that, the form scrolls sideways instead of being cut off at the right.
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        # Generate, Cancel and the progress, pinned under the scrolling form
        self.run_box = RunBox()
        self.generate_button, self.cancel_button = self.run_box.generate_button, self.run_box.cancel_button
        self.progress_bar, self.progress_label = self.run_box.progress_bar, self.run_box.progress_label
        self.generate_button.clicked.connect(self._on_generate_clicked)
        self.cancel_button.clicked.connect(self.cancel_requested)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.scroll_area, 1)
        layout.addWidget(self.run_box)
        self.setMinimumWidth(MIN_PANEL_WIDTH)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)

    def _fit_width(self) -> None:
        """Ask for the form's width: the window widens the dock (shrinking the viewer) when the form grows,
        e.g. when "All settings" opens. The panel's minimum stays small: a minimum wider than a small
        window can give made the dock clip the form at the right; there it scrolls sideways instead."""
        needed = (
            self.form_widget.minimumSizeHint().width()
            + self.scroll_area.verticalScrollBar().sizeHint().width()
        )
        self._wanted_width = max(MIN_PANEL_WIDTH, needed + 2)
        self.setMinimumWidth(MIN_PANEL_WIDTH)
        self.updateGeometry()
        if self.width() < self._wanted_width:
            self.width_wanted.emit(self._wanted_width)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        # The window got narrower (e.g. to 1024 px) and shrank the docks alike: ask again for the form's
        # width, after this layout pass, so the viewer gives it up rather than the form scrolling sideways.
        if event.size().width() < getattr(self, "_wanted_width", 0) <= event.oldSize().width():
            QTimer.singleShot(0, self, self._ask_for_width)

    def _ask_for_width(self) -> None:
        if self.width() < self._wanted_width:
            self.width_wanted.emit(self._wanted_width)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        hint = super().sizeHint()
        return QSize(max(hint.width(), getattr(self, "_wanted_width", MIN_PANEL_WIDTH)), hint.height())

    def _update_guidance_enabled(self) -> None:
        source = self.form.model
        supported = source is not None and source.spec.supports_guidance
        self.guidance_spin.setEnabled(supported and not self.state.job_running)
        self.guidance_label.setEnabled(supported)
        self.guidance_spin.setToolTip(
            "Classifier-free guidance: 1 = plain conditional sampling; higher follows the conditions more strictly"
            if supported
            else "This model was not trained for classifier-free guidance"
        )

    def _update_generate_button(self) -> None:
        blocked = self.form.blocked_reason()
        self.generate_button.setEnabled(
            not blocked and not self.state.job_running and self.form.model is not None
        )
        self.generate_button.setToolTip(
            f"Cannot generate: {blocked}" if blocked else "Generate a volume (Ctrl+G)"
        )
        # Why the button is off, on the line under it (a tooltip alone was missed, and the line still said
        # "Done in 27.0 s"); the line comes back when the block is lifted.
        blocked_text = f"Cannot generate: {blocked.splitlines()[0]}" if blocked else ""
        shown = getattr(self, "_blocked_text", "")
        if blocked_text and not self.state.job_running:
            if not shown:
                self._before_block = self.progress_label.text()
            self.progress_label.setText(blocked_text)
            self._blocked_text = blocked_text
        elif shown:
            if self.progress_label.text() == shown:
                self.progress_label.setText(self._before_block)
            self._blocked_text = ""

    # -- user edits ----------------------------------------------------------------------------------

    def _on_generate_clicked(self) -> None:
        if self.form.model is None or self.state.job_running or self.form.blocked_reason():
            return
        self.generate_requested.emit()

    def _on_model_box_changed(self, index: int) -> None:
        model_id = self.model_box.itemData(index)
        source = self.state.model_by_id(model_id) if model_id else None
        if source is not None:
            self.state.select_model(source)

    def _on_sampler_box_changed(self, text: str) -> None:
        if text:
            self.form.set(sampler=text)

    def _on_steps_spin_changed(self, value: int) -> None:
        self.form.set(steps=value)

    def _on_seed_spin_changed(self, value: int) -> None:
        self.form.set(seed=value)

    def _on_guidance_spin_changed(self, value: float) -> None:
        self.form.set(guidance_scale=value)

    def _on_batch_spin_changed(self, value: int) -> None:
        self.form.set(batch_size=value)

    def _on_previews_box_changed(self, _index: int) -> None:
        value = self.previews_box.currentData()
        if value is not None:
            self.form.set(preview_interval=value)

    def _show_previews(self) -> None:
        value = self.form.preview_interval
        if self.previews_box.findData(value) < 0:  # a setting from elsewhere (a saved "every 5 steps")
            self.previews_box.addItem(f"Every {value} steps" if value > 0 else f"{-value} per run", value)
        self._set_quietly(
            self.previews_box.setCurrentIndex, self.previews_box, self.previews_box.findData(value)
        )

    def _on_device_box_changed(self, _index: int) -> None:
        self.form.set(device=self.device_box.currentData() or "auto")

    def _on_modality_box_changed(self, _index: int) -> None:
        name = self.modality_box.currentData()
        if name:
            self.form.set(modality=name)
        self._show_modality_caveat()

    def _on_size_box_changed(self, _index: int) -> None:
        chosen = self.size_box.currentData()
        size, spacing = chosen if chosen else (None, None)
        self.form.set(output_size=size, voxel_spacing_mm=spacing)

    def _on_condition_edited(self, name: str, value: float) -> None:
        self.form.set_condition(name, value)

    # -- session events ------------------------------------------------------------------------------

    def _on_state_models_changed(self) -> None:
        self.model_box.blockSignals(True)
        self.model_box.clear()
        # Two models of one name (a catalogue install and a copy elsewhere) read apart by their folders.
        for source, label in zip(self.state.models, picker_labels(self.state.models), strict=True):
            self.model_box.addItem(label, source.id)
            self.model_box.setItemData(
                self.model_box.count() - 1, f"{source.id}\n{source.path}", Qt.ItemDataRole.ToolTipRole
            )
        self.model_box.blockSignals(False)
        self._show_model()

    def _on_state_job_changed(self, running: bool) -> None:
        self._update_generate_button()
        self.cancel_button.setEnabled(running)
        for widget in (
            self.model_box,
            self.open_model_button,
            self.sampler_box,
            self.steps_spin,
            self.seed_spin,
            self.random_seed_button,
            self.batch_spin,
            self.previews_box,
            self.device_box,
            self.plan_clear_button,
            self.conditioning_group,
            self.output_group,
        ):
            widget.setEnabled(not running)
        self._update_guidance_enabled()
        if running:
            # Any engine job (a generation, a Compare run): the generation controller says "Starting..." for
            # its own; another job's end gives the line back as it was (it stayed "Starting... 0%" idle).
            self._idle_progress = (
                self.progress_label.text(),
                self.progress_bar.value(),
                self.progress_bar.format(),
            )
            self.progress_bar.setValue(0)
            self.progress_bar.setFormat("%p%")
            self.progress_label.setText(BUSY_TEXT)
        elif self.progress_label.text() == BUSY_TEXT and getattr(self, "_idle_progress", None):
            text, value, form = self._idle_progress
            self.progress_label.setText(text)
            self.progress_bar.setValue(value)
            self.progress_bar.setFormat(form)

    def _on_state_progress_changed(self, tracker: ProgressTracker) -> None:
        # QProgressBar.setValue repaints at once (about 9 ms here, at every step, on the GUI thread that
        # shares two cores with the denoising): with updates off it only schedules the one paint.
        self.progress_bar.setUpdatesEnabled(False)
        self.progress_bar.setValue(tracker.percent)
        self.progress_bar.setFormat(
            f"{tracker.step}/{tracker.total}" if tracker.stage == "denoise" else "%p%"
        )
        self.progress_bar.setUpdatesEnabled(True)
        self.progress_label.setText(tracker.text())

    def show_finished(self, text: str) -> None:
        self.progress_label.setText(text)
