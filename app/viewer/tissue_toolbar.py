"""The tissue overlay's tool bar: on/off (Ctrl+T), which map (or all tissues as a label map), opacity, and a
legend of the colours drawn. A view of ``AppState``: it changes the overlay settings and follows them and the
shown volume (its controls are disabled, with the reason, for a volume without tissue maps).
"""

from __future__ import annotations

import html

from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QAction, QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QComboBox, QLabel, QSlider, QToolBar, QWidget

from app.core.session import AppState
from app.core.tissue import ALL_TISSUES, MASKS, tissue_colour, tissue_title
from app.services.shortcuts import SHORTCUTS, set_shortcut
from app.widgets.theme import CHECKED_TOOLBUTTON_STYLE

TISSUE_SHORTCUT = SHORTCUTS["view.tissue_overlay"].keys
NO_TISSUE_TIP = (
    "This volume has no tissue maps. Volumes of a model that makes them (GM, WM, CSF, ventricles) have "
    "them, and so do NIfTI files opened with their maps beside them (brain_label-GM_probseg.nii.gz...). "
    f"Compute Tissue Maps ({SHORTCUTS['view.compute_tissue_maps'].keys}) segments any brain volume."
)


def swatch_icon(colours: list[tuple[int, int, int]]) -> QIcon:
    """A small square of colour stripes: one map's colour, or the label map's colours side by side."""
    pixmap = QPixmap(24, 24)
    pixmap.setDevicePixelRatio(2.0)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    width = 10.0 / max(len(colours), 1)
    for index, colour in enumerate(colours):
        painter.fillRect(QRectF(1 + index * width, 1, width, 10), QColor(*colour))
    painter.end()
    return QIcon(pixmap)


