"""Optimization settings in the generation panel: what to change, whether it applies on the device, and why not.

Each control edits one field of ``engine.optimization.apply.OptimizationConfig``. After every change, and when the
device or the model changes, the panel asks ``engine.optimization.apply.expected_report`` what will apply and
shows a mark per requested setting (check: applies, dash: does not) whose tooltip is the engine's reason.
A combination the engine refuses shows the engine's message under the settings and keeps Generate off.
The panel is a view of the generation form's ``optimization`` field, which is saved with the form.

The section is compact by default (preset, one summary line); the arrow shows every setting.
"""

from __future__ import annotations

import sys
from typing import Any

from PySide6.QtCore import QSettings, Qt, Signal, SignalInstance
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.display import (
    APPLIED_MARK,
    NOT_APPLIED_MARK,
    OPTIMIZATION_LABELS,
    SLOWER_MARK,
    optimization_lines,
    setting_choices,
    setting_requested,
    setting_text,
    setting_tips,
)
from app.core.measured_settings import FASTEST_HERE, MeasuredSettings, budget_words
from app.core.optimization_presets import (
    BLOCK_SOURCE,
    CUSTOM,
    DEFAULTS,
    PRESET_TIPS,
    PRESETS,
    preset_of,
    preset_values,
)
from app.core.session import AppState
from app.panels.sampling_panel import SamplingPanel
from app.services import AppServices
from app.widgets.eliding_combo_box import ElidingComboBox
from engine.api.optimization_config import SETTING_ROWS, SETTINGS
from engine.errors import EngineError, InvalidRequest
from engine.optimization.apply import OptimizationConfig

EXPANDED_KEY = "optimization/expanded"

# Control values: (label shown, value in the config), and tooltips; both from the settings' rows.
CHOICES = setting_choices()
TIPS = setting_tips()
# A row of the settings' grid per setting: a box where it has choices (in the rows' order), the PSNR budget of a
# mixed quantization under its quantization's box, then a check box per true/false setting.
COMBO_SETTINGS = tuple(row.name for row in SETTING_ROWS if row.choices)
BOOL_SETTINGS = tuple(row.name for row in SETTING_ROWS if row.is_switch and not row.choices)
# Settings that refine another one (the step cache's level and forecast): enabled only while it is on.
REFINES = {row.name: row.only_with for row in SETTING_ROWS if row.only_with}
BUDGETS = {row.budget_of: row.name for row in SETTING_ROWS if row.budget_of}
# Where a refinement's tip advises a value, it starts there when the setting it refines is turned on (step
# caching: the forecast, "far closer to the uncached run for the same speed"), and goes back to its default
# when that setting is turned off (it means nothing then, and would make the preset read Custom).
ADVISED = {"step_cache_forecast": True}
# The report entry saying whether each setting applied (the step-caching pair has one, under the interval).
REPORT_ENTRY = {row.name: row.report_entry for row in SETTING_ROWS}
MARK_COLOURS = {APPLIED_MARK: "#98c379", NOT_APPLIED_MARK: "#e5c07b", SLOWER_MARK: "#e06c75"}
PRESET_ROLE = Qt.ItemDataRole.UserRole  # the preset's name (the shown text carries what was measured)


def _engine_loaded() -> bool:
    """Whether torch is fully imported (the prediction needs it; importing it here would stall start-up)."""
    torch = sys.modules.get("torch")
    return torch is not None and not getattr(getattr(torch, "__spec__", None), "_initializing", False)


