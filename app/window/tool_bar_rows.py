"""Tool bars across the top of the main window that share a row while they fit and start their own
otherwise, so no control ever hides behind an overflow arrow."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import QMainWindow, QToolBar

ROW_SLACK_PX = 24  # room kept at the end of a row (the tool bars' handles and margins)


class ToolBarRows(QObject):
    """Adds tool bars to the top area of ``window`` and keeps each on the row of the bars before it (the
    main tool bar's first) when they all fit the window, else on a row of its own; again whenever the
    window is resized or shown, or a bar's ``contents_changed`` signal (if it has one) says its width
    changed."""

    def __init__(self, window: QMainWindow) -> None:
        super().__init__(window)
        self.window = window
        self.managed: list[QToolBar] = []  # in the order they are laid out
        self._rows_timer = QTimer(self, singleShot=True, interval=0)
        self._rows_timer.timeout.connect(self.fit_rows)
        window.installEventFilter(self)

    def add(self, *bars: QToolBar) -> None:
        for bar in bars:
            self.window.addToolBar(Qt.ToolBarArea.TopToolBarArea, bar)
            self.managed.append(bar)
            changed = getattr(bar, "contents_changed", None)
            if changed is not None:
                changed.connect(self._rows_timer.start)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if watched is self.window and event.type() in (QEvent.Type.Resize, QEvent.Type.Show):
            self._rows_timer.start()
        return False

    def fit_rows(self) -> None:
        if not self.managed:
            return
        window = self.window
        first = [
            bar
            for bar in window.findChildren(QToolBar, options=Qt.FindChildOption.FindDirectChildrenOnly)
            if bar not in self.managed
            and not bar.isHidden()
            and window.toolBarArea(bar) == window.toolBarArea(self.managed[0])
        ]
        row = sum(bar.sizeHint().width() for bar in first)
        for bar in self.managed:
            if bar.isHidden():
                continue
            width = bar.sizeHint().width()
            own_row = row > 0 and row + width + ROW_SLACK_PX > window.width()
            if own_row != window.toolBarBreak(bar):
                if own_row:
                    window.insertToolBarBreak(bar)
                else:
                    window.removeToolBarBreak(bar)
            row = width if own_row else row + width
