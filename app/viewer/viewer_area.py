"""The central area: axial, 3D, coronal and sagittal views in a four-up layout (like 3D Slicer).

The four cells always split the area evenly: a view's contents (the 3D view's controls, say) never change
the grid, so choosing a 3D mode does not move the slice views. A double-click on a slice view (or the 3D
view's maximise button) shows that view alone; the same again brings the four back.
"""

from __future__ import annotations

from functools import partial

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QGridLayout, QSizePolicy, QVBoxLayout, QWidget

from app.core.session import AppState
from app.viewer.slice_view import SliceView
from app.viewer.view3d import View3D

MIN_WIDTH, MIN_HEIGHT = 440, 340
CELLS = {"axial": (0, 0), "3d": (0, 1), "coronal": (1, 0), "sagittal": (1, 1)}


def _framed(widget: QWidget) -> QFrame:
    frame = QFrame()
    frame.setObjectName("viewFrame")
    # Ignored size policy and an explicit minimum: the grid splits by stretch alone, whatever the view
    # inside asks for (a frame's layout would otherwise raise the frame's minimum to its contents').
    frame.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)
    frame.setMinimumSize(120, 120)
    layout = QVBoxLayout(frame)
    layout.setContentsMargins(1, 1, 1, 1)
    layout.addWidget(widget)
    widget.setMinimumSize(0, 0)
    return frame


class ViewerArea(QWidget):
    maximised_changed = Signal(str)  # the view shown alone ("axial", "3d"...), or "" for all four

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.axial = SliceView(state, "axial")
        self.coronal = SliceView(state, "coronal")
        self.sagittal = SliceView(state, "sagittal")
        self.view3d = View3D(state)
        self.maximised = ""
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(4, 4, 4, 4)
        self._grid.setSpacing(4)
        self.frames: dict[str, QFrame] = {}
        for name, view in self.views().items():
            self.frames[name] = _framed(view)
            self._grid.addWidget(self.frames[name], *CELLS[name])
        for i in range(2):
            self._grid.setRowStretch(i, 1)
            self._grid.setColumnStretch(i, 1)
        for view in self.slice_views:
            view.maximise_requested.connect(partial(self.toggle_maximised, view.plane))
        self.view3d.maximise_requested.connect(partial(self.toggle_maximised, "3d"))
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        # Room for four usable views: docks beside the viewer shrink before the views get unreadable.
        self.setMinimumSize(MIN_WIDTH, MIN_HEIGHT)

    @property
    def slice_views(self) -> tuple[SliceView, SliceView, SliceView]:
        return self.axial, self.coronal, self.sagittal

    def views(self) -> dict[str, QWidget]:
        return {"axial": self.axial, "3d": self.view3d, "coronal": self.coronal, "sagittal": self.sagittal}

    def toggle_maximised(self, name: str) -> None:
        """Show view ``name`` alone, or all four again if it already is."""
        self.set_maximised("" if self.maximised == name else name)

    def set_maximised(self, name: str) -> None:
        if name == self.maximised:
            return
        if name and name not in CELLS:
            raise ValueError(f"view must be one of {tuple(CELLS)}, got {name!r}")
        if self.maximised:  # put the maximised frame back in its cell
            frame = self.frames[self.maximised]
            self._grid.removeWidget(frame)
            self._grid.addWidget(frame, *CELLS[self.maximised])
        for other, frame in self.frames.items():
            frame.setVisible(not name or other == name)
        if name:
            frame = self.frames[name]
            self._grid.removeWidget(frame)
            self._grid.addWidget(frame, 0, 0, 2, 2)
        self.maximised = name
        self.view3d.set_maximised(name == "3d")
        self.maximised_changed.emit(name)

    def reset_views(self) -> None:
        """Fit every slice view again (zoom 1, no pan)."""
        for view in self.slice_views:
            view.reset_view()
