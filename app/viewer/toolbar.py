"""The viewer's tool bar: window/level (preset, or typed W and L), orientation, interpolation, crosshair,
fit, and the time point of a 4D file; beside it, the tissue overlay's bar (app/viewer/tissue_toolbar.py).

``install_viewer_toolbar(services, viewer)`` puts it and the tissue overlay's bar on the main window (each
on the row before it when they fit, on a row of its own otherwise, so no control ever hides behind an
overflow arrow) and loads another time point of a 4D file in the background when the user picks one.
"""

from __future__ import annotations

import logging
from functools import partial

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QLabel,
    QMenu,
    QSpinBox,
    QToolBar,
    QToolButton,
    QWidget,
)

from app.core.session import CONVENTIONS, AppState
from app.core.slicing import INDEX_BASE
from app.core.volumes import CUSTOM_PRESET, WINDOW_PRESETS, VolumeEntry
from app.services import AppServices
from app.services.shortcuts import SHORTCUTS, indexed, set_shortcut
from app.viewer.tissue_toolbar import TissueToolbar
from app.viewer.viewer_area import LAYOUTS, ViewerArea
from app.widgets.theme import CHECKED_TOOLBUTTON_STYLE

log = logging.getLogger(__name__)

INTERPOLATIONS = ("Nearest", "Smooth")
CROSSHAIR_SHORTCUT = SHORTCUTS["view.crosshair"].keys


# An on/off button must look on or off (the app's style sheet gives tool buttons one look).
def _label(text: str) -> QLabel:
    label = QLabel(text)
    label.setContentsMargins(6, 0, 2, 0)
    return label


