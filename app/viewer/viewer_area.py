"""The central area: axial, 3D, coronal and sagittal views in a four-up layout (like 3D Slicer)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QGridLayout, QVBoxLayout, QWidget

from app.core.session import AppState
from app.viewer.slice_view import SliceView
from app.viewer.view3d import View3D


def _framed(widget: QWidget) -> QFrame:
    frame = QFrame()
    frame.setObjectName("viewFrame")
    layout = QVBoxLayout(frame)
    layout.setContentsMargins(1, 1, 1, 1)
    layout.addWidget(widget)
    return frame


class ViewerArea(QWidget):
    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.axial = SliceView(state, "axial")
        self.coronal = SliceView(state, "coronal")
        self.sagittal = SliceView(state, "sagittal")
        self.view3d = View3D(state)
        grid = QGridLayout(self)
        grid.setContentsMargins(4, 4, 4, 4)
        grid.setSpacing(4)
        grid.addWidget(_framed(self.axial), 0, 0)
        grid.addWidget(_framed(self.view3d), 0, 1)
        grid.addWidget(_framed(self.coronal), 1, 0)
        grid.addWidget(_framed(self.sagittal), 1, 1)
        for i in range(2):
            grid.setRowStretch(i, 1)
            grid.setColumnStretch(i, 1)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)

    @property
    def slice_views(self) -> tuple[SliceView, SliceView, SliceView]:
        return self.axial, self.coronal, self.sagittal
