"""The generation panel: model, sampler, steps, seed, conditioning, guidance, batch, device; Generate/Cancel.

It edits a ``GenerationSettings`` and asks for a run through ``generate_requested``; the main window owns
the worker. Other panels add controls with ``add_section`` (optimization settings, remote backends...) and
contribute to the request with ``add_settings_hook``.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSlider,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.generation_form import GenerationSettings, random_seed
from app.core.progress import ProgressTracker
from app.core.session import AppState

SLIDER_STEPS = 1000


class ConditionControl(QWidget):
    """A slider and a spin box bound together, in the condition's own units and range."""

    def __init__(self, condition, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.condition = condition
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, SLIDER_STEPS)
        self.spin = QDoubleSpinBox()
        span = condition.max - condition.min
        decimals = 0 if span >= 100 else 1 if span >= 10 else 2
        self.spin.setDecimals(decimals)
        self.spin.setRange(condition.min, condition.max)
        self.spin.setSingleStep(10**-decimals if decimals else max(1.0, round(span / 100)))
        self.spin.setSuffix(f" {condition.unit}" if condition.unit else "")
        self.spin.setMinimumWidth(96)
        tip = f"{condition.label}: {condition.min:g} to {condition.max:g} {condition.unit}".strip()
        if condition.description:
            tip += f"\n{condition.description}"
        self.setToolTip(tip)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.slider, 1)
        layout.addWidget(self.spin)
        self.slider.valueChanged.connect(self._on_slider_changed)
        self.spin.valueChanged.connect(self._on_spin_changed)
        self.set_value(condition.default)

    def value(self) -> float:
        return float(self.spin.value())

    def set_value(self, value: float) -> None:
        self.spin.setValue(value)

    def _on_slider_changed(self, position: int) -> None:
        c = self.condition
        value = c.min + (c.max - c.min) * position / SLIDER_STEPS
        if abs(value - self.spin.value()) > 10 ** -self.spin.decimals() / 2:
            self.spin.setValue(value)

    def _on_spin_changed(self, value: float) -> None:
        c = self.condition
        position = int(round((value - c.min) / (c.max - c.min) * SLIDER_STEPS))
        if position != self.slider.value():
            self.slider.blockSignals(True)
            self.slider.setValue(position)
            self.slider.blockSignals(False)


