"""The 3D view: a ``pyvistaqt.QtInteractor`` showing the shown volume, created once pyvista is imported.

Only the GUI thread touches VTK. pyvista/VTK take seconds to import, so the main window imports them in
the background after it appears and calls ``attach_interactor()`` when they are ready; until then a
placeholder says so. Denoising previews are shown in the slice views only: re-rendering 3D at preview rate
on a software renderer would stall the event loop.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QImage
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QSlider,
    QStackedLayout,
    QToolBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.session import RENDER_PRESETS, AppState
from app.core.slicing import format_intensity, intensity_decimals

log = logging.getLogger(__name__)

PLANE_COLOURS = {"axial": "#e0524f", "coronal": "#5fb85c", "sagittal": "#4d8fe6"}
SYNTHETIC_COLOUR = "#c678dd"  # the slice views' SYNTHETIC tag colour
ISO_STEPS = 1000  # slider positions across the threshold's range


class View3D(QWidget):
    """Volume rendering (MRI grey, MIP), iso-surface, the three slice planes and orientation axes."""

    screenshot_saved = Signal(str)
    maximise_requested = Signal()  # the maximise button: show the 3D view alone, or all views again

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        # One linear build of the 3D toolbar's controls, in their Tab order; splitting it would scatter that order.
        super().__init__(parent)
        self.state = state
        # pyvistaqt.QtInteractor once attached; Any, since pyvista's decorated plotting methods read as
        # unbound to mypy (its `_Wrapped` signatures take the plotter as their first argument).
        self.plotter: Any = None
        self._grid: Any = None  # the shown volume as a pyvista ImageData
        self._grid_uid: int | None = None
        self.render_count = 0

        self.preset_box = QComboBox()
        self.preset_box.addItems(RENDER_PRESETS)
        self.preset_box.setCurrentText(state.render_preset)
        self.preset_box.setToolTip("3D rendering preset")
        self.preset_box.currentTextChanged.connect(self._on_preset_box_changed)
        self.iso_label = QLabel("Threshold")
        self.iso_label.setToolTip("Iso-surface threshold")
        # The threshold in the shown volume's intensity units: a slider across its 1st..99.9th percentile
        # and a field that shows (and takes) the value. The slider applies on release (a new surface
        # takes a while); while it moves the field follows.
        self.iso_slider = QSlider(Qt.Orientation.Horizontal)
        self.iso_slider.setRange(0, ISO_STEPS)
        self.iso_slider.setValue(int(round(state.iso_fraction * ISO_STEPS)))
        self.iso_slider.setTracking(False)
        self.iso_slider.setMinimumWidth(60)
        self.iso_slider.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.iso_slider.valueChanged.connect(self._on_iso_slider_changed)
        self.iso_slider.sliderMoved.connect(self._on_iso_slider_moved)
        self.iso_value = QDoubleSpinBox()
        self.iso_value.setObjectName("isoValue")
        self.iso_value.setKeyboardTracking(False)
        self.iso_value.setMinimumWidth(68)
        self.iso_value.valueChanged.connect(self._on_iso_value_changed)
        self.planes_box = QCheckBox("Planes")
        self.planes_box.setChecked(True)
        self.planes_box.setToolTip("Show the three slice planes in 3D")
        self.planes_box.toggled.connect(self._on_option_toggled)
        self.axes_box = QCheckBox("Axes")
        self.axes_box.setChecked(True)
        self.axes_box.setToolTip("Orientation axes (R, A, S)")
        self.axes_box.toggled.connect(self._on_option_toggled)
        self.reset_button = QToolButton()
        self.reset_button.setText("Reset")
        self.reset_button.setToolTip("Reset the camera")
        self.reset_button.clicked.connect(self.reset_camera)
        self.shot_button = QToolButton()
        self.shot_button.setText("PNG")
        self.shot_button.setToolTip("Save a screenshot of the 3D view")
        self.maximise_button = QToolButton()
        self.maximise_button.setText("\u2922")
        self.maximise_button.setObjectName("maximise3d")
        self.maximise_button.setCheckable(True)
        self.maximise_button.setStyleSheet(
            "QToolButton:checked { background: #2f6fae; border-color: #3d8fd6; color: #ffffff; }"
        )
        self.maximise_button.setToolTip("Show the 3D view alone (again: all four views)")
        self.maximise_button.clicked.connect(self._on_maximise_button_clicked)

        # The iso-surface threshold gets a row of its own (shown in that mode only), so the slider has room.
        self.iso_row = QWidget()
        self.iso_row.setObjectName("isoRow")
        row = QHBoxLayout(self.iso_row)
        row.setContentsMargins(10, 0, 6, 2)
        row.setSpacing(6)
        row.addWidget(self.iso_label)
        row.addWidget(self.iso_slider, 1)
        row.addWidget(self.iso_value)

        # A tool bar, not a row layout: what does not fit goes behind its extension button instead of
        # widening the 3D view (which would squeeze the slice views whenever the mode shows more controls).
        self.header = QToolBar("3D")
        self.header.setObjectName("view3dHeader")
        self.header.setMovable(False)
        self.header.setFloatable(False)
        self.header.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        title = QLabel("3D")
        title.setObjectName("viewTitle")
        title.setContentsMargins(8, 0, 6, 0)
        self.header.addWidget(title)
        self.header_actions = {}
        for name, widget in (
            ("preset", self.preset_box),
            ("maximise", self.maximise_button),
            ("png", self.shot_button),
            ("reset", self.reset_button),
            ("planes", self.planes_box),
            ("axes", self.axes_box),
        ):
            self.header_actions[name] = self.header.addWidget(widget)

        self.placeholder = QLabel("Preparing the 3D view...")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setObjectName("placeholder")
        # Wrapped, and never widening the pane: "3D view unavailable on this display (error...)" was cut.
        self.placeholder.setWordWrap(True)
        self.placeholder.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        # What the 3D view says while a run denoises: a wrapped line in the layout (text drawn in the VTK
        # scene does not wrap, and a narrow pane cut it off).
        self.note = QLabel("Denoising\u2026 the 3D view shows the finished volume.")
        self.note.setObjectName("view3dNote")
        self.note.setWordWrap(True)
        self.note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.note.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.note.setStyleSheet("color: #8b93a1; padding: 4px;")
        self.note.hide()
        self._stack = QStackedLayout()
        self._stack.addWidget(self.placeholder)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.header)
        layout.addWidget(self.iso_row)
        layout.addWidget(self.note)
        layout.addLayout(self._stack, 1)

        self._planes_timer = QTimer(self, singleShot=True, interval=120)
        self._planes_timer.timeout.connect(self._on_planes_timer_timeout)
        self.sync_controls()
        state.shown_changed.connect(self._on_state_shown_changed)
        state.crosshair_changed.connect(self._on_state_crosshair_changed)
        state.display_changed.connect(self._on_state_display_changed)
        state.window_changed.connect(self._on_state_window_changed)

    # -- setup ---------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.plotter is not None

    def attach_interactor(self) -> None:
        """Create the VTK widget (GUI thread). Safe to call twice."""
        if self.plotter is not None:
            return
        try:
            from pyvistaqt import QtInteractor

            plotter: Any = QtInteractor(self, auto_update=False)
        except Exception as exc:  # noqa: BLE001 - no OpenGL must not take the app down
            log.error("3D view unavailable: %s", exc)
            self.placeholder.setText(f"3D view unavailable on this display\n({type(exc).__name__}: {exc})")
            return
        self.plotter = plotter
        plotter.set_background("#0b0d10", top="#262b33")
        self._stack.addWidget(plotter.interactor)
        self._stack.setCurrentWidget(plotter.interactor)
        self._apply_axes()
        self.rebuild()

    def close_interactor(self) -> None:
        if self.plotter is not None:
            self.plotter.close()
            self.plotter = None

    # -- scene ---------------------------------------------------------------------------------------

    def _entry(self):
        entry = self.state.shown
        return None if entry is None or entry.kind == "preview" else entry

    def rebuild(self, reset_camera: bool = False) -> None:
        """Redraw the scene for the shown volume and preset."""
        if self.plotter is None:
            return
        entry = self._entry()
        plotter = self.plotter
        names = ("volume", "iso", "planes", "synthetic", *(f"plane-{p}" for p in PLANE_COLOURS))
        for name in names:
            plotter.remove_actor(name, render=False)
        previewing = entry is None and self.state.shown is not None
        if previewing:
            # The scene is left out of the layout while a run denoises: a shown VTK widget repaints (a
            # software render on two threads, here) at every layout change, taking the cores the run needs.
            # It leaves before the note appears: the note takes room from it, and a shown OpenGL widget
            # renders as soon as it is resized (a hidden one only when it is shown again).
            self._grid, self._grid_uid = None, None
            self.placeholder.setText("")
            self._stack.setCurrentWidget(self.placeholder)
        self.note.setVisible(previewing)  # a preview: say why 3D is empty
        if previewing:
            return
        self._stack.setCurrentWidget(plotter.interactor)
        if entry is None:
            self._grid, self._grid_uid = None, None
            plotter.render()
            return
        from app.viewer.geometry import SCALARS, to_image_data

        if entry.synthetic:  # as in the slice views: any picture of a synthetic volume says so (PNGs too)
            plotter.add_text(
                "SYNTHETIC", position="upper_right", font_size=10, color=SYNTHETIC_COLOUR, name="synthetic"
            )

        new_volume = self._grid_uid != entry.uid
        if new_volume:
            self._grid = to_image_data(entry.data, entry.affine)
            self._grid_uid = entry.uid
        grid = self._grid
        low, high = entry.percentile(1.0), entry.percentile(99.5)
        if not high > low:
            high = low + 1.0
        preset = self.state.render_preset
        if preset == "MRI grey":
            opacity = np.array([0.0, 0.0, 0.02, 0.08, 0.25, 0.55, 0.8])
            plotter.add_volume(
                grid,
                scalars=SCALARS,
                cmap="gray",
                clim=(low, high),
                opacity=opacity,
                shade=False,
                show_scalar_bar=False,
                name="volume",
                render=False,
            )
        elif preset == "MIP":
            plotter.add_volume(
                grid,
                scalars=SCALARS,
                cmap="gray",
                clim=(low, high),
                opacity="linear",
                blending="maximum",
                show_scalar_bar=False,
                name="volume",
                render=False,
            )
        elif preset == "Iso-surface":
            threshold = self.state.iso_threshold()
            surface = grid.contour([threshold], scalars=SCALARS)
            if surface.n_points:
                plotter.add_mesh(
                    surface, color="#e9d8c4", smooth_shading=True, specular=0.25, name="iso", render=False
                )
        self._add_planes(render=False)
        if new_volume or reset_camera:
            self.reset_camera(render=False)
        self.render_count += 1
        plotter.render()

    def _add_planes(self, render: bool = True) -> None:
        """The three slice planes at the crosshair: textured in "Slices only", coloured outlines otherwise
        (textured planes would hide the rendering behind mostly-black background)."""
        if self.plotter is None or self._stack.currentWidget() is not self.plotter.interactor:
            return  # a run's previews are shown (the scene is out of the layout): nothing to draw
        for name in ("planes", *(f"plane-{p}" for p in PLANE_COLOURS)):
            self.plotter.remove_actor(name, render=False)
        entry = self._entry()
        if entry is None or self._grid is None or not self.planes_box.isChecked():
            if render:
                self.plotter.render()
            return
        from app.viewer.geometry import SCALARS

        x, y, z = self.state.crosshair_ras
        slices = self._grid.slice_orthogonal(x=x, y=y, z=z)  # blocks: x (sagittal), y (coronal), z (axial)
        if self.state.render_preset == "Slices only":
            window, level = self.state.window
            self.plotter.add_mesh(
                slices.combine(),
                scalars=SCALARS,
                cmap="gray",
                show_scalar_bar=False,
                clim=(level - window / 2, level + window / 2),
                name="planes",
                render=False,
                lighting=False,
            )
        for plane, block in zip(("sagittal", "coronal", "axial"), slices, strict=True):
            if block is not None and block.n_points:
                self.plotter.add_mesh(
                    block.outline(),
                    color=PLANE_COLOURS[plane],
                    line_width=2,
                    name=f"plane-{plane}",
                    render=False,
                    lighting=False,
                )
        if render:
            self.plotter.render()

    def _apply_axes(self) -> None:
        if self.plotter is None:
            return
        if self.axes_box.isChecked():
            self.plotter.add_axes(xlabel="R", ylabel="A", zlabel="S", line_width=2, color="#dfe3ea")
        else:
            self.plotter.hide_axes()

    def reset_camera(self, render: bool = True) -> None:
        if self.plotter is None:
            return
        # A three-quarter view from the front-left, superior up: how a brain is usually first looked at.
        self.plotter.view_vector((-1.0, 1.4, 0.7), viewup=(0.0, 0.0, 1.0), render=False)
        self.plotter.reset_camera(render=False)
        self.plotter.camera.zoom(1.25)
        if render:
            self.plotter.render()

    def render_image(self) -> QImage:
        """The 3D view as a picture (for a screenshot that is marked before it is written). Raises RuntimeError
        if the 3D view is not available."""
        if self.plotter is None:
            raise RuntimeError("the 3D view is not ready yet")
        self.plotter.render()
        rgb = np.ascontiguousarray(np.asarray(self.plotter.screenshot(None, return_img=True))[..., :3])
        height, width = rgb.shape[:2]
        return QImage(rgb.data, width, height, 3 * width, QImage.Format.Format_RGB888).copy()

    def save_screenshot(self, path: str | Path) -> Path:
        """Write the 3D view to a PNG. Raises RuntimeError if the 3D view is not available."""
        if self.plotter is None:
            raise RuntimeError("the 3D view is not ready yet")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.plotter.render()
        self.plotter.screenshot(str(path))
        self.screenshot_saved.emit(str(path))
        return path

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        # a narrow 3D view keeps room for the slider and the value: the label shortens instead
        self.iso_label.setText("Threshold" if event.size().width() >= 300 else "Iso")

    def set_maximised(self, maximised: bool) -> None:
        """Follow the viewer area: the maximise button shows whether the 3D view is alone."""
        self.maximise_button.setChecked(maximised)

    def sync_controls(self) -> None:
        """Show the current mode's controls and the threshold for the shown volume (its range, its value)."""
        iso = self.state.render_preset == "Iso-surface"
        self.iso_row.setVisible(iso)
        span = self.state.iso_range()
        for widget in (self.iso_slider, self.iso_value):
            widget.blockSignals(True)
        self.iso_slider.setValue(int(round(self.state.iso_fraction * ISO_STEPS)))
        if span is None:
            self.iso_value.setEnabled(False)
            self.iso_value.setRange(0.0, 0.0)
        else:
            integer = self.state.shown_volume().integer_valued
            self.iso_value.setEnabled(True)
            self.iso_value.setDecimals(intensity_decimals(span[1] - span[0], integer))
            self.iso_value.setRange(*span)
            threshold = self.state.iso_threshold()
            if threshold is not None:  # (it is whenever there is a span)
                self.iso_value.setValue(threshold)
            low, high = (format_intensity(v, integer) for v in span)
            tip = f"Iso-surface threshold, in this volume's intensities ({low} to {high})"
            self.iso_slider.setToolTip(tip)
            self.iso_value.setToolTip(tip)
        for widget in (self.iso_slider, self.iso_value):
            widget.blockSignals(False)

    # -- slots ---------------------------------------------------------------------------------------

    def _on_preset_box_changed(self, text: str) -> None:
        self.state.set_render_preset(text)

    def _on_maximise_button_clicked(self) -> None:
        self.maximise_requested.emit()

    def _on_iso_slider_changed(self, value: int) -> None:
        self.state.set_iso_fraction(value / ISO_STEPS)

    def _on_iso_slider_moved(self, value: int) -> None:
        span = self.state.iso_range()
        if span is not None:
            self.iso_value.blockSignals(True)
            self.iso_value.setValue(span[0] + value / ISO_STEPS * (span[1] - span[0]))
            self.iso_value.blockSignals(False)

    def _on_iso_value_changed(self, value: float) -> None:
        self.state.set_iso_threshold(value)

    def _on_option_toggled(self, checked: bool) -> None:
        self._apply_axes()
        self._add_planes()

    def _on_state_shown_changed(self, entry) -> None:
        if (
            entry is not None
            and entry.kind == "preview"
            and self._grid_uid is None
            and self.plotter is not None
            and self.note.isVisibleTo(self)
        ):
            return  # already saying "denoising"
        self.sync_controls()
        self.rebuild()

    def _on_state_crosshair_changed(self, ras) -> None:
        self._planes_timer.start()  # coalesce crosshair drags into a few re-slices

    def _on_state_window_changed(self, window, level) -> None:
        self._planes_timer.start()

    def _on_planes_timer_timeout(self) -> None:
        self._add_planes()

    def _on_state_display_changed(self) -> None:
        if self.preset_box.currentText() != self.state.render_preset:
            self.preset_box.setCurrentText(self.state.render_preset)
        self.sync_controls()
        self.rebuild()