class ViewerToolbar(QToolBar):
    """Controls of the slice views; a view of ``AppState`` (it changes the state, and follows it)."""

    time_point_requested = Signal(object, int)  # (the shown 4D entry, the time index to show)
    contents_changed = Signal()  # controls appeared or went (the time point of a 4D file)
    tissue_toolbar: TissueToolbar  # the tissue overlay's bar beside it (install_viewer_toolbar)
    controller: _ViewerToolbarController  # what its controls do (install_viewer_toolbar)

    def __init__(self, state: AppState, viewer=None, parent: QWidget | None = None) -> None:
        super().__init__("Viewer", parent)
        self.setObjectName("viewerToolbar")
        self.setMovable(False)
        self.setStyleSheet(CHECKED_TOOLBUTTON_STYLE)
        self.state = state
        self.viewer = viewer

        self.addWidget(_label("Window"))
        self.preset_box = QComboBox()
        self.preset_box.setObjectName("windowPreset")
        self.preset_box.addItems([*WINDOW_PRESETS, CUSTOM_PRESET])
        self.preset_box.setToolTip(
            "Window/level preset. Custom: the window and level last set by hand (type W and L, or "
            "right-drag in a slice view)"
        )
        self.preset_box.activated.connect(self._on_preset_box_activated)
        self.addWidget(self.preset_box)
        self.window_spin = self._intensity_spin("windowWidth", "W ", "Window width: the intensity span shown")
        self.level_spin = self._intensity_spin("windowLevel", "L ", "Level: the intensity at mid-grey")
        self.addWidget(self.window_spin)
        self.addWidget(self.level_spin)
        self.addSeparator()

        self.convention_box = QComboBox()
        self.convention_box.setObjectName("orientation")
        self.convention_box.addItems(["Radiological", "Neurological"])
        self.convention_box.setToolTip(
            "Orientation. Radiological: patient right on screen left. Neurological: right on right."
        )
        self.convention_box.activated.connect(self._on_convention_box_activated)
        self.addWidget(self.convention_box)
        self.interpolation_box = QComboBox()
        self.interpolation_box.setObjectName("interpolation")
        self.interpolation_box.addItems(INTERPOLATIONS)
        self.interpolation_box.setToolTip(
            "Slice display: Nearest shows each voxel as a square; Smooth blends neighbouring voxels"
        )
        self.interpolation_box.activated.connect(self._on_interpolation_box_activated)
        self.addWidget(self.interpolation_box)

        self.crosshair_action = QAction("Crosshair", self)
        self.crosshair_action.setCheckable(True)
        set_shortcut(self.crosshair_action, "view.crosshair")
        self.crosshair_action.setToolTip(
            f"Show the crosshair lines in the slice views ({CROSSHAIR_SHORTCUT})"
        )
        self.crosshair_action.toggled.connect(self._on_crosshair_action_toggled)
        self.addAction(self.crosshair_action)
        self.fit_action = QAction("Fit", self)
        self.fit_action.setToolTip(
            "Fit every slice view again. In a view: Ctrl+wheel or +/- zoom, middle-drag or Shift+drag pans, "
            "0 fits, double-click shows it alone"
        )
        self.fit_action.triggered.connect(self._on_fit_action_triggered)
        self.addAction(self.fit_action)
        # Layout presets (Slicer's Four-Up, Conventional, One-up, a row of three): the View menu's Layout
        # submenu holds the same actions (the main window adds it).
        self.layout_menu = QMenu("&Layout", self)
        self.layout_group = QActionGroup(self)
        for index, name in enumerate(LAYOUTS):
            action = QAction(name, self)
            action.setCheckable(True)
            action.setData(name)
            set_shortcut(action, indexed("view.layout", index))
            action.setChecked(name == viewer.layout_name)
            action.triggered.connect(partial(viewer.set_layout, name))
            self.layout_group.addAction(action)
            self.layout_menu.addAction(action)
        self.layout_button = QToolButton()
        self.layout_button.setObjectName("layoutButton")
        self.layout_button.setText("Layout")
        self.layout_button.setToolTip(
            "View layout: Four-Up, Conventional, One-up, three slices in a row, side by side with another volume"
        )
        self.layout_button.setMenu(self.layout_menu)
        self.layout_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.addWidget(self.layout_button)
        viewer.layout_changed.connect(self._on_viewer_layout_changed)

        self.time_separator = self.addSeparator()
        self.time_label = _label("4D")
        self.time_spin = QSpinBox()
        self.time_spin.setObjectName("timePoint")
        self.time_spin.setPrefix("t = ")
        self.time_spin.setKeyboardTracking(False)
        self.time_spin.valueChanged.connect(self._on_time_spin_changed)
        self.time_actions = [
            self.time_separator,
            self.addWidget(self.time_label),
            self.addWidget(self.time_spin),
        ]
        for action in self.time_actions:
            action.setVisible(False)

        state.shown_changed.connect(self._on_state_shown_changed)
        state.window_changed.connect(self._on_state_window_changed)
        state.display_changed.connect(self._on_state_display_changed)
        self._on_state_shown_changed(state.shown)
        self._on_state_display_changed()

    def _intensity_spin(self, name: str, prefix: str, tip: str) -> QDoubleSpinBox:
        spin = QDoubleSpinBox()
        spin.setObjectName(name)
        spin.setPrefix(prefix)
        spin.setKeyboardTracking(False)  # applies on Enter or leaving the field, not on every digit
        spin.setRange(-1e9, 1e9)
        spin.setMaximumWidth(96)
        spin.setToolTip(f"{tip}. Type a value and press Enter")
        spin.valueChanged.connect(self._on_window_spin_changed)
        return spin

    # -- following the state -------------------------------------------------------------------------

    def _on_state_shown_changed(self, entry: VolumeEntry | None) -> None:
        enabled = entry is not None
        for spin in (self.window_spin, self.level_spin):
            spin.setEnabled(enabled)
        if entry is not None:
            span = max(entry.percentile(100.0) - entry.percentile(0.0), 1e-6)
            decimals = entry.window_decimals
            for spin in (self.window_spin, self.level_spin):
                spin.blockSignals(True)  # a new range or rounding is not the user setting a window
                spin.setDecimals(decimals)
                spin.setSingleStep(max(10.0**-decimals, round(span / 100, decimals)))
                if spin is self.window_spin:
                    spin.setRange(10.0**-decimals, 1e9)
                spin.blockSignals(False)
        four_d = entry is not None and entry.time_points > 1
        if four_d != self.time_actions[-1].isVisible():
            for action in self.time_actions:
                action.setVisible(four_d)
            self.contents_changed.emit()
        if four_d and entry is not None:
            first, last = INDEX_BASE, entry.time_points - 1 + INDEX_BASE
            self.time_label.setText(f"4D \u00b7 {entry.time_points} time points")
            self.time_spin.blockSignals(True)
            self.time_spin.setRange(first, last)
            self.time_spin.setSuffix(f" / {last}")
            self.time_spin.setValue(entry.time_index + INDEX_BASE)
            self.time_spin.blockSignals(False)
            can_switch = entry.path is not None
            self.time_spin.setEnabled(can_switch)
            self.time_spin.setToolTip(
                f"This file holds {entry.time_points} volumes (time points {first} to {last}); type or "
                "step to the one to show"
                if can_switch
                else "This volume came from a 4D series that is not a file on disk; open the file to switch"
            )
        self._on_state_window_changed(*self.state.window)

    def _on_state_window_changed(self, window: float, level: float) -> None:
        for spin, value in ((self.window_spin, window), (self.level_spin, level)):
            spin.blockSignals(True)
            spin.setValue(value)
            spin.blockSignals(False)
        self.preset_box.setCurrentText(self.state.window_preset)

    def _on_state_display_changed(self) -> None:
        self.convention_box.setCurrentIndex(CONVENTIONS.index(self.state.convention))
        self.interpolation_box.setCurrentIndex(int(self.state.smooth_display))
        self.crosshair_action.blockSignals(True)
        self.crosshair_action.setChecked(self.state.show_crosshair)
        self.crosshair_action.blockSignals(False)

    # -- slots ---------------------------------------------------------------------------------------

    def _on_preset_box_activated(self, index: int) -> None:
        preset = self.preset_box.itemText(index)
        self.state.apply_window_preset(preset)
        if preset == CUSTOM_PRESET:  # ready to type a window
            self.window_spin.setFocus(Qt.FocusReason.OtherFocusReason)
            self.window_spin.selectAll()

    def _on_window_spin_changed(self, value: float) -> None:
        if self.state.shown is not None:
            self.state.set_window(self.window_spin.value(), self.level_spin.value(), preset=CUSTOM_PRESET)

    def _on_convention_box_activated(self, index: int) -> None:
        self.state.set_convention(CONVENTIONS[index])

    def _on_interpolation_box_activated(self, index: int) -> None:
        self.state.set_smooth_display(INTERPOLATIONS[index] == "Smooth")

    def _on_crosshair_action_toggled(self, checked: bool) -> None:
        self.state.set_show_crosshair(checked)

    def _on_viewer_layout_changed(self, name: str) -> None:
        for action in self.layout_group.actions():
            action.setChecked(action.data() == name)

    def _on_fit_action_triggered(self) -> None:
        if self.viewer is not None:
            self.viewer.reset_views()

    def _on_time_spin_changed(self, value: int) -> None:
        entry = self.state.shown
        if entry is not None and entry.time_points > 1 and value - INDEX_BASE != entry.time_index:
            self.time_point_requested.emit(entry, value - INDEX_BASE)


