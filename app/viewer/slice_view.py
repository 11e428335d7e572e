"""One slice view drawn with plain Qt: a QImage made from numpy, painted in ``paintEvent``.

Interaction (ITK-SNAP-like): left click/drag moves the crosshair, the wheel steps through slices, right-drag
changes window (horizontal) and level (vertical). Ctrl+wheel or +/- zooms (about the cursor), middle-drag
or Shift+left-drag pans, 0 fits the view again, Home/End go to the first/last slice, a double-click asks
the viewer area to show this view alone (and back). The view reads everything from ``AppState`` and writes
changes back to it, so the three views stay linked; zoom and pan belong to each view.

A volume's tissue maps are painted over the slice when the tissue overlay is on (``AppState.tissue_shown``:
one map as its probability, or the label map of all), from the same slice, zoom and pan as the image; the
readout then names the tissue under the cursor, and its millimetres are MNI's for a volume in MNI space.

Voxel and slice numbers count from 0 (``app.core.slicing.INDEX_BASE``) in the overlay and the readout alike,
and the slice number names its voxel axis (``k=90`` in an axial view is the ``k`` of ``voxel (i, j, k)``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QImage, QPainter, QPen
from PySide6.QtWidgets import QApplication, QSizePolicy, QWidget

from app.core.session import AppState
from app.core.slicing import (
    INDEX_BASE,
    ZOOM_STEP,
    apply_window,
    clamp_pan,
    fit_rect,
    format_intensity,
    plane_geometry,
    window_from_drag,
    zoom_about,
    zoomed_rect,
)
from app.core.tissue import is_mni, overlay_rgba, tissue_at
from app.core.volumes import ras_to_voxel, voxel_to_ras
from app.viewer.slice_overlay import OverlayText, corner_texts, overlay_layout

PLANE_COLOURS = {"axial": QColor("#e0524f"), "coronal": QColor("#5fb85c"), "sagittal": QColor("#4d8fe6")}
BACKGROUND = QColor("#0b0d10")
PLANE_STRIP = 4  # px: the plane's colour down the view's left edge
EMPTY_HINT_FLAGS = Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap
BACKING = QColor(8, 10, 13, 190)  # behind overlay text: readable over bright anatomy
TEXT_COLOURS = {
    "title": QColor("#dfe3ea"),
    "slice": QColor("#c8ced8"),
    "window": QColor("#c8ced8"),
    "tag": QColor("#c678dd"),
    "preview": QColor("#f0c674"),
    "orientation": QColor("#f0c674"),
}


class SliceView(QWidget):
    """Axial, coronal or sagittal view of ``state.shown``."""

    hovered = Signal(str)  # the readout line under the cursor (voxel, RAS mm, intensity)
    maximise_requested = Signal()  # a double-click: show this view alone, or all views again
    # 256 colours (qRgb) the windowed slice is drawn through instead of grey; a subclass or an instance sets it.
    colour_table: list[int] | None = None
    empty_text = "Generate a volume or open a NIfTI file"  # under the plane's name while nothing is shown
    view_changed = Signal()  # zoom or pan changed
    # Side by side (app/viewer/side_by_side.py): "A" or "B" before the plane's name, and what is blended
    # over the slice (a callable giving (image, opacity), or None), as Slicer's foreground over background.
    label = ""
    foreground: Callable[[], tuple[QImage, float] | None] | None = None
    # What ``foreground`` blends, for the corner: a callable giving (layer name, opacity, synthetic) or None.
    foreground_layer: Callable[[], tuple[str, float, bool] | None] | None = None

    TEXT_MARGIN = 6.0  # from the widget's edges
    BOX_PAD_X, BOX_PAD_Y = 4.0, 1.0  # backing box around the text
    GAP = 6.0  # between two boxes on one row

    def __init__(self, state: AppState, plane: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.plane = plane
        self.setObjectName(f"slice-{plane}")
        self.setMinimumSize(160, 160)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)
        self._image: QImage | None = None
        self._buffer: np.ndarray | None = None  # keeps the QImage's memory alive
        self._image_key: tuple | None = None
        self._overlay: QImage | None = None  # the tissue overlay of the slice, premultiplied RGBA
        self._overlay_buffer: np.ndarray | None = None
        self._overlay_key: tuple | None = None
        self._drag: str | None = None
        self._drag_origin = QPointF()
        self._drag_window = (1.0, 0.5)
        self._drag_pan = (0.0, 0.0)
        self.zoom = 1.0  # 1 = the slice fits the view
        self.pan = (0.0, 0.0)  # image centre offset from the view centre, in view pixels
        self._extent: np.ndarray | None = None  # field of view (mm) of the volume the zoom was set on
        self.readout = ""
        self.draw_count = 0  # how many slice images were built (tests use it)
        state.shown_changed.connect(self._on_state_shown_changed)
        state.crosshair_changed.connect(self._on_state_crosshair_changed)
        state.window_changed.connect(self._on_state_window_changed)
        state.display_changed.connect(self._on_state_display_changed)
        state.overlay_changed.connect(self._on_state_overlay_changed)
        state.progress_changed.connect(self._on_state_progress_changed)

    # -- geometry ------------------------------------------------------------------------------------

    @property
    def geometry_(self):
        return plane_geometry(self.plane, self.state.convention)

    def slice_index(self) -> int | None:
        ijk = self.state.crosshair_voxel()
        return None if ijk is None else ijk[self.geometry_.slice_axis]

    def _fit(self) -> tuple[float, float, float, float] | None:
        entry = self.state.shown
        if entry is None:
            return None
        geom = self.geometry_
        rows, cols = geom.display_shape(entry.shape)
        row_mm, col_mm = geom.pixel_aspect(entry.spacing)
        return fit_rect(self.width(), self.height(), cols * col_mm, rows * row_mm)

    def image_rect(self) -> QRectF:
        """Where the slice image is painted: fitted with physical (mm) aspect, then zoomed and panned."""
        fit = self._fit()
        if fit is None:
            return QRectF()
        return QRectF(*zoomed_rect(fit, self.width(), self.height(), self.zoom, self.pan))

    def widget_to_voxel(self, pos: QPointF) -> np.ndarray | None:
        entry = self.state.shown
        index = self.slice_index()
        rect = self.image_rect()
        if entry is None or index is None or rect.isEmpty():
            return None
        rows, cols = self.geometry_.display_shape(entry.shape)
        col = (pos.x() - rect.left()) / rect.width() * cols - 0.5
        row = (pos.y() - rect.top()) / rect.height() * rows - 0.5
        return self.geometry_.to_voxel(row, col, index, entry.shape)

    def voxel_to_widget(self, ijk) -> QPointF:
        entry = self.state.shown_volume()
        rect = self.image_rect()
        rows, cols = self.geometry_.display_shape(entry.shape)
        row, col = self.geometry_.to_display(ijk, entry.shape)
        return QPointF(
            rect.left() + (col + 0.5) / cols * rect.width(), rect.top() + (row + 0.5) / rows * rect.height()
        )

    # -- zoom and pan --------------------------------------------------------------------------------

    def zoom_by(self, factor: float, anchor: QPointF | None = None) -> None:
        """Zoom by ``factor`` keeping the point under ``anchor`` (the view centre by default) in place."""
        if self.state.shown is None:
            return
        anchor = anchor if anchor is not None else QPointF(self.width() / 2, self.height() / 2)
        self.zoom, pan = zoom_about(
            self.zoom, self.pan, factor, (anchor.x(), anchor.y()), self.width(), self.height()
        )
        self._set_pan(pan)

    def reset_view(self) -> None:
        """Fit the slice to the view again (zoom 1, no pan)."""
        if self.zoom != 1.0 or self.pan != (0.0, 0.0):
            self.zoom, self.pan = 1.0, (0.0, 0.0)
            self.view_changed.emit()
            self.update()

    def _set_pan(self, pan: tuple[float, float]) -> None:
        fit = self._fit()
        if fit is not None:
            pan = clamp_pan(pan, fit[2] * self.zoom, fit[3] * self.zoom, self.width(), self.height())
        self.pan = pan
        self.view_changed.emit()
        self.update()

    # -- drawing -------------------------------------------------------------------------------------

    def _slice_image(self) -> QImage | None:
        entry = self.state.shown
        index = self.slice_index()
        if entry is None or index is None:
            return None
        key = (entry.uid, index, self.state.window, self.state.convention)
        if key != self._image_key:
            plane = self.geometry_.extract(entry.data, index)
            grey = apply_window(plane, *self.state.window)
            self._buffer = grey
            rows, cols = grey.shape
            if self.colour_table is None:
                self._image = QImage(grey.data, cols, rows, grey.strides[0], QImage.Format.Format_Grayscale8)
            else:  # the windowed values index the table (e.g. the Compare window's diverging B - A colours)
                self._image = QImage(grey.data, cols, rows, grey.strides[0], QImage.Format.Format_Indexed8)
                self._image.setColorTable(self.colour_table)
            self._image_key = key
            self.draw_count += 1
        return self._image

    def _overlay_image(self) -> QImage | None:
        """The tissue overlay of the shown slice (None when off or the volume has no maps)."""
        entry = self.state.shown
        index = self.slice_index()
        choice = self.state.tissue_shown()
        if entry is None or index is None or choice is None:
            return None
        key = (entry.uid, index, self.state.convention, choice, self.state.tissue_opacity)
        if key != self._overlay_key:
            planes = {name: self.geometry_.extract(data, index) for name, data in entry.tissue.items()}
            rgba = np.ascontiguousarray(overlay_rgba(planes, choice, self.state.tissue_opacity))
            self._overlay_buffer = rgba
            rows, cols = rgba.shape[:2]
            self._overlay = QImage(
                rgba.data, cols, rows, rgba.strides[0], QImage.Format.Format_RGBA8888_Premultiplied
            )
            self._overlay_key = key
        return self._overlay

    def current_pixels(self) -> np.ndarray | None:
        """The windowed uint8 slice image as last drawn (for tests and screenshots)."""
        self._slice_image()
        return None if self._buffer is None else self._buffer.copy()

    def fonts(self) -> tuple[QFont, QFont]:
        """The overlay's regular and bold fonts (the bold one a point larger)."""
        font = QFont(self.font())
        font.setPointSizeF(max(8.0, font.pointSizeF()))
        bold = QFont(font)
        bold.setBold(True)
        bold.setPointSizeF(font.pointSizeF() + 1)
        return font, bold

    def overlay_texts(self) -> dict[str, str]:
        """What the overlay says now, by name (``title``, ``slice``, ``window``, ``tag``, ``orientation-*``)."""
        return {item.name: item.text for item in self.overlay_layout()}

    def overlay_rects(self) -> dict[str, QRectF]:
        """Where each overlay text's box is, in widget coordinates (they never overlap)."""
        return {item.name: item.rect for item in self.overlay_layout()}

    def _corner_texts(self, level: int) -> dict[str, str]:
        return corner_texts(self, level)

    def overlay_layout(self) -> list[OverlayText]:
        """Overlay boxes: title top-left, tag top-right, slice bottom-left, window bottom-right, and the
        orientation letters between those rows (see ``app.viewer.slice_overlay``)."""
        return overlay_layout(self)

    def empty_hint(self) -> str:
        """What an empty view says: its plane, and under it ``empty_text``."""
        return f"{self.plane.capitalize()}\n\n{self.empty_text}"

    def empty_hint_rect(self) -> QRectF:
        """Where the empty view's hint goes: inside the text margins, right of the plane's colour strip. The
        hint wraps at word breaks there, so a narrow view (1024-px window) shows it whole, not cut at both
        sides ("nerate a volume...")."""
        left = PLANE_STRIP + self.TEXT_MARGIN
        return QRectF(
            left,
            self.TEXT_MARGIN,
            self.width() - left - self.TEXT_MARGIN,
            self.height() - 2 * self.TEXT_MARGIN,
        )

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        painter.fillRect(self.rect(), BACKGROUND)
        image = self._slice_image()
        font, bold = self.fonts()
        if image is None:
            painter.setFont(font)
            painter.setPen(QColor("#6b7380"))
            painter.drawText(self.empty_hint_rect(), EMPTY_HINT_FLAGS, self.empty_hint())
        else:
            self._draw_image(painter, image)
            blended = self.foreground() if self.foreground is not None else None
            if blended is not None:
                painter.setOpacity(blended[1])
                self._draw_image(painter, blended[0])
                painter.setOpacity(1.0)
            overlay = self._overlay_image()
            if overlay is not None:
                self._draw_image(painter, overlay)
            if self.state.show_crosshair:
                self._draw_crosshair(painter)
        painter.fillRect(QRectF(0, 0, PLANE_STRIP, self.height()), PLANE_COLOURS[self.plane])
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        for item in self.overlay_layout():
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(BACKING)
            painter.drawRoundedRect(item.rect, 3, 3)
            painter.setFont(bold if item.bold else font)
            key = item.name if not item.name.startswith("orientation") else "orientation"
            if item.name == "tag" and self.state.shown is not None and self.state.shown.kind == "preview":
                key = "preview"
            painter.setPen(TEXT_COLOURS[key])
            painter.drawText(item.rect, Qt.AlignmentFlag.AlignCenter, item.text)
        painter.end()

    def _draw_image(self, painter: QPainter, image: QImage) -> None:
        rect = self.image_rect()
        target = rect.intersected(QRectF(self.rect()))
        if target.isEmpty():
            return
        # Draw only the part on screen: a 32x zoom must not scale the whole slice.
        sx, sy = image.width() / rect.width(), image.height() / rect.height()
        source = QRectF(
            (target.left() - rect.left()) * sx,
            (target.top() - rect.top()) * sy,
            target.width() * sx,
            target.height() * sy,
        )
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, self.state.smooth_display)
        painter.drawImage(target, image, source)

    def _draw_crosshair(self, painter: QPainter) -> None:
        """The other two planes' lines, with a gap around the centre so the structure under it stays visible."""
        rect = self.image_rect()
        centre = self.voxel_to_widget(self.state.crosshair_voxel())
        gap = 8.0
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        for other in (p for p in ("axial", "coronal", "sagittal") if p != self.plane):
            pen = QPen(PLANE_COLOURS[other])
            pen.setWidthF(1.0)
            painter.setPen(pen)
            other_axis = plane_geometry(other, self.state.convention).slice_axis
            if other_axis == self.geometry_.col_axis:  # a vertical line
                x = centre.x()
                painter.drawLine(QPointF(x, rect.top()), QPointF(x, centre.y() - gap))
                painter.drawLine(QPointF(x, centre.y() + gap), QPointF(x, rect.bottom()))
            else:
                y = centre.y()
                painter.drawLine(QPointF(rect.left(), y), QPointF(centre.x() - gap, y))
                painter.drawLine(QPointF(centre.x() + gap, y), QPointF(rect.right(), y))

    # -- interaction ---------------------------------------------------------------------------------

    def mousePressEvent(self, event) -> None:  # noqa: N802
        if self.state.shown is None:
            return
        button, shift = event.button(), bool(event.modifiers() & Qt.KeyboardModifier.ShiftModifier)
        if button == Qt.MouseButton.MiddleButton or (button == Qt.MouseButton.LeftButton and shift):
            self._drag = "pan"
            self._drag_origin = event.position()
            self._drag_pan = self.pan
            self.setCursor(Qt.CursorShape.ClosedHandCursor)
        elif button == Qt.MouseButton.LeftButton:
            # Where the crosshair was before the first press of a click burst: a double-click maximises
            # and puts it back there, as Slicer leaves the position alone.
            interval = QApplication.styleHints().mouseDoubleClickInterval()
            last = getattr(self, "_last_press_ms", None)
            if last is None or event.timestamp() - last > interval:
                self._crosshair_before_clicks = self.state.crosshair_ras.copy()
            self._last_press_ms = event.timestamp()
            self._drag = "crosshair"
            self._move_crosshair(event.position())
        elif button == Qt.MouseButton.RightButton:
            self._drag = "window"
            self._drag_origin = event.position()
            self._drag_window = self.state.window

    def mouseMoveEvent(self, event) -> None:  # noqa: N802
        if self._drag == "crosshair":
            self._move_crosshair(event.position())
        elif self._drag == "pan":
            delta = event.position() - self._drag_origin
            self._set_pan((self._drag_pan[0] + delta.x(), self._drag_pan[1] + delta.y()))
        elif self._drag == "window":
            entry = self.state.shown_volume()
            span = max(entry.percentile(99.5) - entry.percentile(0.5), 1e-6)
            delta = event.position() - self._drag_origin
            window, level = window_from_drag(*self._drag_window, delta.x(), delta.y(), span)
            self.state.set_window(window, level)
        self._update_readout(event.position())

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802
        if self._drag == "pan":
            self.unsetCursor()
        self._drag = None

    def mouseDoubleClickEvent(self, event) -> None:  # noqa: N802
        if event.button() == Qt.MouseButton.LeftButton:
            self._drag = None
            before = getattr(self, "_crosshair_before_clicks", None)
            if before is not None:
                self.state.set_crosshair(before)
            self.maximise_requested.emit()

    def wheelEvent(self, event) -> None:  # noqa: N802
        if self.state.shown is None:
            return
        delta = event.angleDelta().y()
        if event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.zoom_by(ZOOM_STEP ** (delta / 120), event.position())  # touchpads send fractions of a notch
        else:
            notches = int(delta / 120) if abs(delta) >= 120 else (1 if delta > 0 else -1 if delta < 0 else 0)
            self.step_slice(notches)
        event.accept()

    def keyPressEvent(self, event) -> None:  # noqa: N802
        key = event.key()
        if key in (Qt.Key.Key_Up, Qt.Key.Key_PageUp):
            self.step_slice(1)
        elif key in (Qt.Key.Key_Down, Qt.Key.Key_PageDown):
            self.step_slice(-1)
        elif key in (Qt.Key.Key_Home, Qt.Key.Key_End):
            self.go_to_slice(0 if key == Qt.Key.Key_Home else -1)
        elif key in (Qt.Key.Key_Plus, Qt.Key.Key_Equal):
            self.zoom_by(ZOOM_STEP)
        elif key in (Qt.Key.Key_Minus, Qt.Key.Key_Underscore):
            self.zoom_by(1 / ZOOM_STEP)
        elif key == Qt.Key.Key_0 and not event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.reset_view()
        else:
            super().keyPressEvent(event)

    def step_slice(self, steps: int) -> None:
        ijk = self.state.crosshair_voxel()
        if ijk is None or not steps:
            return
        self.go_to_slice(ijk[self.geometry_.slice_axis] + steps)

    def go_to_slice(self, index: int) -> None:
        """Show slice ``index`` (counted from 0; -1 is the last), clamped to the volume."""
        entry = self.state.shown
        crosshair = self.state.crosshair_voxel()
        if entry is None or crosshair is None:
            return
        axis = self.geometry_.slice_axis
        count = entry.shape[axis]
        ijk = np.asarray(crosshair, dtype=np.float64)
        ijk[axis] = np.clip(index if index >= 0 else count + index, 0, count - 1)
        self.state.set_crosshair(voxel_to_ras(entry.affine, ijk))

    def _move_crosshair(self, pos: QPointF) -> None:
        ijk = self.widget_to_voxel(pos)
        if ijk is not None:
            self.state.set_crosshair(voxel_to_ras(self.state.shown_volume().affine, np.round(ijk)))

    def _readout(self, voxel) -> str:
        entry = self.state.shown_volume()
        ras = voxel_to_ras(entry.affine, voxel)
        i, j, k = (int(v) + INDEX_BASE for v in voxel)
        value = format_intensity(float(entry.data[tuple(int(v) for v in voxel)]), entry.integer_valued)
        # Millimetres of the template when the volume is in MNI space (as FSLeyes and MRIcroGL say it).
        frame = "MNI" if is_mni(entry.space) else "RAS"
        text = (
            f"voxel ({i}, {j}, {k})   {frame} ({ras[0]:.1f}, {ras[1]:.1f}, {ras[2]:.1f}) mm   value {value}"
        )
        choice = self.state.tissue_shown()
        if choice is not None:
            text += f"   {tissue_at(entry.tissue, voxel, choice)}"
        return text

    def _update_readout(self, pos: QPointF) -> None:
        entry = self.state.shown
        ijk = self.widget_to_voxel(pos)
        if entry is None or ijk is None:
            return
        voxel = np.round(ijk).astype(int)
        inside = not (np.any(voxel < 0) or np.any(voxel >= np.asarray(entry.shape)))
        self.readout = self._readout(voxel) if inside else ""
        self.hovered.emit(self.readout)

    def leaveEvent(self, event) -> None:  # noqa: N802 - Qt override
        # The pointer left: the readout goes back to the crosshair's voxel, not the last one hovered.
        if self.readout:
            self.readout = ""
            self.hovered.emit("")
        super().leaveEvent(event)

    def crosshair_readout(self) -> str:
        ijk = self.state.crosshair_voxel()
        return "" if ijk is None else self._readout(ijk)

    # -- state ---------------------------------------------------------------------------------------

    def _on_state_shown_changed(self, entry) -> None:
        self._image_key = None
        self._overlay_key = None
        # Zoom is relative to the slice's physical size: keep it between volumes of one field of view (a
        # denoising preview and its result, two seeds), fit a different one afresh.
        extent = None if entry is None else np.asarray(entry.shape) * np.asarray(entry.spacing)
        if (
            extent is not None
            and self._extent is not None
            and not np.allclose(extent, self._extent, rtol=0.1)
        ):
            self.zoom, self.pan = 1.0, (0.0, 0.0)
            self.view_changed.emit()
        if extent is not None:
            self._extent = extent
        self.update()

    def _on_state_crosshair_changed(self, ras) -> None:
        self.update()

    def _on_state_window_changed(self, window, level) -> None:
        self.update()

    def _on_state_display_changed(self) -> None:
        self._image_key = None
        self._overlay_key = None
        self.update()

    def _on_state_overlay_changed(self) -> None:
        self.update()

    def _on_state_progress_changed(self, _tracker) -> None:
        entry = self.state.shown
        if entry is not None and entry.kind == "preview":  # the tag says how far the run is past the image
            self.update()


__all__ = ["OverlayText", "SliceView", "ras_to_voxel"]
