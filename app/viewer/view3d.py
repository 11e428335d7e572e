"""The 3D view: a ``pyvistaqt.QtInteractor`` showing the shown volume, created once pyvista is imported.

Only the GUI thread touches VTK. pyvista/VTK take seconds to import, so the main window imports them in
the background after it appears and calls ``attach_interactor()`` when they are ready; until then a
placeholder says so. Denoising previews are shown in the slice views only: re-rendering 3D at preview rate
on a software renderer would stall the event loop.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QSlider,
    QStackedLayout,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.session import RENDER_PRESETS, AppState

log = logging.getLogger(__name__)

PLANE_COLOURS = {"axial": "#e0524f", "coronal": "#5fb85c", "sagittal": "#4d8fe6"}


class View3D(QWidget):
    """Volume rendering (MRI grey, MIP), iso-surface, the three slice planes and orientation axes."""

    screenshot_saved = Signal(str)

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.plotter = None  # pyvistaqt.QtInteractor once attached
        self._grid = None
        self._grid_uid: int | None = None
        self.render_count = 0

        self.preset_box = QComboBox()
        self.preset_box.addItems(RENDER_PRESETS)
        self.preset_box.setCurrentText(state.render_preset)
        self.preset_box.setToolTip("3D rendering preset")
        self.preset_box.currentTextChanged.connect(self._on_preset_box_changed)
        self.iso_label = QLabel("Threshold")
        self.iso_slider = QSlider(Qt.Orientation.Horizontal)
        self.iso_slider.setRange(0, 100)
        self.iso_slider.setValue(int(round(state.iso_fraction * 100)))
        self.iso_slider.setMaximumWidth(140)
        self.iso_slider.setToolTip("Iso-surface threshold (percent of the intensity range)")
        self.iso_slider.valueChanged.connect(self._on_iso_slider_changed)
        self.planes_box = QCheckBox("Planes")
        self.planes_box.setChecked(True)
        self.planes_box.setToolTip("Show the three slice planes in 3D")
        self.planes_box.toggled.connect(self._on_option_toggled)
        self.axes_box = QCheckBox("Axes")
        self.axes_box.setChecked(True)
        self.axes_box.setToolTip("Orientation axes (R, A, S)")
        self.axes_box.toggled.connect(self._on_option_toggled)
        self.reset_button = QToolButton(text="Reset")
        self.reset_button.setToolTip("Reset the camera")
        self.reset_button.clicked.connect(self.reset_camera)
        self.shot_button = QToolButton(text="PNG")
        self.shot_button.setToolTip("Save a screenshot of the 3D view")

        bar = QHBoxLayout()
        bar.setContentsMargins(10, 4, 6, 2)
        bar.setSpacing(6)
        title = QLabel("3D")
        title.setObjectName("viewTitle")
        bar.addWidget(title)
        bar.addStretch(1)
        for widget in (
            self.preset_box,
            self.iso_label,
            self.iso_slider,
            self.planes_box,
            self.axes_box,
            self.reset_button,
            self.shot_button,
        ):
            bar.addWidget(widget)

        self.placeholder = QLabel("Preparing the 3D view...")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setObjectName("placeholder")
        self._stack = QStackedLayout()
        self._stack.addWidget(self.placeholder)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(bar)
        layout.addLayout(self._stack, 1)

        self._planes_timer = QTimer(self, singleShot=True, interval=120)
        self._planes_timer.timeout.connect(self._on_planes_timer_timeout)
        self._sync_controls()
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

            self.plotter = QtInteractor(self, auto_update=False)
        except Exception as exc:  # noqa: BLE001 - no OpenGL must not take the app down
            log.error("3D view unavailable: %s", exc)
            self.placeholder.setText(f"3D view unavailable on this display\n({type(exc).__name__}: {exc})")
            return
        self.plotter.set_background("#0b0d10", top="#262b33")
        self._stack.addWidget(self.plotter.interactor)
        self._stack.setCurrentWidget(self.plotter.interactor)
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
        for name in ("volume", "iso", "planes", "message", *(f"plane-{p}" for p in PLANE_COLOURS)):
            plotter.remove_actor(name, render=False)
        if entry is None:
            self._grid, self._grid_uid = None, None
            if self.state.shown is not None:  # a denoising preview: say why 3D is empty
                plotter.add_text(
                    "Denoising... the 3D view shows the finished volume",
                    position="upper_edge",
                    font_size=9,
                    color="#8b93a1",
                    name="message",
                )
            plotter.render()
            return
        from app.viewer.geometry import SCALARS, to_image_data

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
        if self.plotter is None:
            return
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

    def _sync_controls(self) -> None:
        iso = self.state.render_preset == "Iso-surface"
        self.iso_label.setVisible(iso)
        self.iso_slider.setVisible(iso)

    # -- slots ---------------------------------------------------------------------------------------

    def _on_preset_box_changed(self, text: str) -> None:
        self.state.set_render_preset(text)

    def _on_iso_slider_changed(self, value: int) -> None:
        self.state.set_iso_fraction(value / 100.0)

    def _on_option_toggled(self, checked: bool) -> None:
        self._apply_axes()
        self._add_planes()

    def _on_state_shown_changed(self, entry) -> None:
        if (
            entry is not None
            and entry.kind == "preview"
            and self._grid_uid is None
            and self.plotter is not None
            and "message" in self.plotter.actors
        ):
            return  # already saying "denoising"
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
        self._sync_controls()
        self.rebuild()
