"""Every volume generated or opened this session, to switch between; details of the selected one."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QListWidget, QListWidgetItem, QSizePolicy, QVBoxLayout, QWidget

from app.core.session import AppState
from app.theme import dot_icon


class SessionPanel(QWidget):
    save_requested = Signal()

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.list = QListWidget()
        self.list.setObjectName("sessionList")
        self.list.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setToolTip("Volumes of this session: purple = synthetic, blue = opened from disk")
        self.list.currentRowChanged.connect(self._on_list_row_changed)
        self.details = QLabel("Nothing loaded yet.")
        self.details.setObjectName("details")
        self.details.setWordWrap(True)
        # A wrapped label asks for the width of its longest line (engine reasons are long): wrap, don't widen the dock.
        self.details.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.list, 2)
        layout.addWidget(self.details, 1)
        state.volumes_changed.connect(self._on_state_volumes_changed)
        state.shown_changed.connect(self._on_state_shown_changed)

    def _on_state_volumes_changed(self) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for entry in self.state.volumes:
            item = QListWidgetItem(dot_icon("#c678dd" if entry.synthetic else "#3d8fd6"), entry.name)
            item.setToolTip(entry.describe())
            item.setData(Qt.ItemDataRole.UserRole, entry.uid)
            self.list.addItem(item)
        self.list.blockSignals(False)
        self._on_state_shown_changed(self.state.shown)

    def _on_state_shown_changed(self, entry) -> None:
        if entry is None:
            self.details.setText("Nothing loaded yet.")
            return
        if entry.kind == "preview":
            self.details.setText(f"{entry.name}\nthe estimate of the clean volume at this step")
            return
        row = next((i for i, e in enumerate(self.state.volumes) if e is entry), -1)
        if row != self.list.currentRow():
            self.list.blockSignals(True)
            self.list.setCurrentRow(row)
            self.list.blockSignals(False)
        # Escaped: names, provenance and telemetry reasons are arbitrary text, not markup.
        self.details.setText(
            f"<b>{html.escape(entry.name)}</b><br>" + html.escape(entry.describe()).replace("\n", "<br>")
        )

    def _on_list_row_changed(self, row: int) -> None:
        if 0 <= row < len(self.state.volumes) and not self.state.job_running:
            self.state.show(self.state.volumes[row])
