"""The Generate panel's run box: Generate and Cancel, the run's progress bar and its text, pinned under the
panel's scrolling form so they are visible whatever else is open."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.panels.layout_fence import LayoutFence


class RunBox(QWidget):
    """Generate (the primary button), Cancel (off until a run starts), the progress bar and a progress line.
    The panel connects the buttons and writes the progress; this holds the widgets and their layout."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("runBox")
        self.generate_button = QPushButton("Generate")
        self.generate_button.setObjectName("primary")
        self.generate_button.setToolTip("Generate a volume (Ctrl+G)")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the running generation (Esc)")
        self.cancel_button.setEnabled(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.generate_button, 2)
        buttons.addWidget(self.cancel_button, 1)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 100)
        self.progress_bar.setValue(0)
        self.progress_bar.setTextVisible(True)
        self.progress_label = QLabel("Ready")
        self.progress_label.setObjectName("progressText")
        self.progress_label.setWordWrap(True)
        run = QVBoxLayout(self)
        run.setContentsMargins(8, 6, 8, 8)
        run.setSpacing(6)
        run.addLayout(buttons)
        run.addWidget(self.progress_bar)
        run.addWidget(LayoutFence(self.progress_label))  # its text changes at every step of a run
