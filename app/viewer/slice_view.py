"""One slice view drawn with plain Qt: a QImage made from numpy, painted in ``paintEvent``.

Interaction (ITK-SNAP-like): left click/drag moves the crosshair, the wheel steps through slices,
right-drag changes window (horizontal) and level (vertical). The view reads everything from ``AppState``
and writes changes back to it, so the three views stay linked.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QImage, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.core.session import AppState
from app.core.slicing import apply_window, plane_geometry, window_from_drag
from app.core.volumes import ras_to_voxel, voxel_to_ras

PLANE_COLOURS = {"axial": QColor("#e0524f"), "coronal": QColor("#5fb85c"), "sagittal": QColor("#4d8fe6")}
BACKGROUND = QColor("#0b0d10")


class SliceView(QWidget):
    """Axial, coronal or sagittal view of ``state.shown``."""

    hovered = Signal(str)  # the readout line under the cursor (voxel, RAS mm, intensity)

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
        self._drag: str | None = None
        self._drag_origin = QPointF()
        self._drag_window = (1.0, 0.5)
        self.readout = ""
        self.draw_count = 0  # how many slice images were built (tests use it)
        state.shown_changed.connect(self._on_state_shown_changed)
        state.crosshair_changed.connect(self._on_state_crosshair_changed)
        state.window_changed.connect(self._on_state_window_changed)
        state.display_changed.connect(self._on_state_display_changed)

    # -- geometry ------------------------------------------------------------------------------------

    @property
    def geometry_(self):
        return plane_geometry(self.plane, self.state.convention)

    def slice_index(self) -> int | None:
        ijk = self.state.crosshair_voxel()
        return None if ijk is None else ijk[self.geometry_.slice_axis]

    def image_rect(self) -> QRectF:
        """Where the slice image is painted: centred, scaled to fit, with physical (mm) aspect."""
        entry = self.state.shown
        if entry is None:
            return QRectF()
        geom = self.geometry_
        rows, cols = geom.display_shape(entry.shape)
        row_mm, col_mm = geom.pixel_aspect(entry.spacing)
        height_mm, width_mm = rows * row_mm, cols * col_mm
        margin = 6.0
        avail_w, avail_h = max(1.0, self.width() - 2 * margin), max(1.0, self.height() - 2 * margin)
        scale = min(avail_w / width_mm, avail_h / height_mm)
        w, h = width_mm * scale, height_mm * scale
        return QRectF((self.width() - w) / 2, (self.height() - h) / 2, w, h)

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
        entry = self.state.shown
        rect = self.image_rect()
        rows, cols = self.geometry_.display_shape(entry.shape)
        row, col = self.geometry_.to_display(ijk, entry.shape)
        return QPointF(
            rect.left() + (col + 0.5) / cols * rect.width(), rect.top() + (row + 0.5) / rows * rect.height()
        )

    # -- drawing -------------------------------------------------------------------------------------

    def _slice_image(self) -> QImage | None:
        entry = self.state.shown
        index = self.slice_index()
        if entry is None or index is None:
            return None
        key = (entry.uid, index, self.state.window, self.state.convention)
        if key != self._image_key:
            plane = self.geometry_.extract(entry.data, index)
            grey = apply_window(plane, *self._window_bounds())
            self._buffer = grey
            rows, cols = grey.shape
            self._image = QImage(grey.data, cols, rows, grey.strides[0], QImage.Format.Format_Grayscale8)
            self._image_key = key
            self.draw_count += 1
        return self._image

    def _window_bounds(self) -> tuple[float, float]:
        return self.state.window

    def current_pixels(self) -> np.ndarray | None:
        """The windowed uint8 slice image as last drawn (for tests and screenshots)."""
        self._slice_image()
        return None if self._buffer is None else self._buffer.copy()

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        painter.fillRect(self.rect(), BACKGROUND)
        colour = PLANE_COLOURS[self.plane]
        image = self._slice_image()
        font = QFont(self.font())
        font.setPointSizeF(max(8.0, font.pointSizeF()))
        painter.setFont(font)
        if image is None:
            painter.setPen(QColor("#6b7380"))
            painter.drawText(
                self.rect(),
                Qt.AlignmentFlag.AlignCenter,
                f"{self.plane.capitalize()}\n\nGenerate a volume or open a NIfTI file",
            )
            self._draw_title(painter, colour)
            return
        rect = self.image_rect()
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, self.state.smooth_display)
        painter.drawImage(rect, image)

        # crosshair: a gap around the centre so the structure under it stays visible
        ijk = self.state.crosshair_voxel()
        centre = self.voxel_to_widget(ijk)
        others = [p for p in ("axial", "coronal", "sagittal") if p != self.plane]
        gap = 8.0
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        for other in others:
            pen = QPen(PLANE_COLOURS[other])
            pen.setWidthF(1.0)
            painter.setPen(pen)
            other_axis = plane_geometry(other, self.state.convention).slice_axis
            vertical = other_axis == self.geometry_.col_axis
            if vertical:
                x = centre.x()
                painter.drawLine(QPointF(x, rect.top()), QPointF(x, centre.y() - gap))
                painter.drawLine(QPointF(x, centre.y() + gap), QPointF(x, rect.bottom()))
            else:
                y = centre.y()
                painter.drawLine(QPointF(rect.left(), y), QPointF(centre.x() - gap, y))
                painter.drawLine(QPointF(centre.x() + gap, y), QPointF(rect.right(), y))

        # orientation labels at the middle of each edge
        left, right, top, bottom = self.geometry_.labels
        painter.setPen(QColor("#f0c674"))
        bold = QFont(font)
        bold.setBold(True)
        bold.setPointSizeF(font.pointSizeF() + 1)
        painter.setFont(bold)
        fm = painter.fontMetrics()
        pad = 4
        painter.drawText(QPointF(rect.left() + pad, rect.center().y() + fm.ascent() / 2), left)
        painter.drawText(
            QPointF(rect.right() - pad - fm.horizontalAdvance(right), rect.center().y() + fm.ascent() / 2),
            right,
        )
        painter.drawText(
            QPointF(rect.center().x() - fm.horizontalAdvance(top) / 2, rect.top() + pad + fm.ascent()), top
        )
        painter.drawText(
            QPointF(rect.center().x() - fm.horizontalAdvance(bottom) / 2, rect.bottom() - pad - fm.descent()),
            bottom,
        )
        painter.setFont(font)
        self._draw_title(painter, colour)

        # slice number and window at the bottom corners
        fm = painter.fontMetrics()
        entry = self.state.shown
        index = ijk[self.geometry_.slice_axis]
        count = entry.shape[self.geometry_.slice_axis]
        window, level = self.state.window
        painter.setPen(QColor("#aab2bf"))
        painter.drawText(QPointF(8, self.height() - 8), f"slice {index + 1}/{count}")
        wl = f"W {window:.3g}  L {level:.3g}"
        painter.drawText(QPointF(self.width() - 8 - fm.horizontalAdvance(wl), self.height() - 8), wl)
        if entry.kind == "preview":
            painter.setPen(QColor("#f0c674"))
            tag = "PREVIEW (x\u2080 estimate)"
            painter.drawText(QPointF(self.width() - 8 - fm.horizontalAdvance(tag), 8 + fm.ascent()), tag)
        elif entry.synthetic:
            painter.setPen(QColor("#c678dd"))
            tag = "SYNTHETIC"
            painter.drawText(QPointF(self.width() - 8 - fm.horizontalAdvance(tag), 8 + fm.ascent()), tag)

    def _draw_title(self, painter: QPainter, colour: QColor) -> None:
        fm = painter.fontMetrics()
        title = self.plane.capitalize()
        if self.plane != "sagittal":
            title += "  (" + self.state.convention[:5] + ".)"
        painter.fillRect(QRectF(0, 0, 4, self.height()), colour)
        painter.setPen(QColor("#dfe3ea"))
        painter.drawText(QPointF(10, 8 + fm.ascent()), title)

    # -- interaction ---------------------------------------------------------------------------------

    def mousePressEvent(self, event) -> None:  # noqa: N802
        if self.state.shown is None:
            return
        if event.button() == Qt.MouseButton.LeftButton:
            self._drag = "crosshair"
            self._move_crosshair(event.position())
        elif event.button() == Qt.MouseButton.RightButton:
            self._drag = "window"
            self._drag_origin = event.position()
            self._drag_window = self.state.window

    def mouseMoveEvent(self, event) -> None:  # noqa: N802
        if self._drag == "crosshair":
            self._move_crosshair(event.position())
        elif self._drag == "window":
            entry = self.state.shown
            span = max(entry.percentile(99.5) - entry.percentile(0.5), 1e-6)
            delta = event.position() - self._drag_origin
            window, level = window_from_drag(*self._drag_window, delta.x(), delta.y(), span)
            self.state.set_window(window, level)
        self._update_readout(event.position())

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802
        self._drag = None

    def wheelEvent(self, event) -> None:  # noqa: N802
        entry = self.state.shown
        if entry is None:
            return
        steps = event.angleDelta().y() // 120 or (
            1 if event.angleDelta().y() > 0 else -1 if event.angleDelta().y() < 0 else 0
        )
        self.step_slice(int(steps))
        event.accept()

    def keyPressEvent(self, event) -> None:  # noqa: N802
        if event.key() in (Qt.Key.Key_Up, Qt.Key.Key_PageUp):
            self.step_slice(1)
        elif event.key() in (Qt.Key.Key_Down, Qt.Key.Key_PageDown):
            self.step_slice(-1)
        else:
            super().keyPressEvent(event)

    def step_slice(self, steps: int) -> None:
        entry = self.state.shown
        ijk = self.state.crosshair_voxel()
        if entry is None or ijk is None or not steps:
            return
        ijk = np.asarray(ijk, dtype=np.float64)
        axis = self.geometry_.slice_axis
        ijk[axis] = np.clip(ijk[axis] + steps, 0, entry.shape[axis] - 1)
        self.state.set_crosshair(voxel_to_ras(entry.affine, ijk))

    def _move_crosshair(self, pos: QPointF) -> None:
        ijk = self.widget_to_voxel(pos)
        if ijk is not None:
            self.state.set_crosshair(voxel_to_ras(self.state.shown.affine, np.round(ijk)))

    def _update_readout(self, pos: QPointF) -> None:
        entry = self.state.shown
        ijk = self.widget_to_voxel(pos)
        if entry is None or ijk is None:
            return
        voxel = np.round(ijk).astype(int)
        if np.any(voxel < 0) or np.any(voxel >= np.asarray(entry.shape)):
            self.readout = ""
        else:
            ras = voxel_to_ras(entry.affine, voxel)
            value = float(entry.data[tuple(voxel)])
            self.readout = (
                f"voxel ({voxel[0]}, {voxel[1]}, {voxel[2]})   "
                f"RAS ({ras[0]:.1f}, {ras[1]:.1f}, {ras[2]:.1f}) mm   value {value:.4g}"
            )
        self.hovered.emit(self.readout)

    def crosshair_readout(self) -> str:
        entry = self.state.shown
        ijk = self.state.crosshair_voxel()
        if entry is None or ijk is None:
            return ""
        ras = voxel_to_ras(entry.affine, ijk)
        return (
            f"voxel ({ijk[0]}, {ijk[1]}, {ijk[2]})   RAS ({ras[0]:.1f}, {ras[1]:.1f}, {ras[2]:.1f}) mm   "
            f"value {float(entry.data[ijk]):.4g}"
        )

    # -- state ---------------------------------------------------------------------------------------

    def _on_state_shown_changed(self, entry) -> None:
        self._image_key = None
        self.update()

    def _on_state_crosshair_changed(self, ras) -> None:
        self.update()

    def _on_state_window_changed(self, window, level) -> None:
        self.update()

    def _on_state_display_changed(self) -> None:
        self._image_key = None
        self.update()


__all__ = ["SliceView", "ras_to_voxel"]
