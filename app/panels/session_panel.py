"""Every volume generated or opened this session, to switch between; details of the selected one.

Delete removes the selected volume (asking first when a generated one was never saved), F2 or a
double-click renames it, and the context menu offers the same with Save As. The details end with the volume's
anatomy check (``app.core.anatomy_display``): the one its sidecar carries, or, for a volume with tissue maps,
one measured in a background thread the first time it is shown.
"""

from __future__ import annotations

import contextlib
import html
import re
import threading
from functools import partial

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QFontMetrics
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QScrollArea,
    QSizePolicy,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from app.core.anatomy_display import (
    PENDING,
    anatomy_lines,
    asked_lines,
    check_tissue,
    checkable,
    maps_source,
    stored_check,
)
from app.core.session import AppState
from app.services.shortcuts import set_shortcut
from app.widgets.theme import dot_icon

UNSAVED_ROLE = Qt.ItemDataRole.UserRole + 1
UNSAVED_MARK = " *"  # Slicer's modified mark; drawn only, so renaming edits the bare name


def fit_name(text: str, width: int, metrics) -> str:
    """``text`` shortened to ``width`` px: a default name keeps its " seed N · time" whole and gives up the
    model's start ("…CTMR T2w seed 7 · 14:03:22"), which is what sets two volumes of a session apart; any
    other name is elided in the middle (a default name too narrow for its seed and time keeps its end)."""
    if metrics.horizontalAdvance(text) <= width:
        return text
    cut = text.rfind(" seed ")
    if cut > 0:
        tail = text[cut:]
        room = width - metrics.horizontalAdvance(tail)
        if room > metrics.horizontalAdvance("\u2026") * 3:
            return metrics.elidedText(text[:cut], Qt.TextElideMode.ElideLeft, room) + tail
        return metrics.elidedText(text, Qt.TextElideMode.ElideLeft, width)  # the time, at least
    return metrics.elidedText(text, Qt.TextElideMode.ElideMiddle, width)


class SaveStateDelegate(QStyledItemDelegate):
    """Draws a never-saved volume's name in italics with a trailing modified mark, shortened so that names of
    one session stay apart in a narrow dock (the whole name is the item's tooltip)."""

    def initStyleOption(self, option, index) -> None:  # noqa: N802 - Qt override
        super().initStyleOption(option, index)
        if index.data(UNSAVED_ROLE):
            option.text += UNSAVED_MARK
            option.font.setItalic(True)
        if option.rect.width() > 0:
            widget = option.widget
            style = widget.style() if widget is not None else None
            if style is not None:
                room = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, option, widget).width()
                # the style's own text margin, both sides, which the width above still includes
                margin = style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, widget) + 1
                option.text = fit_name(option.text, room - 2 * margin, QFontMetrics(option.font))

    def shown_text(self, index) -> str:
        """The text drawn for ``index`` now (tests, and anyone who must know)."""
        view = self.parent()
        assert isinstance(view, QAbstractItemView)  # the delegate of the session list
        option = QStyleOptionViewItem()
        option.rect = view.visualRect(index)
        option.widget = view
        self.initStyleOption(option, index)
        return option.text


