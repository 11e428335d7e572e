"""The main window's status bar: messages, the crosshair readout, the shown volume's space and voxel size, and
the device the last run used."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QStatusBar

from app.widgets.eliding_label import ElidingLabel


class WindowStatus:
    """The permanent labels at the status bar's right and what updates them."""

    def __init__(self, bar: QStatusBar) -> None:
        self.bar = bar
        self.readout_label = QLabel("")
        self.readout_label.setObjectName("readout")
        # Wide enough for "voxel (i, j, k)  RAS (x, y, z) mm  value v" not to jitter as the pointer moves;
        # no wider, so a 1024-px window leaves the message beside it some room (420 cut most messages).
        self.readout_label.setMinimumWidth(340)
        self.device_label = QLabel("device: auto")
        # Eliding, with a few characters' minimum: as plain labels asking for their whole text, the space and
        # voxel size shown with the first volume widened a 1024-px window by 12 px, every tool bar with it.
        self.space_label = ElidingLabel("", max_width=320, min_chars=8)
        self.space_label.setObjectName("space")
        self.space_label.hide()
        self.voxel_label = ElidingLabel("", max_width=240, min_chars=8)
        self.voxel_label.setObjectName("voxelSize")
        self.voxel_label.hide()
        bar.addPermanentWidget(self.readout_label)
        bar.addPermanentWidget(self.space_label)
        bar.addPermanentWidget(self.voxel_label)
        bar.addPermanentWidget(self.device_label)
        # A message longer than the room beside the readout is cut at its right; the whole of it is one
        # hover away.
        bar.messageChanged.connect(self._on_bar_message_changed)

    def show_message(self, text: str, timeout_ms: int = 0) -> None:
        self.bar.showMessage(text, timeout_ms)

    def show_device(self, where: str) -> None:
        """Where runs go (or the last one ran): "device: cuda:0 (NVIDIA ...)"."""
        self.device_label.setText(f"device: {where}")

    def show_readout(self, text: str) -> None:
        self.readout_label.setText(text)

    def show_volume(self, entry) -> None:
        """The space the shown volume's millimetres are in, and its voxel size (and modality, for a model
        that takes one: NV-Generate-MR-Brain). A denoising preview has no space yet."""
        self.space_label.setVisible(entry is not None and entry.kind != "preview")
        self.voxel_label.setVisible(entry is not None)
        if entry is None:
            return
        spacing = "\u00d7".join(f"{v:.3g}" for v in entry.spacing)
        modality = (entry.provenance.get("output") or {}).get("modality")
        self.voxel_label.setText(f"{spacing} mm" + (f" \u00b7 {modality}" if modality else ""))
        self.voxel_label.set_tip(
            "Voxel size of the shown volume" + (f"; modality {modality}" if modality else "")
        )
        self.space_label.setText(f"Space: {entry.space_name}")
        self.space_label.set_tip(
            f"The readout's millimetres are coordinates of {entry.space}"
            if entry.space
            else "The readout's millimetres are scanner coordinates: no template space is named"
        )

    def _on_bar_message_changed(self, message: str) -> None:
        self.bar.setToolTip(message)