class OptimizationPanel(QWidget):
    """Optimization controls with live per-device applicability. Install with ``install_optimization_panel``.

    Signals:
        measure_requested(): the user asked to measure the settings on this machine (Measure now).
    """

    measure_requested = Signal()
    cancel_measure_requested = Signal()

    def __init__(
        self,
        state: AppState,
        settings: QSettings,
        measured: MeasuredSettings | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.form = state.form
        self.measured = measured or MeasuredSettings()
        self.qsettings = settings
        self.report: dict[str, dict[str, Any]] | None = None  # the latest prediction
        self.refused: str = ""  # the engine's message when the combination is refused
        self._pending = False  # prediction waits for the engine (torch) to load
        self._remote = False  # the device is an engine server: it checks the settings itself
        self._device_text = ""
        self._updating = False

        self._build_header()  # preset, expand arrow, what was measured, summary, refusal message
        self._build_settings()  # the settings' controls, hidden until "All settings"
        self._lay_out()

        self._set_controls({**DEFAULTS, **self.form.optimization})
        # Whether each refined setting was on at the last change (a refinement follows it being turned on).
        self._refined_on = {
            refined: self.values()[refined] != SETTINGS[refined].default for refined in REFINES.values()
        }
        self.expand_button.setChecked(bool(self.qsettings.value(EXPANDED_KEY, False, type=bool)))
        self._on_expand_button_toggled(self.expand_button.isChecked())
        self.form.changed.connect(self._on_form_changed)
        state.model_selected.connect(self._on_state_model_selected)
        state.job_changed.connect(self._on_state_job_changed)
        self.measured.changed.connect(self._on_measured_changed)
        self._on_measured_changed()
        self.refresh(import_engine=False)

    # -- building (called in this order from __init__: the widgets' creation order is the Tab order)

    def _build_header(self) -> None:
        """The preset box and its expand arrow, what was measured here (with Measure/Cancel and the PSNR
        floor of "Fastest here"), the one-line summary and the refusal message."""
        self.preset_box = ElidingComboBox()
        for name in (FASTEST_HERE, *PRESETS, CUSTOM):
            self.preset_box.addItem(name, name)
        self.preset_box.setToolTip("Optimization preset (each says what it measured on this machine)")
        # Long entries ("Exact fp32 \u00b7 not measured here") elide in a narrow Generate panel instead of
        # widening the form past what a 1024-px window can give it (the list shows them whole).
        self.preset_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.preset_box.setMinimumContentsLength(10)
        self.preset_box.activated.connect(self._on_preset_box_activated)
        # What was measured here: the offer to measure, progress and cancel, the floor of "Fastest here".
        self.measured_label = QLabel()
        self.measured_label.setObjectName("hint")
        self.measured_label.setWordWrap(True)
        self.measure_button = QPushButton("Measure now")
        self.measure_button.setToolTip(
            "Measure the settings that can apply here on this model, step caching and fewer steps, against "
            f"fp32: speed, and quality on a whole run ({budget_words()}, in the background; paused while you "
            "generate). Generate > Measure Settings on This Machine"
        )
        self.measure_button.clicked.connect(self.measure_requested)
        self.cancel_measure_button = QPushButton("Cancel")
        self.cancel_measure_button.setToolTip("Stop measuring; nothing is kept")
        self.cancel_measure_button.clicked.connect(self.cancel_measure_requested)
        # Step caching and fewer steps as measured here: their speed beside their quality cost.
        self.trades_label = QLabel()
        self.trades_label.setObjectName("hint")
        self.trades_label.setWordWrap(True)
        self.floor_spin = QDoubleSpinBox()
        self.floor_spin.setRange(10.0, 150.0)
        self.floor_spin.setDecimals(1)
        self.floor_spin.setSuffix(" dB")
        self.floor_spin.setPrefix("≥ ")
        self.floor_spin.setValue(self.measured.min_psnr_db)
        self.floor_spin.setToolTip(
            "'Fastest here' picks the fastest measured setting whose volume keeps at least this PSNR against fp32"
        )
        self.floor_spin.valueChanged.connect(self._on_floor_spin_changed)
        self.expand_button = QToolButton()
        self.expand_button.setCheckable(True)
        self.expand_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.expand_button.setText("All settings")
        self.expand_button.toggled.connect(self._on_expand_button_toggled)
        self.summary = QLabel()
        self.summary.setObjectName("hint")
        self.summary.setWordWrap(True)
        self.refused_label = QLabel()
        self.refused_label.setObjectName("refused")
        self.refused_label.setWordWrap(True)
        self.refused_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.refused_label.hide()

    def _build_settings(self) -> None:
        """One control per setting (combos, PSNR budgets of mixed quantization, checks) in ``self.body``."""
        self.checks: dict[str, QCheckBox] = {}
        self.combos: dict[str, QComboBox] = {}
        self.marks: dict[str, QLabel] = {}
        self.labels: dict[str, QLabel] = {}
        self.budget_spins: dict[str, QDoubleSpinBox] = {}  # PSNR budget of a mixed quantization
        for budget in BUDGETS.values():
            spin = QDoubleSpinBox()
            spin.setRange(10.0, 150.0)
            spin.setDecimals(1)
            spin.setSingleStep(1.0)
            spin.setSuffix(" dB")
            spin.setToolTip(TIPS[budget])
            spin.valueChanged.connect(self._on_control_changed)
            self.budget_spins[budget] = spin
        self.budget_spin = self.budget_spins["psnr_budget_db"]
        self.body = QWidget()
        grid = QGridLayout(self.body)
        grid.setContentsMargins(0, 4, 0, 0)
        grid.setHorizontalSpacing(6)
        grid.setVerticalSpacing(5)
        grid.setColumnStretch(1, 1)
        row = 0
        for name in COMBO_SETTINGS:
            combo = QComboBox()
            for text, value in CHOICES[name]:
                combo.addItem(text, value)
            combo.setToolTip(TIPS[name])
            combo.currentIndexChanged.connect(self._on_control_changed)
            self.combos[name] = combo
            self._add_row(grid, row, name, combo)
            row += 1
            if name in BUDGETS:
                budget = BUDGETS[name]
                budget_label = QLabel(OPTIMIZATION_LABELS[budget])
                budget_label.setToolTip(TIPS[budget])
                self.labels[budget] = budget_label
                grid.addWidget(
                    budget_label, row, 0, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
                )
                grid.addWidget(self.budget_spins[budget], row, 1)
                row += 1
        for name in BOOL_SETTINGS:
            check = QCheckBox(OPTIMIZATION_LABELS[name])
            check.setToolTip(TIPS[name])
            check.toggled.connect(self._on_control_changed)
            self.checks[name] = check
            self._add_row(grid, row, name, check, label=False)
            row += 1
        self.body.hide()

    def _lay_out(self) -> None:
        """The header rows over the settings' body."""
        top = QHBoxLayout()
        top.setSpacing(6)
        top.addWidget(self.preset_box, 1)
        top.addWidget(self.expand_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(5)
        layout.addLayout(top)
        # What was measured gets a line of its own to wrap in; beside the floor and the buttons it made the
        # panel ~480 px wide at least, and the Generate form scrolled sideways in a 1024-px window.
        layout.addWidget(self.measured_label)
        layout.addWidget(self.trades_label)
        measure_row = QHBoxLayout()
        measure_row.setSpacing(6)
        measure_row.addStretch(1)
        measure_row.addWidget(self.floor_spin)
        measure_row.addWidget(self.measure_button)
        measure_row.addWidget(self.cancel_measure_button)
        layout.addLayout(measure_row)
        layout.addWidget(self.summary)
        layout.addWidget(self.refused_label)
        layout.addWidget(self.body)

    def _add_row(self, grid: QGridLayout, row: int, name: str, widget: QWidget, label: bool = True) -> None:
        if label:
            text = QLabel(OPTIMIZATION_LABELS[name])
            text.setToolTip(TIPS[name])
            self.labels[name] = text
            grid.addWidget(text, row, 0, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        grid.addWidget(widget, row, 1)
        mark = QLabel()
        mark.setFixedWidth(16)
        mark.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.marks[name] = mark
        grid.addWidget(mark, row, 2)

    # -- values --------------------------------------------------------------------------------------

    def values(self) -> dict[str, Any]:
        """The settings as ``OptimizationConfig`` fields (not validated: a refused combination is allowed here)."""
        values: dict[str, Any] = {name: check.isChecked() for name, check in self.checks.items()}
        values.update({name: combo.currentData() for name, combo in self.combos.items()})
        values.update({name: float(spin.value()) for name, spin in self.budget_spins.items()})
        return {name: values[name] for name in DEFAULTS}

    def set_values(self, values: dict[str, Any]) -> None:
        """Set the controls (unknown keys and values no control offers are ignored), then re-check."""
        self._set_controls(values)
        self.refresh()

    def _set_controls(self, values: dict[str, Any]) -> None:
        self._updating = True
        try:
            for name, value in values.items():
                if name in self.checks and isinstance(value, bool):
                    self.checks[name].setChecked(value)
                elif name in self.combos:
                    index = next((i for i, (_, v) in enumerate(CHOICES[name]) if v == value), -1)
                    if index >= 0:
                        self.combos[name].setCurrentIndex(index)
                elif (
                    name in self.budget_spins
                    and isinstance(value, int | float)
                    and not isinstance(value, bool)
                ):
                    self.budget_spins[name].setValue(float(value))
        finally:
            self._updating = False

    def apply_preset(self, name: str) -> None:
        if name == FASTEST_HERE:
            values = self.measured.fastest_values()
            if values is None:  # nothing measured yet: measuring is how this preset comes to exist
                self.measure_requested.emit()
                self.refresh()
                return
            self.set_values({**DEFAULTS, **values})
            self.preset_box.setCurrentIndex(self.preset_box.findData(FASTEST_HERE))
            return
        self.set_values(preset_values(name))

    def current_preset(self) -> str:
        return str(self.preset_box.currentData())

    def device_id(self) -> str:
        return self.form.device

    # -- checking against the engine -----------------------------------------------------------------

    def refresh(self, import_engine: bool = True) -> None:
        """Re-check the settings on the selected device; ``import_engine=False`` defers it until torch is loaded."""
        values = self.values()
        self._refined_on = {
            refined: values[refined] != SETTINGS[refined].default for refined in REFINES.values()
        }
        self._updating = True
        try:
            self.form.set(optimization={k: v for k, v in values.items() if v != DEFAULTS[k]})
        finally:
            self._updating = False
        self._update_budgets(values)
        self._select_preset(values)
        self.report, refused, self._pending, self._remote = None, "", False, False
        try:
            if self.form.xla_server:  # nothing of these goes there (GenerationForm.sent_optimization)
                self._remote = True
                self._show("")
                return
            config = OptimizationConfig.from_dict(values)  # conflicts on every device: no torch needed
            if self.form.remote:
                self._remote = True  # the server's device is not here to ask: the server checks at submit
            elif import_engine or _engine_loaded():
                from engine.machine.devices import resolve_device
                from engine.optimization.apply import expected_report

                device = resolve_device(self.device_id())
                spec = self.state.selected_model.spec if self.state.selected_model is not None else None
                self.report = expected_report(config, device, spec)
                self._device_text = str(device)
            else:
                self._pending = True
        except InvalidRequest as exc:
            refused = str(exc)
        except EngineError as exc:  # the device is not here: the run will say so; nothing to refuse
            self._device_text = ""
            self.summary.setText(f"Cannot check the settings: {exc}")
            self.summary.setToolTip("")
        self._show(refused)

    def _show(self, refused: str) -> None:
        self.refused = refused
        self.refused_label.setText(refused)
        self.refused_label.setVisible(bool(refused))
        self.form.set_blocked(BLOCK_SOURCE, f"refused optimization settings: {refused}" if refused else None)
        report = self.report or {}
        for name, mark in self.marks.items():
            entry = report.get(REPORT_ENTRY[name] or "")
            if entry is None or not setting_requested(entry["requested"]):
                mark.setText("")
                mark.setToolTip("")
                continue
            symbol = APPLIED_MARK if entry["applied"] else NOT_APPLIED_MARK
            if entry.get("expected_slower"):
                symbol = SLOWER_MARK
            mark.setText(symbol)
            mark.setStyleSheet(f"color: {MARK_COLOURS[symbol]}; font-weight: bold; font-size: 11pt;")
            verdict = "Applies" if entry["applied"] else "Does not apply"
            if entry.get("expected_slower"):
                verdict = f"Expected slower than fp32 ({entry['expected_slower']}). Applies"
            mark.setToolTip(
                f"{verdict} on {self._device_text}: {entry['reason']}"
                if entry["reason"]
                else f"{verdict} on {self._device_text}"
            )
        if refused:
            self.summary.setText("The engine refuses this combination:")
            self.summary.setToolTip("")
        elif self._pending:
            self.summary.setText("Checked against the device once the engine has loaded.")
            self.summary.setToolTip("")
        elif self._remote:
            details = self.form.server_details.get(self.form.device, {})
            machine = details.get("machine") or {}
            where = ""
            if machine.get("cpu"):
                from engine.machine.probe import MachineProbe

                try:
                    where = f" ({MachineProbe.from_dict(machine).describe()})"
                except (KeyError, TypeError, ValueError):
                    where = ""
            if self._xla_server():
                self.summary.setText(self._xla_text(details))
            else:
                self.summary.setText(
                    f"Checked by the engine server{where} when the run starts, with its own hardware probe; the "
                    "result's report says what applied."
                )
            self.summary.setToolTip("")
        elif self.report is not None:
            requested = [n for n, e in report.items() if setting_requested(e["requested"])]
            if not requested:
                self.summary.setText("Plain fp32: nothing changed.")
            else:
                missing = [
                    setting_text(n, report[n]["requested"]) for n in requested if not report[n]["applied"]
                ]
                text = f"{len(requested) - len(missing)} of {len(requested)} apply on {self._device_text}"
                slower = [
                    setting_text(n, report[n]["requested"])
                    for n in requested
                    if report[n].get("expected_slower")
                ]
                text += f"; not: {', '.join(missing)}" if missing else ""
                text += f"; expected slower than fp32 here: {', '.join(slower)}" if slower else ""
                self.summary.setText(text)
            from engine.machine.probe import probe_machine

            self.summary.setToolTip(
                "\n".join([*optimization_lines(report), f"This machine: {probe_machine().describe()}"])
            )
        self._update_enabled()

    # -- slots ---------------------------------------------------------------------------------------

    def check_before_run(self) -> None:
        """A run is about to start: a check that waited for the engine to load happens now (it may refuse)."""
        if self._pending:
            self.refresh()

    def _on_control_changed(self, *_args) -> None:
        if not self._updating:
            self._follow_refined()
            self.refresh()

    def _follow_refined(self) -> None:
        """A refinement with an advised value (``ADVISED``) follows the setting it refines on and off."""
        values = self.values()
        for name, advised in ADVISED.items():
            refined = REFINES[name]
            now_on = values[refined] != SETTINGS[refined].default
            if now_on != self._refined_on.get(refined, False):
                self._set_controls({name: advised if now_on else SETTINGS[name].default})

    def _on_preset_box_activated(self, index: int) -> None:
        name = str(self.preset_box.itemData(index))
        if name == FASTEST_HERE or name in PRESETS:
            self.apply_preset(name)
        else:  # "Custom" is where the controls already are
            self.expand_button.setChecked(True)
            self.refresh()

    def _on_expand_button_toggled(self, expanded: bool) -> None:
        self.body.setVisible(expanded)
        self.expand_button.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self.expand_button.setToolTip("Hide the individual settings" if expanded else "Show every setting")
        self.qsettings.setValue(EXPANDED_KEY, expanded)

    def _on_form_changed(self, name: str) -> None:
        if name == "device":
            self.refresh()
        elif name == "optimization" and not self._updating:
            wanted = {**DEFAULTS, **self.form.optimization}
            if wanted != self.values():  # set elsewhere (a restored form, a preset from the Compare window)
                self.set_values(wanted)

    def _on_state_model_selected(self, _source) -> None:
        self.refresh(import_engine=False)

    def _update_budgets(self, values: dict[str, Any]) -> None:
        """A PSNR budget is editable only with its quantization on "mixed" (it means nothing otherwise)."""
        for mode, budget in BUDGETS.items():
            self.budget_spins[budget].setEnabled(values[mode] == "mixed" and not self.state.job_running)
            self.labels[budget].setEnabled(self.budget_spins[budget].isEnabled())
        # Likewise a setting that refines another (the step cache's level) means something only with it on.
        for name, refined in REFINES.items():
            control = self.combos[name]
            control.setEnabled(
                values[refined] != SETTINGS[refined].default
                and not self.state.job_running
                and not self._xla_server()
            )
            self.labels[name].setEnabled(control.isEnabled())

    def _select_preset(self, values: dict[str, Any]) -> None:
        """Show which preset ``values`` are: a named one, "Fastest here" (kept while it still matches), Custom."""
        fastest = self.measured.fastest_values()
        matches_fastest = fastest is not None and {**DEFAULTS, **fastest} == values
        if matches_fastest and self.current_preset() == FASTEST_HERE:
            return
        name = preset_of(values)
        if name == CUSTOM and matches_fastest:
            name = FASTEST_HERE
        self.preset_box.setCurrentIndex(self.preset_box.findData(name))

    def _on_measured_changed(self) -> None:
        """Relabel the presets with what was measured here, and show the offer / progress / summary line."""
        m = self.measured
        for index in range(self.preset_box.count()):
            name = str(self.preset_box.itemData(index))
            if name == CUSTOM:
                self.preset_box.setItemText(index, CUSTOM)
                self.preset_box.setItemData(index, "Settings chosen one by one", Qt.ItemDataRole.ToolTipRole)
                continue
            self.preset_box.setItemText(index, m.label(name))
            tip = PRESET_TIPS.get(name, "The fastest settings measured on this machine for this model")
            self.preset_box.setItemData(index, f"{tip}\n\n{m.words(name)}", Qt.ItemDataRole.ToolTipRole)
        local = m.looked_up or m.running
        self.measured_label.setVisible(local or bool(m.error))
        trades = m.trade_words() if m.measured and not m.running else ""
        self.trades_label.setText(trades)
        self.trades_label.setVisible(bool(trades))
        self.floor_spin.setVisible(m.measured)
        self.measure_button.setVisible(not m.running and local)
        self.cancel_measure_button.setVisible(m.running)
        if m.running:
            self.measured_label.setText(f"Measuring on this machine: {m.progress_text}")
        elif m.error:
            self.measured_label.setText(m.error)
        elif m.measured:
            best = m.fastest()
            created = (m.result or {}).get("created", "")
            self.measured_label.setText(
                f"Measured here {str(created)[:10]}: fastest at the floor is "
                f"{best['name'] if best else 'fp32'} ({best.get('speedup_end_to_end', 1.0):.2f}x fp32 end to end)"
                if best
                else "Measured here: nothing ran"
            )
            self.measure_button.setText("Measure again")
        else:
            self.measured_label.setText(
                f"Settings not measured on this machine for this model yet ({budget_words()})."
            )
            self.measure_button.setText("Measure now")
        self._select_preset(self.values())

    def _on_floor_spin_changed(self, value: float) -> None:
        self.measured.set_min_psnr(value)
        if self.current_preset() == FASTEST_HERE:
            self.apply_preset(FASTEST_HERE)

    def _xla_server(self) -> bool:
        return self.form.xla_server

    def _xla_text(self, details: dict[str, Any]) -> str:
        """What runs on an XLA server, and that the torch settings chosen here are not sent (kept for later)."""
        precision = details.get("xla_precision") or "default"
        text = (
            f"Runs: float32 XLA programs at XLA precision '{precision}' (the server's --xla-precision). "
            "Torch settings do not run there"
        )
        kept = {k: v for k, v in self.values().items() if v != DEFAULTS[k]}
        if not kept:
            return text + "."
        try:
            what = OptimizationConfig.from_dict(kept).settings.summary()
        except InvalidRequest:
            what = "the settings below"
        return f"{text}: {what} not sent; kept for a torch device."

    XLA_REASON = (
        "Not available on an XLA engine server: it compiles the networks with XLA (its precision is the server's "
        "--xla-precision) and refuses torch settings"
    )

    def _update_enabled(self) -> None:
        """Controls are off while a job runs, and with the reason on an XLA server (torch settings cannot apply)."""
        xla = self._xla_server()
        for name, widget in (("preset", self.preset_box), *self.checks.items(), *self.combos.items()):
            widget.setEnabled(not self.state.job_running and not xla)
            tip = TIPS.get(name, "Optimization preset (each says what it measured on this machine)")
            widget.setToolTip(f"{self.XLA_REASON}. ({tip})" if xla else tip)
        self._update_budgets(self.values())

    def _on_state_job_changed(self, running: bool) -> None:
        self._update_enabled()


def install_optimization_panel(
    services: AppServices,
    sampling_panel: SamplingPanel,
    run_about_to_start: SignalInstance,
    measured: MeasuredSettings | None = None,
) -> OptimizationPanel:
    """Give ``sampling_panel`` its Optimization section, checked when ``run_about_to_start`` says a run
    (the generation's ``about_to_start``) is about to start."""
    panel = OptimizationPanel(services.state, services.settings, measured)
    sampling_panel.add_section("Optimization", panel)
    run_about_to_start.connect(panel.check_before_run)
    return panel
