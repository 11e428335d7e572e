"""Two volumes side by side: the shown one (A) above, another of the session (B) below, each in its three
planes, with B blended over A's views at an opacity, and one crosshair linked through world coordinates.

Modelled on 3D Slicer: A is the background, B the foreground with an opacity slider ("Blend B over A"), and
the views are linked in RAS millimetres (Slicer's linked slice views; ITK-SNAP links its cursor the same
way). B has its own window/level (a scan and a synthetic volume rarely share an intensity range) and its own
zoom. Where the two volumes do not name one template space the views are linked centre to centre, and the
bar above the views says so (``app.core.compare_pair``); a scan whose header says only "aligned to a template"
(nilearn's MNI152 files) can be declared MNI152 there, and is then linked by millimetres. A's views name what
is blended over them in their corner, as Slicer names its foreground layer and opacity: "B 40%", with the
SYNTHETIC mark when B is synthetic.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from app.core.compare_pair import link_text, linked_ras, resampled_plane, to_declare
from app.core.session import AppState
from app.core.slicing import apply_window
from app.core.tissue import ALIGNED_TO_TEMPLATE, DECLARED_MNI
from app.viewer.slice_view import SliceView

PLANES = ("axial", "coronal", "sagittal")
DEFAULT_OPACITY = 0  # percent: side by side first; the slider blends


class SideBySide(QObject):
    """The B views, the bar that chooses B and the blend, and the links between the two states.

    Args:
        state: The session (``AppState``): A is its shown volume; B is chosen among its other volumes.
        a_views: The viewer's slice views of A, which get B blended over them.
    """

    def __init__(
        self, state: AppState, a_views: tuple[SliceView, ...], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.a_views = a_views
        self.companion = AppState()  # B's display state: its crosshair, window and the volume it shows
        self.views = {plane: SliceView(self.companion, plane) for plane in PLANES}
        for view in self.views.values():
            view.label = "B"
            view.setObjectName(f"slice-b-{view.plane}")
            view.empty_text = "Open or generate a second volume to see it beside this one"
        self.active = False
        self.other = None  # B
        self._previous = None  # the volume shown before A: B by default
        self._linking = False
        self._blend_cache: dict[str, tuple[tuple, QImage, np.ndarray]] = {}
        self._build_bar()
        state.shown_changed.connect(self._on_state_shown_changed)
        state.volumes_changed.connect(self._on_state_volumes_changed)
        state.crosshair_changed.connect(self._on_state_crosshair_changed)
        state.display_changed.connect(self._on_state_display_changed)
        self.companion.crosshair_changed.connect(self._on_companion_crosshair_changed)
        self.companion.window_changed.connect(self._on_companion_window_changed)
        for view in a_views:
            view.foreground = self._blend_for(view)
            view.foreground_layer = self.foreground_layer

    def _build_bar(self) -> None:
        self.bar = QWidget()
        self.bar.setObjectName("sideBySideBar")
        self.b_box = QComboBox()
        self.b_box.setObjectName("sideBySideVolume")
        self.b_box.setToolTip("The volume shown below (B), beside the shown one (A)")
        self.b_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.b_box.setMinimumContentsLength(8)
        self.b_box.activated.connect(self._on_b_box_activated)
        b_label = QLabel("&B:")
        b_label.setBuddy(self.b_box)
        self.opacity_slider = QSlider(Qt.Orientation.Horizontal)
        self.opacity_slider.setObjectName("blendSlider")
        self.opacity_slider.setRange(0, 100)
        self.opacity_slider.setSingleStep(5)
        self.opacity_slider.setPageStep(25)
        self.opacity_slider.setValue(DEFAULT_OPACITY)
        self.opacity_slider.setMinimumWidth(60)
        self.opacity_slider.setMaximumWidth(110)
        self.opacity_slider.setToolTip("How opaque B is over A's views (0: A alone, 100: B alone)")
        self.opacity_slider.valueChanged.connect(self._on_opacity_slider_changed)
        blend_label = QLabel("B&lend over A:")
        blend_label.setBuddy(self.opacity_slider)
        self.opacity_label = QLabel(f"{DEFAULT_OPACITY}%")
        self.opacity_label.setMinimumWidth(self.opacity_label.fontMetrics().horizontalAdvance("100%") + 2)
        self.declare_button = QPushButton("")
        self.declare_button.setObjectName("declareMni")
        self.declare_button.clicked.connect(self._on_declare_button_clicked)
        self.declare_button.hide()
        # Its own line, wrapped: how the two are linked is the one thing a reader must not miss.
        self.link_label = QLabel("")
        self.link_label.setObjectName("sideBySideLink")
        self.link_label.setWordWrap(True)
        self.link_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        column = QVBoxLayout(self.bar)
        column.setContentsMargins(4, 2, 4, 0)
        column.setSpacing(2)
        row = QHBoxLayout()
        column.addLayout(row)
        link_row = QHBoxLayout()  # the declaration beside the statement it changes
        column.addLayout(link_row)
        link_row.addWidget(self.link_label, 1)
        link_row.addWidget(self.declare_button, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(b_label)
        row.addWidget(self.b_box)
        row.addSpacing(8)
        row.addWidget(blend_label)
        row.addWidget(self.opacity_slider)
        row.addWidget(self.opacity_label)
        row.addStretch(1)
        self.bar.hide()

    # -- choosing B ----------------------------------------------------------------------------------

    def candidates(self) -> list:
        """The session's volumes B can be: any but A and the transient previews."""
        shown = self.state.shown
        return [e for e in self.state.volumes if e is not shown and e.kind != "preview"]

    def set_active(self, active: bool) -> None:
        self.active = active
        self.bar.setVisible(active)
        for view in self.a_views:
            view.label = "A" if active else ""
            view.update()
        if active:
            self._choose(self.other)

    def set_other(self, entry) -> None:
        """Show ``entry`` as B (one of ``candidates()``)."""
        self._choose(entry)

    def _choose(self, wanted) -> None:
        options = self.candidates()
        if wanted not in options:
            wanted = self._previous if self._previous in options else (options[-1] if options else None)
        self.other = wanted
        self.b_box.blockSignals(True)
        self.b_box.clear()
        for entry in options:
            self.b_box.addItem(entry.name, entry.uid)
        self.b_box.setCurrentIndex(options.index(wanted) if wanted is not None else -1)
        self.b_box.setEnabled(bool(options))
        self.b_box.blockSignals(False)
        self.companion.convention = self.state.convention
        self.companion.smooth_display = self.state.smooth_display
        self.companion.show_crosshair = self.state.show_crosshair
        if self.companion.shown is not wanted:
            self.companion.show(wanted)
        self._blend_cache.clear()
        a = self.state.shown
        if a is None or wanted is None:
            self.link_label.setText(
                "" if a is None else "One volume in the session: open or generate another."
            )
        else:
            self.link_label.setText(link_text(a, wanted))
            self._link_to_b(self.state.crosshair_ras)
        self.link_label.setToolTip(self.link_label.text())
        self._update_declare_button()
        for view in self.a_views:
            view.update()

    def _update_declare_button(self) -> None:
        a, b = self.state.shown, self.other
        one = to_declare(a, b) if a is not None and b is not None else None
        self.declare_button.setVisible(one is not None)
        if one is None:
            return
        which = "A" if one is a else "B"
        self.declare_button.setText(f"&Declare {which} MNI152")
        self.declare_button.setToolTip(
            f"{which}'s header says it is {ALIGNED_TO_TEMPLATE} without naming the template (nilearn's MNI152 "
            "files say so). If it is MNI152, declare it: the views are then linked in MNI152 millimetres, by "
            "anatomy, instead of centre to centre."
        )

    def _on_declare_button_clicked(self) -> None:
        a, b = self.state.shown, self.other
        one = to_declare(a, b) if a is not None and b is not None else None
        if one is not None:
            self.state.declare_space(one, DECLARED_MNI)

    # -- the blend -----------------------------------------------------------------------------------

    def _blend_for(self, view: SliceView):
        def blended():
            return self.blend_image(view)

        return blended

    def blend_image(self, view: SliceView) -> tuple[QImage, float] | None:
        """B's slice resampled onto ``view``'s slice of A and windowed with B's window, with its opacity."""
        a, b, opacity = self.state.shown, self.other, self.opacity_slider.value() / 100
        index = view.slice_index()
        if not self.active or a is None or b is None or opacity <= 0 or index is None:
            return None
        key = (a.uid, b.uid, index, self.state.convention, self.companion.window)
        cached = self._blend_cache.get(view.plane)
        if cached is None or cached[0] != key:
            plane = resampled_plane(a, b, view.geometry_, index)
            inside = np.isfinite(plane)
            grey = apply_window(np.where(inside, plane, 0.0), *self.companion.window)
            rgba = np.zeros((*plane.shape, 4), np.uint8)
            rgba[..., 0] = rgba[..., 1] = rgba[..., 2] = np.where(inside, grey, 0)
            rgba[..., 3] = np.where(inside, 255, 0)
            rgba = np.ascontiguousarray(rgba)
            rows, cols = plane.shape
            image = QImage(
                rgba.data, cols, rows, rgba.strides[0], QImage.Format.Format_RGBA8888_Premultiplied
            )
            cached = (key, image, rgba)  # the array keeps the image's memory alive
            self._blend_cache[view.plane] = cached
        return cached[1], opacity

    def foreground_layer(self) -> tuple[str, float, bool] | None:
        """What is blended over A's views now: ("B", opacity 0..1, whether B is synthetic), None for nothing."""
        opacity = self.opacity_slider.value() / 100
        if not self.active or self.other is None or self.state.shown is None or opacity <= 0:
            return None
        return "B", opacity, bool(self.other.synthetic)

    # -- links ---------------------------------------------------------------------------------------

    def _link_to_b(self, ras) -> None:
        if self._linking or self.other is None or self.state.shown is None:
            return
        self._linking = True
        try:
            self.companion.set_crosshair(linked_ras(self.state.shown, self.other, ras))
        finally:
            self._linking = False

    def _on_companion_crosshair_changed(self, ras) -> None:
        if self._linking or not self.active or self.other is None or self.state.shown is None:
            return
        self._linking = True
        try:
            self.state.set_crosshair(linked_ras(self.other, self.state.shown, ras))
        finally:
            self._linking = False

    def _on_state_crosshair_changed(self, ras) -> None:
        if self.active:
            self._link_to_b(ras)

    def _on_companion_window_changed(self, *_window) -> None:
        for view in self.a_views:
            view.update()

    def _on_state_shown_changed(self, entry) -> None:
        previous, self._current = getattr(self, "_current", None), entry
        if entry is not None and entry.kind == "preview":
            return
        if previous is not None and previous is not entry and previous.kind != "preview":
            self._previous = previous
        if self.active:
            # A became B: B is the volume A was (a swap), else B stays.
            self._choose(self._previous if entry is self.other else self.other)

    def _on_state_volumes_changed(self) -> None:
        if self.active:
            self._choose(self.other)

    def _on_state_display_changed(self) -> None:
        if self.companion.convention != self.state.convention:
            self.companion.set_convention(self.state.convention)
        if self.companion.smooth_display != self.state.smooth_display:
            self.companion.set_smooth_display(self.state.smooth_display)
        if self.companion.show_crosshair != self.state.show_crosshair:
            self.companion.set_show_crosshair(self.state.show_crosshair)
        self._blend_cache.clear()

    # -- slots ---------------------------------------------------------------------------------------

    def _on_b_box_activated(self, index: int) -> None:
        uid = self.b_box.itemData(index)
        self._choose(next((e for e in self.candidates() if e.uid == uid), None))

    def _on_opacity_slider_changed(self, value: int) -> None:
        self.opacity_label.setText(f"{value}%")
        for view in self.a_views:
            view.update()