class TissueToolbar(QToolBar):
    """Tissue overlay controls of the slice views."""

    contents_changed = Signal()  # its width changed (the legend came or went, other maps)

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__("Tissue Overlay", parent)
        self.setObjectName("tissueToolbar")
        self.setMovable(False)
        self.setStyleSheet(CHECKED_TOOLBUTTON_STYLE)
        self.state = state

        self.tissue_action = QAction("Tissue Overlay", self)
        self.tissue_action.setObjectName("tissueOverlay")
        self.tissue_action.setIconText("Tissue overlay")
        self.tissue_action.setCheckable(True)
        set_shortcut(self.tissue_action, "view.tissue_overlay")
        self.tissue_action.toggled.connect(self._on_tissue_action_toggled)
        self.addAction(self.tissue_action)
        self.tissue_box = QComboBox()
        self.tissue_box.setObjectName("tissueMap")
        self.tissue_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.tissue_box.activated.connect(self._on_tissue_box_activated)
        self.addWidget(self.tissue_box)
        self.opacity_slider = QSlider(Qt.Orientation.Horizontal)
        self.opacity_slider.setObjectName("tissueOpacity")
        self.opacity_slider.setRange(0, 100)
        self.opacity_slider.setSingleStep(5)
        self.opacity_slider.setPageStep(10)
        self.opacity_slider.setFixedWidth(80)
        self.opacity_slider.valueChanged.connect(self._on_opacity_slider_changed)
        self.addWidget(self.opacity_slider)
        self.opacity_label = QLabel()
        self.opacity_label.setObjectName("tissueOpacityValue")
        self.opacity_label.setMinimumWidth(self.opacity_label.fontMetrics().horizontalAdvance("100%") + 6)
        self.addWidget(self.opacity_label)
        self.legend_label = QLabel()
        self.legend_label.setObjectName("tissueLegend")
        self.legend_label.setTextFormat(Qt.TextFormat.RichText)
        self.legend_label.setContentsMargins(4, 0, 4, 0)
        self.legend_label.setToolTip("The overlay's colours")
        self.legend_action = self.addWidget(self.legend_label)
        self.legend_action.setVisible(False)

        state.shown_changed.connect(self._on_state_shown_changed)
        state.overlay_changed.connect(self._on_state_overlay_changed)
        self._on_state_overlay_changed()

    def _on_state_shown_changed(self, entry) -> None:
        self._on_state_overlay_changed()

    def _on_state_overlay_changed(self) -> None:
        """The controls follow the overlay settings and what the shown volume has."""
        entry = self.state.shown
        names = entry.tissue_names if entry is not None and entry.kind != "preview" else []
        items = [ALL_TISSUES, *names] if names else [ALL_TISSUES]
        if [self.tissue_box.itemData(i) for i in range(self.tissue_box.count())] != items:
            self.tissue_box.blockSignals(True)
            self.tissue_box.clear()
            colours = [tissue_colour(n, names) for n in names] or [(110, 115, 125)]
            self.tissue_box.addItem(swatch_icon(colours), ALL_TISSUES, ALL_TISSUES)
            for name in names:
                self.tissue_box.addItem(swatch_icon([tissue_colour(name, names)]), name, name)
                self.tissue_box.setItemData(
                    self.tissue_box.count() - 1, tissue_title(name), Qt.ItemDataRole.ToolTipRole
                )
            self.tissue_box.blockSignals(False)
            self.contents_changed.emit()
        shown = self.state.tissue_choice if self.state.tissue_choice in names else ALL_TISSUES
        self.tissue_box.setCurrentIndex(max(0, self.tissue_box.findData(shown)))
        percent = round(self.state.tissue_opacity * 100)
        self.opacity_slider.blockSignals(True)
        self.opacity_slider.setValue(percent)
        self.opacity_slider.blockSignals(False)
        self.opacity_label.setText(f"{percent}%")
        self.tissue_action.blockSignals(True)
        self.tissue_action.setChecked(self.state.show_tissue)
        self.tissue_action.blockSignals(False)

        # The legend: the colours drawn now (every map's for all tissues, one map's for one).
        drawn = self.state.tissue_shown()
        legend = (
            [] if drawn is None else [n for n in names if n not in MASKS] if drawn == ALL_TISSUES else [drawn]
        )
        self.legend_label.setText(
            "&nbsp;&nbsp;".join(
                f'<span style="color:{QColor(*tissue_colour(n, names)).name()}">&#9632;</span>&nbsp;'
                f"{html.escape(n)}"
                for n in legend
            )
        )
        if bool(legend) != self.legend_action.isVisible():
            self.legend_action.setVisible(bool(legend))
            self.contents_changed.emit()

        has_maps = bool(names)
        for control in (self.tissue_action, self.tissue_box, self.opacity_slider, self.opacity_label):
            control.setEnabled(has_maps)
        if has_maps:
            listed = ", ".join(tissue_title(n) for n in names)
            self.tissue_action.setToolTip(f"Colour the slices by tissue: {listed} ({TISSUE_SHORTCUT})")
            self.tissue_box.setToolTip(
                f"Which tissue map to overlay. {ALL_TISSUES}: the most likely class of each voxel, each in "
                "its colour; one map: its probability as the colour's strength"
            )
            self.opacity_slider.setToolTip("Tissue overlay opacity (0 to 100%)")
        else:
            tip = NO_TISSUE_TIP
            made_by = ((entry.provenance.get("model") or {}) if entry is not None else {}) or {}
            if made_by.get("source") == "nv-generate":
                # Said plainly where the shipped model offers maps: this model makes images only.
                tip = (
                    f"No tissue maps: {made_by.get('name', 'NV-Generate-MR-Brain')} makes images only. " + tip
                )
            for control in (self.tissue_action, self.tissue_box, self.opacity_slider):
                control.setToolTip(tip)
        self.opacity_label.setToolTip(self.opacity_slider.toolTip())

    # -- slots ---------------------------------------------------------------------------------------

    def _on_tissue_action_toggled(self, checked: bool) -> None:
        self.state.set_show_tissue(checked)

    def _on_tissue_box_activated(self, index: int) -> None:
        self.state.set_tissue_choice(self.tissue_box.itemData(index))
        self.state.set_show_tissue(True)  # choosing a map is asking to see it

    def _on_opacity_slider_changed(self, value: int) -> None:
        self.opacity_label.setText(f"{value}%")
        self.state.set_tissue_opacity(value / 100.0)
        self.state.set_show_tissue(True)  # an opacity is only seen with the overlay on
