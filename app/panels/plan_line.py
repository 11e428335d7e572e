"""The Sampling group's "Plan" line: the XLA plan the next run uses (chosen in the Plan view), and a note
saying why a plan was cleared."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QToolButton, QWidget

from app.panels.noted_row import noted_row


class PlanLine(QWidget):
    """The plan and where it came from, with × to clear it; after a clear elsewhere, why (× dismisses)."""

    clear_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel()
        self.label.setObjectName("planLine")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.clear_button = QToolButton()
        self.clear_button.setText("\u00d7")
        self.clear_button.setObjectName("clearPlanButton")
        self.clear_button.setAccessibleName("Clear plan")
        self.clear_button.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.clear_button.clicked.connect(self.clear_requested)
        self.note = noted_row(self, self.label, self.clear_button)  # why a plan was cleared

    def show_form(self, form) -> bool:
        """Show ``form``'s plan (or why it was cleared); returns whether the line has anything to show."""
        if form.xla_plan:
            origin = f" (from {form.xla_plan_origin})" if form.xla_plan_origin else ""
            self.label.setText(f"{form.xla_plan}{origin}")
            self.label.setToolTip(
                f"The next run is sharded over the XLA engine server's devices as plan {form.xla_plan} says; "
                "choosing another device clears it"
            )
            self.clear_button.setToolTip("Clear the plan: the next run uses one device")
        elif form.xla_plan_cleared:
            self.label.setText("none (one device)")
            self.label.setToolTip("")
            self.clear_button.setToolTip("Dismiss the note")
        self.note.setText(form.xla_plan_cleared)
        self.note.setVisible(bool(form.xla_plan_cleared) and not form.xla_plan)
        return bool(form.xla_plan or form.xla_plan_cleared)
