"""What a running job looks like to the user; ``JobRunner.run`` (workers.py) drives both, features only place them.

* ``JobStrip``: a job's progress bar, its progress line and its Cancel button, which a feature places where its
  work is started from (a panel, a dialog, a tool bar). Cancel works from the mouse and the keyboard.
* ``JobActivity``: the status bar's mark that the app is busy, naming the jobs running in the background.
"""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

__all__ = ["OUTCOME_WORDS", "JobActivity", "JobStrip"]

BAR_STEPS = 1000  # the bar's range: a tenth of a percent, so a long download still moves
# What the strip says when a job ends, unless the feature's own handler says more.
OUTCOME_WORDS = {"finished": "Done", "failed": "Failed", "cancelled": "Cancelled", "abandoned": "Abandoned"}


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class JobStrip(QObject):
    """A job's progress bar, progress line and Cancel button.

    The feature places ``progress_bar``, ``progress_label`` and ``cancel_button`` in its own layout (or the
    three in a row with ``row()``); the runner shows the job's start, progress, cancelling and end on them, and
    Cancel stops the job. With ``line_in_bar`` the progress line is written in the bar itself (a tool bar has
    no room for a line beside it) and ``progress_label`` is not placed.
    """

    def __init__(
        self,
        parent: QObject | None = None,
        *,
        cancel_text: str = "Cancel",
        cancel_tip: str = "",
        line_in_bar: bool = False,
    ) -> None:
        super().__init__(parent)
        self.line_in_bar = line_in_bar
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, BAR_STEPS)
        self.progress_bar.setValue(0)
        self.progress_bar.setTextVisible(True)
        self.progress_label = QLabel("")
        self.progress_label.setWordWrap(True)
        self.cancel_button = QPushButton(cancel_text)
        if cancel_tip:
            self.cancel_button.setToolTip(cancel_tip)
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self._on_cancel_clicked)
        self.job: Cancellable | None = None
        self.cancelling = False

    def row(self) -> QWidget:
        """The bar, the line and Cancel in one row, for a feature that places the strip whole."""
        widget = QWidget()
        layout = QHBoxLayout(widget)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.progress_bar, 1)
        if not self.line_in_bar:
            layout.addWidget(self.progress_label, 2)
        layout.addWidget(self.cancel_button)
        return widget

    @property
    def running(self) -> bool:
        return self.job is not None

    def say(self, text: str) -> None:
        """Write the progress line (in the bar, with ``line_in_bar``)."""
        if self.line_in_bar:
            self.progress_bar.setFormat(f"%p% \u00b7 {text}" if text else "%p%")
        else:
            self.progress_label.setText(text)

    # -- driven by the runner ------------------------------------------------------------------------

    def begin(self, job: Cancellable, text: str, cancellable: bool = True) -> None:
        self.job, self.cancelling = job, False
        self.progress_bar.setRange(0, BAR_STEPS)
        self.progress_bar.setValue(0)
        self.progress_bar.setFormat("%p%")
        self.cancel_button.setEnabled(cancellable)
        self.say(text)

    def report(self, fraction: float | None, text: str) -> None:
        """Show a step of the job: ``fraction`` done (None: not known, the bar is busy) and what it is doing."""
        if fraction is None:
            if self.progress_bar.value() <= 0:  # nothing measured yet: busy; else the bar stays where it got
                self.progress_bar.setRange(0, 0)
        else:
            if self.progress_bar.maximum() == 0:
                self.progress_bar.setRange(0, BAR_STEPS)
            # One scheduled paint, not setValue's own repaint at every step (the GUI thread shares the cores).
            self.progress_bar.setUpdatesEnabled(False)
            self.progress_bar.setValue(round(BAR_STEPS * max(0.0, min(1.0, fraction))))
            self.progress_bar.setUpdatesEnabled(True)
        if text and not self.cancelling:  # "Cancelling..." stays until the job ends
            self.say(text)

    def show_cancelling(self, text: str) -> None:
        self.cancelling = True
        self.cancel_button.setEnabled(False)
        self.say(text)

    def end(self, outcome: str) -> None:
        self.job, self.cancelling = None, False
        self.cancel_button.setEnabled(False)
        self.progress_bar.setRange(0, BAR_STEPS)
        if outcome == "finished":
            self.progress_bar.setValue(BAR_STEPS)
        self.progress_bar.setFormat("%p%")
        self.say(OUTCOME_WORDS.get(outcome, outcome))

    def _on_cancel_clicked(self) -> None:
        if self.job is not None:
            self.job.cancel()


class JobActivity(QLabel):
    """The status bar's busy mark: hidden while nothing runs, else an activity dot (with the count when
    several jobs run) whose tooltip names them. A dot, not the names: the status bar's fields already fill a
    1024-pixel window, and a job worth naming says itself where it was started. (An hourglass, U+231B, is
    missing from common fonts and drew as an empty box.)"""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("jobActivity")
        self.setStyleSheet("color: palette(highlight);")  # lit, like an activity light
        self.hide()

    def show_jobs(self, names: list[str]) -> None:
        self.setVisible(bool(names))
        said = "Running in the background: " + ", ".join(names) if names else ""
        self.setText(("\u25cf" + (f" {len(names)}" if len(names) > 1 else "")) if names else "")
        self.setToolTip(said)
        self.setAccessibleName(said)
