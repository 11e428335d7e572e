"""The central area: axial, 3D, coronal and sagittal views in one of 3D Slicer's layouts.

Layouts (``LAYOUTS``): Four-Up (the default), Conventional (3D above a row of the three slices), One-up
(the axial view alone), Three slices in a row, and Side by side (the shown volume's three planes above
another volume's, linked and blended: ``app.viewer.side_by_side``). The cells split the area by stretch alone: a view's
contents (the 3D view's controls, say) never change the grid, so choosing a 3D mode does not move the
slice views. A double-click on a slice view (or the 3D view's maximise button) shows that view alone; the
same again brings the layout back.
"""

from __future__ import annotations

from functools import partial

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QGridLayout, QSizePolicy, QVBoxLayout, QWidget

from app.core.session import AppState
from app.viewer.side_by_side import SideBySide
from app.viewer.slice_view import SliceView
from app.viewer.view3d import View3D

# Two rows of 120 px views with the grid's margins: on a 700 px tall screen the Vault dock needs the rest.
MIN_WIDTH, MIN_HEIGHT = 440, 260
SIDE_BY_SIDE = "Side by side (A | B)"
CELLS = {"axial": (0, 0), "3d": (0, 1), "coronal": (1, 0), "sagittal": (1, 1)}  # the Four-Up grid

# name -> ({view: (row, column, row span, column span)}, row stretches, column stretches); views not
# named are hidden in that layout.
LAYOUTS: dict[str, tuple[dict[str, tuple[int, int, int, int]], tuple[int, ...], tuple[int, ...]]] = {
    "Four-Up": ({name: (row, col, 1, 1) for name, (row, col) in CELLS.items()}, (1, 1), (1, 1)),
    "Conventional": (
        {"3d": (0, 0, 1, 3), "axial": (1, 0, 1, 1), "coronal": (1, 1, 1, 1), "sagittal": (1, 2, 1, 1)},
        (2, 1),
        (1, 1, 1),
    ),
    "One-up": ({"axial": (0, 0, 1, 1)}, (1,), (1,)),
    "Three slices in a row": (
        {"axial": (0, 0, 1, 1), "coronal": (0, 1, 1, 1), "sagittal": (0, 2, 1, 1)},
        (1,),
        (1, 1, 1),
    ),
    # Slicer's compare model: the shown volume (A) above another (B), plane by plane, linked in world mm;
    # the bar above the views chooses B and blends it over A (app/viewer/side_by_side.py).
    SIDE_BY_SIDE: (
        {
            **{plane: (0, col, 1, 1) for col, plane in enumerate(("axial", "coronal", "sagittal"))},
            **{f"b_{plane}": (1, col, 1, 1) for col, plane in enumerate(("axial", "coronal", "sagittal"))},
        },
        (1, 1),
        (1, 1, 1),
    ),
}
DEFAULT_LAYOUT = "Four-Up"


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
    maximised_changed = Signal(str)  # the view shown alone ("axial", "3d"...), or "" for the layout
    layout_changed = Signal(str)  # a name of LAYOUTS

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.axial = SliceView(state, "axial")
        self.coronal = SliceView(state, "coronal")
        self.sagittal = SliceView(state, "sagittal")
        self.view3d = View3D(state)
        self.maximised = ""
        self.layout_name = DEFAULT_LAYOUT
        self.side_by_side = SideBySide(state, self.slice_views, self)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        outer.addWidget(self.side_by_side.bar)
        self._grid = QGridLayout()
        outer.addLayout(self._grid, 1)
        self._grid.setContentsMargins(4, 4, 4, 4)
        self._grid.setSpacing(4)
        self.frames: dict[str, QFrame] = {name: _framed(view) for name, view in self.views().items()}
        self.b_frames: dict[str, QFrame] = {name: _framed(view) for name, view in self.b_views().items()}
        self._place()
        for view in self.slice_views:
            view.maximise_requested.connect(partial(self.toggle_maximised, view.plane))
        for plane, view in self.side_by_side.views.items():
            view.maximise_requested.connect(partial(self.toggle_maximised, f"b_{plane}"))
        self.view3d.maximise_requested.connect(partial(self.toggle_maximised, "3d"))
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        # Room for four usable views: docks beside the viewer shrink before the views get unreadable.
        self.setMinimumSize(MIN_WIDTH, MIN_HEIGHT)

    @property
    def slice_views(self) -> tuple[SliceView, SliceView, SliceView]:
        return self.axial, self.coronal, self.sagittal

    def views(self) -> dict[str, QWidget]:
        return {"axial": self.axial, "3d": self.view3d, "coronal": self.coronal, "sagittal": self.sagittal}

    def b_views(self) -> dict[str, QWidget]:
        """The side-by-side layout's views of the other volume (B), by name (``b_axial``...)."""
        return {f"b_{plane}": view for plane, view in self.side_by_side.views.items()}

    def _all_frames(self) -> dict[str, QFrame]:
        return {**self.frames, **self.b_frames}

    def _place(self) -> None:
        """Lay the frames out for ``layout_name``, or the maximised view alone over the whole area."""
        cells, rows, columns = LAYOUTS[self.layout_name]
        if self.maximised:
            cells, rows, columns = {self.maximised: (0, 0, 1, 1)}, (1,), (1,)
        for frame in self._all_frames().values():
            self._grid.removeWidget(frame)
        self.side_by_side.set_active(self.layout_name == SIDE_BY_SIDE)
        for index in range(3):  # stretches of rows and columns a smaller layout no longer uses go to 0
            self._grid.setRowStretch(index, rows[index] if index < len(rows) else 0)
            self._grid.setColumnStretch(index, columns[index] if index < len(columns) else 0)
        for name, frame in self._all_frames().items():
            if name in cells:
                self._grid.addWidget(frame, *cells[name])
            frame.setVisible(name in cells)

    def set_layout(self, name: str) -> None:
        """Use one of ``LAYOUTS`` (a view shown alone goes back into it)."""
        if name not in LAYOUTS:
            raise ValueError(f"layout must be one of {tuple(LAYOUTS)}, got {name!r}")
        if name == self.layout_name and not self.maximised:
            return
        self.layout_name = name
        if self.maximised:
            self.set_maximised("")
        else:
            self._place()
        self.layout_changed.emit(name)

    def toggle_maximised(self, name: str) -> None:
        """Show view ``name`` alone, or the layout again if it already is."""
        self.set_maximised("" if self.maximised == name else name)

    def set_maximised(self, name: str) -> None:
        if name == self.maximised:
            return
        if name and name not in self._all_frames():
            raise ValueError(f"view must be one of {tuple(self._all_frames())}, got {name!r}")
        self.maximised = name
        self._place()
        self.view3d.set_maximised(name == "3d")
        self.maximised_changed.emit(name)

    def reset_views(self) -> None:
        """Fit every slice view again (zoom 1, no pan)."""
        for view in self.slice_views:
            view.reset_view()