class SamplingPanel(QWidget):
    """Generation controls. Emits ``generate_requested(GenerationSettings)`` and ``cancel_requested()``."""

    generate_requested = Signal(object)
    cancel_requested = Signal()
    open_model_requested = Signal()

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self._settings_hooks: list[Callable[[GenerationSettings], None]] = []
        self._generate_blocks: dict[str, str] = {}  # source -> why Generate is off (e.g. refused settings)
        self.condition_controls: dict[str, ConditionControl] = {}

        # -- model
        self.model_box = QComboBox()
        self.model_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_box.setMinimumContentsLength(14)
        self.model_box.currentIndexChanged.connect(self._on_model_box_changed)
        self.open_model_button = QToolButton(text="\u2026")
        self.open_model_button.setToolTip("Open model folder... (VolSynth model or MONAI bundle)")
        self.open_model_button.clicked.connect(self.open_model_requested)
        self.model_info = QLabel()
        self.model_info.setObjectName("hint")
        self.model_info.setWordWrap(True)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model_box, 1)
        model_row.addWidget(self.open_model_button)

        # -- sampling
        self.sampler_box = QComboBox()
        self.steps_spin = QSpinBox()
        self.steps_spin.setRange(1, 1000)
        self.steps_spin.setToolTip("Denoising steps: more is slower and usually cleaner")
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(0, 2**31 - 1)
        self.seed_spin.setToolTip("Same seed + same settings + same device = same volume")
        self.random_seed_button = QToolButton(text="Random")
        self.random_seed_button.setToolTip("Pick a random seed")
        self.random_seed_button.clicked.connect(self._on_random_seed_clicked)
        seed_row = QHBoxLayout()
        seed_row.addWidget(self.seed_spin, 1)
        seed_row.addWidget(self.random_seed_button)
        self.guidance_spin = QDoubleSpinBox()
        self.guidance_spin.setRange(0.0, 20.0)
        self.guidance_spin.setSingleStep(0.5)
        self.guidance_spin.setValue(1.0)
        self.guidance_spin.setToolTip(
            "Classifier-free guidance: 1 = plain conditional sampling; higher follows "
            "the conditions more strictly"
        )
        self.guidance_label = QLabel("Guidance")
        self.batch_spin = QSpinBox()
        self.batch_spin.setRange(1, 16)
        self.batch_spin.setToolTip("Volumes generated together (same settings, consecutive noise)")
        self._added_devices: list[tuple[str, str]] = []
        self.device_box = QComboBox()
        self.device_box.addItem("Auto", "auto")
        self.device_box.addItem("CPU", "cpu")
        self.device_box.setToolTip("Where the model runs")

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
        form.addRow("Device", self.device_box)

        self.conditioning_group = QGroupBox("Conditioning")
        self.conditioning_form = QFormLayout(self.conditioning_group)
        self.conditioning_form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

        # -- run
        self.generate_button = QPushButton("Generate")
        self.generate_button.setObjectName("primary")
        self.generate_button.setToolTip("Generate a volume (Ctrl+G)")
        self.generate_button.clicked.connect(self._on_generate_clicked)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the running generation (Esc)")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel_requested)
        buttons = QHBoxLayout()
        buttons.addWidget(self.generate_button, 2)
        buttons.addWidget(self.cancel_button, 1)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 100)
        self.progress_bar.setValue(0)
        self.progress_bar.setTextVisible(True)
        self.progress_label = QLabel("Ready")
        self.progress_label.setObjectName("progressText")

        self._sections = QVBoxLayout()
        self._sections.setSpacing(8)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(8)
        layout.addWidget(model_group)
        layout.addWidget(sampling_group)
        layout.addWidget(self.conditioning_group)
        layout.addLayout(self._sections)
        layout.addStretch(1)
        layout.addLayout(buttons)
        layout.addWidget(self.progress_bar)
        layout.addWidget(self.progress_label)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)

        state.models_changed.connect(self._on_state_models_changed)
        state.model_selected.connect(self._on_state_model_selected)
        state.job_changed.connect(self._on_state_job_changed)
        state.progress_changed.connect(self._on_state_progress_changed)
        self._on_state_models_changed()
        self._on_state_model_selected(state.selected_model)

    # -- extension hooks -----------------------------------------------------------------------------

    def add_section(self, title: str, widget: QWidget) -> QGroupBox:
        """Add a titled group of controls above the Generate button (e.g. optimization settings)."""
        group = QGroupBox(title)
        inner = QVBoxLayout(group)
        inner.setContentsMargins(6, 6, 6, 6)
        inner.addWidget(widget)
        self._sections.addWidget(group)
        return group

    def add_settings_hook(self, hook: Callable[[GenerationSettings], None]) -> None:
        """``hook(settings)`` may change the settings just before a run (e.g. set ``settings.optimization``)."""
        self._settings_hooks.append(hook)

    def set_generate_blocked(self, source: str, reason: str | None) -> None:
        """Keep Generate off while ``source`` has a ``reason`` (shown as its tooltip); ``None`` lifts the block."""
        if reason:
            self._generate_blocks[source] = reason
        else:
            self._generate_blocks.pop(source, None)
        self._update_generate_button()

    def generate_blocked_reason(self, ignore: tuple[str, ...] = ()) -> str:
        """Why Generate is off ("" if it is not), leaving out the blocks of the ``ignore`` sources."""
        return "\n".join(reason for source, reason in self._generate_blocks.items() if source not in ignore)

    def _update_generate_button(self) -> None:
        blocked = self.generate_blocked_reason()
        self.generate_button.setEnabled(
            not blocked and not self.state.job_running and self.state.selected_model is not None
        )
        self.generate_button.setToolTip(
            f"Cannot generate: {blocked}" if blocked else "Generate a volume (Ctrl+G)"
        )

    def set_devices(self, devices: list[dict]) -> None:
        """Fill the device picker from ``engine.devices.available_devices()``; added devices (engine servers) stay."""
        current = self.device_box.currentData()
        self.device_box.blockSignals(True)
        self.device_box.clear()
        self.device_box.addItem("Auto", "auto")
        for device in devices:
            self.device_box.addItem(
                f"{device['id']}  \u2013  {device.get('name', '')}".strip(" \u2013"), device["id"]
            )
        for label, data in self._added_devices:
            self.device_box.addItem(label, data)
        index = self.device_box.findData(current)
        self.device_box.setCurrentIndex(max(0, index))
        self.device_box.blockSignals(False)
        if self.device_box.currentData() != current:
            self.device_box.currentIndexChanged.emit(self.device_box.currentIndex())

    def add_device(self, label: str, data: str) -> None:
        """Add and select a device that is not on this machine (an engine server); it survives ``set_devices``."""
        self.remove_device(data)
        self._added_devices.append((label, data))
        self.device_box.addItem(label, data)
        self.device_box.setCurrentIndex(self.device_box.findData(data))

    def remove_device(self, data: str) -> None:
        self._added_devices = [(label, d) for label, d in self._added_devices if d != data]
        index = self.device_box.findData(data)
        if index >= 0:
            self.device_box.removeItem(index)  # Qt selects a neighbour and says so (currentIndexChanged)

    # -- reading the form ----------------------------------------------------------------------------

    def settings(self) -> GenerationSettings:
        source = self.state.selected_model
        # By folder path, not id: the same model whichever registry the backend searches, and opened
        # folders (MONAI bundles) need no registration.
        model = str(source.path) if source is not None else ""
        settings = GenerationSettings(
            model=model,
            sampler=self.sampler_box.currentText(),
            steps=self.steps_spin.value(),
            seed=self.seed_spin.value(),
            conditioning={name: control.value() for name, control in self.condition_controls.items()},
            guidance_scale=self.guidance_spin.value() if self.guidance_spin.isEnabled() else 1.0,
            batch_size=self.batch_spin.value(),
            device=self.device_box.currentData() or "auto",
        )
        for hook in self._settings_hooks:
            hook(settings)
        return settings

    # -- slots ---------------------------------------------------------------------------------------

    def _on_generate_clicked(self) -> None:
        if self.state.selected_model is None or self.state.job_running:
            return
        settings = self.settings()  # hooks first: they may block the run (e.g. refused optimization settings)
        if self._generate_blocks:
            return
        self.generate_requested.emit(settings)

    def _on_random_seed_clicked(self) -> None:
        self.seed_spin.setValue(random_seed())

    def _on_model_box_changed(self, index: int) -> None:
        model_id = self.model_box.itemData(index)
        source = self.state.model_by_id(model_id) if model_id else None
        if source is not None:
            self.state.select_model(source)

    def _on_state_models_changed(self) -> None:
        self.model_box.blockSignals(True)
        self.model_box.clear()
        for source in self.state.models:
            self.model_box.addItem(source.spec.name, source.id)
            self.model_box.setItemData(
                self.model_box.count() - 1, f"{source.id}\n{source.path}", Qt.ItemDataRole.ToolTipRole
            )
        self.model_box.blockSignals(False)
        self._on_state_model_selected(self.state.selected_model)

    def _on_state_model_selected(self, source) -> None:
        if source is None:
            self.model_info.setText("No model selected")
            self._update_generate_button()
            return
        index = self.model_box.findData(source.id)
        if index >= 0 and index != self.model_box.currentIndex():
            self.model_box.blockSignals(True)
            self.model_box.setCurrentIndex(index)
            self.model_box.blockSignals(False)
        spec = source.spec
        shape = "\u00d7".join(str(s) for s in spec.output_shape[1:])
        spacing = "\u00d7".join(f"{s:g}" for s in spec.voxel_spacing_mm)
        self.model_info.setText(f"{spec.kind} diffusion \u00b7 {shape} voxels \u00b7 {spacing} mm")
        self.sampler_box.clear()
        self.sampler_box.addItems(list(spec.samplers))
        self.sampler_box.setCurrentText(spec.default_sampler)
        self.steps_spin.setValue(spec.default_steps)
        # conditioning
        while self.conditioning_form.rowCount():
            self.conditioning_form.removeRow(0)
        self.condition_controls.clear()
        for condition in spec.conditioning:
            control = ConditionControl(condition)
            self.condition_controls[condition.name] = control
            self.conditioning_form.addRow(condition.label, control)
        self.conditioning_group.setVisible(bool(spec.conditioning))
        self.guidance_spin.setValue(spec.default_guidance_scale)
        self.guidance_spin.setEnabled(spec.supports_guidance)
        self.guidance_label.setEnabled(spec.supports_guidance)
        self.guidance_spin.setToolTip(
            self.guidance_spin.toolTip()
            if spec.supports_guidance
            else "This model was not trained for classifier-free guidance"
        )
        self._update_generate_button()

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
            self.device_box,
            self.conditioning_group,
        ):
            widget.setEnabled(not running)
        self.guidance_spin.setEnabled(
            not running
            and bool(self.state.selected_model)
            and self.state.selected_model.spec.supports_guidance
        )
        if running:
            self.progress_bar.setValue(0)
            self.progress_label.setText("Starting...")

    def _on_state_progress_changed(self, tracker: ProgressTracker) -> None:
        self.progress_bar.setValue(tracker.percent)
        self.progress_bar.setFormat(
            f"{tracker.step}/{tracker.total}" if tracker.stage == "denoise" else "%p%"
        )
        self.progress_label.setText(tracker.text())

    def show_finished(self, text: str) -> None:
        self.progress_label.setText(text)