class SessionPanel(QWidget):
    save_requested = Signal()
    anatomy_checked = Signal(int, object)  # volume uid, check record (emitted from the checking thread)

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.list = QListWidget()
        self.list.setObjectName("sessionList")
        self.list.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.list.setItemDelegate(SaveStateDelegate(self.list))
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setToolTip(
            "Volumes of this session: purple = synthetic, blue = opened from disk; "
            "an italic name with * was never saved"
        )
        self.list.currentRowChanged.connect(self._on_list_row_changed)
        self.list.itemChanged.connect(self._on_item_changed)
        self.list.setEditTriggers(
            QAbstractItemView.EditTrigger.EditKeyPressed | QAbstractItemView.EditTrigger.DoubleClicked
        )  # F2 or a double-click renames
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._on_context_menu_requested)
        self.remove_action = QAction("&Remove from Session", self)
        set_shortcut(self.remove_action, "session.remove", Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.remove_action.triggered.connect(self.remove_selected)
        self.rename_action = QAction("Re&name", self)
        set_shortcut(self.rename_action, "session.rename", Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.rename_action.triggered.connect(self.rename_selected)
        self.save_action = QAction("Save &As NIfTI...", self)
        self.save_action.triggered.connect(self.save_requested)
        self.list.addAction(self.remove_action)
        self.details = QLabel("Nothing loaded yet.")
        self.details.setObjectName("details")
        self.details.setWordWrap(True)
        # A wrapped label asks for the width of its longest line (engine reasons are long): wrap, don't widen the dock.
        self.details.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # The details grow with the anatomy check's lines: in a scroll area of their own (down only, they wrap)
        # they never make the dock, and so the window, taller than a small screen.
        self.details_scroll = QScrollArea()
        self.details_scroll.setObjectName("detailsScroll")
        self.details_scroll.setWidget(self.details)
        self.details_scroll.setWidgetResizable(True)
        self.details_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.details_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.details_scroll.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # Tab, then the arrows scroll them
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.list, 2)
        layout.addWidget(self.details_scroll, 1)
        state.volumes_changed.connect(self._on_state_volumes_changed)
        state.shown_changed.connect(self._on_state_shown_changed)
        self._anatomy: dict[int, dict] = {}  # volume uid -> its check record, measured here
        self.anatomy_checked.connect(self._on_anatomy_checked)

    def _on_state_volumes_changed(self) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for entry in self.state.volumes:
            item = QListWidgetItem(dot_icon("#c678dd" if entry.synthetic else "#3d8fd6"), entry.name)
            item.setToolTip(f"{entry.name}\n{entry.describe()}")  # the full name, however narrow the list
            item.setData(Qt.ItemDataRole.UserRole, entry.uid)
            item.setData(UNSAVED_ROLE, entry.needs_saving)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
        self.list.blockSignals(False)
        self._on_state_shown_changed(self.state.shown)

    def _on_state_shown_changed(self, entry) -> None:
        if entry is None:
            self.details.setText("Nothing loaded yet.")
            return
        if entry.kind == "preview":
            self.details.setText(f"{entry.name}\nthe estimate of the clean volume at this step")
            # No list entry is what is shown, so none stays selected: a click on any entry is a choice.
            self.list.blockSignals(True)
            self.list.setCurrentRow(-1)
            self.list.blockSignals(False)
            return
        row = next((i for i, e in enumerate(self.state.volumes) if e is entry), -1)
        if row != self.list.currentRow():
            self.list.blockSignals(True)
            self.list.setCurrentRow(row)
            self.list.blockSignals(False)
        # Escaped: names, provenance and telemetry reasons are arbitrary text, not markup.
        text = "\n".join([entry.describe(), *anatomy_lines(self._anatomy_record(entry), self._asked(entry))])
        self.details.setText(
            f"<b>{_breakable(html.escape(entry.name))}</b><br>"
            + _breakable(html.escape(text)).replace("\n", "<br>")
        )

    def _asked(self, entry) -> list[str]:
        """Why the check flags what ``entry`` was asked for (its model's inputs against the adult ranges)."""
        model = self.state.model_by_id(str((entry.provenance.get("model") or {}).get("id", "")))
        return asked_lines(entry.provenance, model.spec) if model is not None else []

    def anatomy_record(self, entry) -> dict | None:
        """The anatomy check shown for ``entry`` now (PENDING while it is measured), None without maps."""
        return self._anatomy_record(entry, start=False)

    def _anatomy_record(self, entry, start: bool = True) -> dict | None:
        stored = stored_check(entry.provenance)
        if stored is not None:
            return stored
        if entry.uid in self._anatomy:
            return self._anatomy[entry.uid]
        if not checkable(entry.tissue):
            return None
        if start:  # about a second of numpy: a thread of its own, so the window never waits on it
            self._anatomy[entry.uid] = PENDING
            threading.Thread(
                target=self._check_in_background,
                args=(
                    entry.uid,
                    dict(entry.tissue),
                    entry.affine,
                    entry.space,
                    maps_source(entry.provenance),
                ),
                name="volsynth-anatomy-check",
                daemon=True,  # a check still running at exit is dropped: nothing is written
            ).start()
        return PENDING

    def _check_in_background(self, uid: int, tissue: dict, affine, space, source: str) -> None:
        record = check_tissue(tissue, affine, space, source)
        with contextlib.suppress(RuntimeError):  # the panel was deleted while the check ran
            self.anatomy_checked.emit(uid, record)  # queued to the GUI thread

    def _on_anatomy_checked(self, uid: int, record: dict) -> None:
        self._anatomy[uid] = record
        shown = self.state.shown
        if shown is not None and getattr(shown, "uid", None) == uid:
            self._on_state_shown_changed(shown)

    def selected_entry(self):
        row = self.list.currentRow()
        return self.state.volumes[row] if 0 <= row < len(self.state.volumes) else None

    def remove_selected(self) -> None:
        entry = self.selected_entry()
        if entry is None:
            return
        if entry.kind == "generated" and not entry.saved:
            answer = QMessageBox.question(
                self,
                "Remove volume?",
                f"{entry.name} was never saved to a file or the vault. Remove it from the session? "
                "It cannot be recovered afterwards.",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                QMessageBox.StandardButton.No,
            )
            if answer != QMessageBox.StandardButton.Yes:
                return
        self.state.remove_volume(entry)

    def rename_selected(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.list.editItem(item)

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        uid = item.data(Qt.ItemDataRole.UserRole)
        entry = next((e for e in self.state.volumes if e.uid == uid), None)
        if entry is not None and item.text() != entry.name:
            # Renaming redraws the list (this item included) with the name the volume really got: a blank
            # name keeps the old one, a taken one gets a number. After this signal: the item is in use.
            QTimer.singleShot(0, partial(self.state.rename_volume, entry, item.text()))

    def _on_context_menu_requested(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        self.list.setCurrentItem(item)
        menu = QMenu(self)
        menu.addAction(self.rename_action)
        menu.addAction(self.save_action)
        menu.addSeparator()
        menu.addAction(self.remove_action)
        menu.popup(self.list.viewport().mapToGlobal(pos))

    def _on_list_row_changed(self, row: int) -> None:
        if 0 <= row < len(self.state.volumes):
            if self.state.job_running:
                self.state.follow_previews = False  # the user wants this volume, not the run's previews
            self.state.show(self.state.volumes[row])


ZERO_WIDTH_SPACE = "\u200b"
_LONG_WORD = 14  # characters: a run without a break opportunity longer than this gets some
_PIECE = re.compile(r"[A-Z]*[a-z]+|[A-Z]+(?![a-z])|[0-9.]+|.", re.DOTALL)


def wrap_long_words(text: str) -> str:
    """``text`` with zero-width spaces in words too long for a narrow panel, where letters turn to digits and
    lower case to upper case ("MNI152NLin2009aSym" -> "MNI152 NLin2009 aSym", the spaces zero-width), and
    every ``_LONG_WORD`` characters in a run that has no such place (a hash)."""

    def broken(match: re.Match) -> str:
        word = match.group(0)
        pieces = _PIECE.findall(word)
        out, run = "", 0
        for index, piece in enumerate(pieces):
            # A break before a piece of letters that follows digits (152|NLin, 2009|aSym), not inside numbers.
            if index and run and piece[0].isalpha() and pieces[index - 1][-1].isdigit():
                out, run = out + ZERO_WIDTH_SPACE, 0
            while len(piece) > _LONG_WORD - run:
                cut = _LONG_WORD - run
                out, piece, run = out + piece[:cut] + ZERO_WIDTH_SPACE, piece[cut:], 0
            out, run = out + piece, run + len(piece)
        return out

    return re.sub(rf"[^\s/_{ZERO_WIDTH_SPACE}]{{{_LONG_WORD + 1},}}", broken, text)


def _breakable(text: str) -> str:
    """Zero-width spaces after / and _ so long paths and file names wrap inside the panel, and in long words
    (``wrap_long_words``). ``text`` is escaped HTML: entities (``&amp;``) are left whole."""
    text = re.sub(r"[^\s&;]+", lambda m: wrap_long_words(m.group(0)), text)
    return text.replace("/", "/&#8203;").replace("_", "_&#8203;")