class _ViewerToolbarController(QObject):
    """Loads the time points asked for on the viewer tool bar, and says when a 4D file was opened."""

    def __init__(self, services: AppServices, toolbar: ViewerToolbar) -> None:
        super().__init__(services.parent)
        self.services = services
        self.toolbar = toolbar
        self._request = 0  # only the last time point asked for is shown
        toolbar.time_point_requested.connect(self._on_toolbar_time_point_requested)
        services.volume_opened.connect(self._on_window_volume_opened)

    def _on_window_volume_opened(self, entry: VolumeEntry) -> None:
        if entry.time_points > 1:
            last = entry.time_points - 1 + INDEX_BASE
            self.services.show_status(
                f"{entry.name} is 4D: {entry.time_points} time points ({INDEX_BASE} to {last}), showing "
                f"t = {entry.time_index + INDEX_BASE}. Pick another with t = on the viewer tool bar.",
                15000,
            )

    def _on_toolbar_time_point_requested(self, entry: VolumeEntry, index: int) -> None:
        from engine.nifti.io import load_nifti

        if entry.path is None:
            return
        self._request += 1
        self.services.show_status(f"Reading time point {index + INDEX_BASE} of {entry.name}...")
        self.services.runner.run_task(
            "open-time-point",
            partial(load_nifti, entry.path, time_index=index),
            finished=partial(self._on_time_point_loaded, entry, self._request),
            failed=partial(self._on_time_point_failed, entry),
        )

    def _on_time_point_loaded(self, old: VolumeEntry, request: int, loaded) -> None:
        if request != self._request:
            return  # the user has asked for another time point since
        # The record as read, with the tissue maps and space of the series (one grid for every time point) and the
        # file it came from.
        loaded.tissue = old.tissue if loaded.data.shape == old.shape else {}
        loaded.space, loaded.path = old.space, old.path
        new = VolumeEntry(old.name, volume=loaded, kind=old.kind)
        if self.services.state.replace_volume(old, new):
            self.services.show_status(
                f"{new.name}: time point {new.time_index + INDEX_BASE} of {INDEX_BASE} to "
                f"{new.time_points - 1 + INDEX_BASE}",
                8000,
            )

    def _on_time_point_failed(self, entry: VolumeEntry, message: str) -> None:
        # the field goes back to what is shown
        self.toolbar._on_state_shown_changed(self.services.state.shown)
        self.services.show_error("Cannot read that time point", message)


def install_viewer_toolbar(services: AppServices, viewer: ViewerArea) -> ViewerToolbar:
    """Add the viewer tool bar of ``viewer``, then the tissue overlay's (``.tissue_toolbar``), across the top
    of the main window (after its other tool bars, each on a row it fits) and wire the 4D loading."""
    toolbar = ViewerToolbar(services.state, viewer, services.parent)
    toolbar.tissue_toolbar = TissueToolbar(services.state, services.parent)
    services.menus.add_fitted_tool_bars(toolbar, toolbar.tissue_toolbar)
    toolbar.controller = _ViewerToolbarController(services, toolbar)
    return toolbar
