"""The vault browser dock and the status-bar lock button (the Vault menu is ``app.vault.menu``).

The browser shows the controller's state: a prompt to unlock (or create) while locked; a searchable table
of items (patient, study, date, kind, label) with open / export / delete / verify / lock while unlocked.
Files dropped on it are imported into the vault; drops elsewhere in the window keep opening files.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QSizePolicy,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core import vault_items as model
from app.core.display import format_duration
from app.vault.dialogs import LOCKED_COLOUR, UNLOCKED_COLOUR, lock_icon, lock_pixmap
from app.widgets.theme import dot_icon
from engine.formatting import count_of

KIND_COLOURS = {"scan": "#3d8fd6", "synthetic": "#c678dd"}  # as in the session list
KIND_FILTERS = (("All items", None), ("Scans", "scan"), ("Synthetic", "synthetic"))
SEARCH_DELAY_MS = 200
ID_ROLE = Qt.ItemDataRole.UserRole
SORT_ROLE = Qt.ItemDataRole.UserRole + 1

_BROWSER_QSS = """
QWidget#vaultBrowser QTableWidget { background: #14171b; alternate-background-color: #181b20;
    border: 1px solid #2c3139; border-radius: 4px; gridline-color: transparent; outline: none; }
QWidget#vaultBrowser QTableWidget::item { padding: 0 8px; border: none; }
QWidget#vaultBrowser QTableWidget::item:selected { background: #2f6fae; color: white; }
QWidget#vaultBrowser QHeaderView::section { background: #1f2328; color: #8fa3bf; border: none;
    border-bottom: 1px solid #2c3139; padding: 5px 8px; font-weight: bold; }
QWidget#vaultBrowser QLineEdit { background: #14171b; border: 1px solid #363c46; border-radius: 4px;
    padding: 4px 8px; min-height: 18px; }
QWidget#vaultBrowser QLineEdit:focus { border-color: #3d8fd6; }
QWidget#vaultBrowser QPushButton, QWidget#vaultBrowser QToolButton#importButton { padding: 5px 12px; }
QWidget#vaultBrowser QToolButton#importButton { background: #2a2f37; border: 1px solid #3a404a;
    border-radius: 4px; }
QWidget#vaultBrowser QToolButton#importButton::menu-indicator { subcontrol-position: right center;
    right: 6px; }
QLabel#vaultTitle { font-size: 14pt; font-weight: bold; color: #dfe3ea; }
QLabel#vaultText { color: #aab2bf; }
QLabel#vaultPath, QLabel#vaultFooter { color: #8b93a1; }
QLabel#vaultEmpty { color: #6b7380; font-size: 11pt; }
QLabel#vaultState { color: #98c379; font-weight: bold; }
QFrame#vaultDropFrame { border: 1px solid transparent; border-radius: 6px; }
QFrame#vaultDropFrame[dropping="true"] { border: 2px dashed #3d8fd6; background: #172230; }
"""


def _text(item: QTableWidgetItem | None) -> str:
    return item.text() if item is not None else ""


class _SortItem(QTableWidgetItem):
    """Sorts by SORT_ROLE when set (dates as ISO text, names case-insensitively)."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        mine, theirs = self.data(SORT_ROLE), other.data(SORT_ROLE)
        if mine is not None and theirs is not None:
            return mine < theirs
        return super().__lt__(other)


class VaultBrowser(QWidget):
    """The Vault dock's content. Talks only to the ``VaultController``; reads the session ``state``
    (``AppState``) for whether the shown volume can be saved."""

    def __init__(self, controller, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self._state = state
        self.setObjectName("vaultBrowser")
        self.setStyleSheet(_BROWSER_QSS)
        self.setAcceptDrops(True)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self._on_search_timer_timeout)
        self._auto_lock_text = ""
        self.table_menu: QMenu | None = None

        self.frame = QFrame()
        self.frame.setObjectName("vaultDropFrame")
        self.pages = QStackedWidget()
        self.locked_page = self._build_locked_page()
        self.unlocked_page = self._build_unlocked_page()
        self.pages.addWidget(self.locked_page)
        self.pages.addWidget(self.unlocked_page)
        frame_layout = QVBoxLayout(self.frame)
        frame_layout.setContentsMargins(0, 0, 0, 0)
        frame_layout.addWidget(self.pages)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.frame)

        controller.state_changed.connect(self._on_controller_state_changed)
        controller.items_changed.connect(self._on_controller_items_changed)
        controller.auto_lock_tick.connect(self._on_controller_auto_lock_tick)
        state.shown_changed.connect(self._on_state_shown_changed)
        self._on_controller_state_changed()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(900, 250)

    # -- building ------------------------------------------------------------------------------------

    def _build_locked_page(self) -> QWidget:
        page = QWidget()
        self.locked_icon = QLabel()
        self.locked_icon.setPixmap(lock_pixmap(40, LOCKED_COLOUR))
        self.locked_icon.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.locked_title = QLabel("The vault is locked")
        self.locked_title.setObjectName("vaultTitle")
        self.locked_title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.locked_text = QLabel(
            "Patient scans and generated volumes are kept encrypted. "
            "Unlock the vault to browse, open and import."
        )
        self.locked_text.setObjectName("vaultText")
        self.locked_text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.locked_text.setWordWrap(True)
        self.unlock_button = QPushButton("Unlock...")
        self.unlock_button.setObjectName("primary")
        self.unlock_button.setMinimumWidth(140)
        self.unlock_button.clicked.connect(self._on_unlock_button_clicked)
        self.folder_button = QPushButton("Choose Vault Folder...")
        self.folder_button.clicked.connect(self._on_folder_button_clicked)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.unlock_button)
        buttons.addWidget(self.folder_button)
        buttons.addStretch(1)
        self.locked_path = QLabel("")
        self.locked_path.setObjectName("vaultPath")
        self.locked_path.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.locked_path.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # The lock beside the title and text, not above them: on a 700 px tall screen the dock has ~170 px
        # below the viewer, and the Unlock button must be in them.
        words = QVBoxLayout()
        words.setSpacing(2)
        words.addWidget(self.locked_title)
        words.addWidget(self.locked_text)
        heading = QHBoxLayout()
        heading.addStretch(1)
        heading.addWidget(self.locked_icon)
        heading.addLayout(words, 4)
        heading.addStretch(1)
        layout = QVBoxLayout(page)
        layout.setSpacing(4)
        layout.addStretch(1)
        layout.addLayout(heading)
        layout.addSpacing(4)
        layout.addLayout(buttons)
        layout.addWidget(self.locked_path)
        layout.addStretch(1)
        return page

    def _build_unlocked_page(self) -> QWidget:
        page = QWidget()
        top = self._build_search_row()
        self.table_stack = self._build_table()
        bottom = self._build_item_buttons_row()
        layout = QVBoxLayout(page)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(8)
        layout.addLayout(top)
        layout.addWidget(self.table_stack, 1)
        layout.addLayout(bottom)
        return page

    def _build_search_row(self) -> QHBoxLayout:
        """The unlocked page's top row: state, search, kind filter, Import, Save and Lock."""
        self.state_icon = QLabel()
        self.state_icon.setPixmap(lock_pixmap(18, UNLOCKED_COLOUR, unlocked=True))
        self.state_label = QLabel("Unlocked")
        self.state_label.setObjectName("vaultState")
        self.search_edit = QLineEdit()
        self.search_edit.setObjectName("vaultSearch")
        self.search_edit.setPlaceholderText("Search patient, study, label, model...")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.setMinimumWidth(260)
        self.search_edit.textChanged.connect(self._on_search_edit_text_changed)
        self.kind_box = QComboBox()
        for title, _kind in KIND_FILTERS:
            self.kind_box.addItem(title)
        self.kind_box.setToolTip("Show scans, synthetic volumes or both")
        self.kind_box.currentIndexChanged.connect(self._on_kind_box_changed)
        self.import_button = QToolButton()
        self.import_button.setObjectName("importButton")
        self.import_button.setText("Import")
        self.import_button.setToolTip("Import NIfTI files or a DICOM series (or drop them here)")
        self.import_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        import_menu = QMenu(self.import_button)
        import_menu.addAction("NIfTI Files...", self.controller.importing.import_nifti_dialog)
        import_menu.addAction("DICOM Folder...", self.controller.importing.import_dicom_dialog)
        self.import_button.setMenu(import_menu)
        self.save_button = QPushButton("Save Shown Volume")
        self.save_button.setToolTip(
            "Store the volume shown in the viewer (a generated volume keeps its provenance)"
        )
        self.save_button.clicked.connect(self._on_save_button_clicked)
        self.lock_button = QPushButton("Lock")
        self.lock_button.setObjectName("lockButton")
        self.lock_button.setIcon(lock_icon(LOCKED_COLOUR))
        self.lock_button.setToolTip("Lock the vault now and close the volumes opened from it")
        self.lock_button.clicked.connect(self._on_lock_button_clicked)
        top = QHBoxLayout()
        top.setSpacing(8)
        top.addWidget(self.state_icon)
        top.addWidget(self.state_label)
        top.addSpacing(8)
        top.addWidget(self.search_edit, 2)
        top.addWidget(self.kind_box)
        top.addStretch(1)
        top.addWidget(self.import_button)
        top.addWidget(self.save_button)
        top.addWidget(self.lock_button)
        return top

    def _build_table(self) -> QStackedWidget:
        """The items table, and the label shown instead of it while nothing is listed."""
        self.table = QTableWidget(0, len(model.COLUMNS))
        self.table.setObjectName("vaultTable")
        self.table.setHorizontalHeaderLabels(list(model.COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        self.table.setIconSize(QSize(12, 12))
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(30)
        header = self.table.horizontalHeader()
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        header.setHighlightSections(False)
        header.setStretchLastSection(True)
        for column, width in enumerate((190, 250, 110, 120)):
            header.resizeSection(column, width)
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(2, Qt.SortOrder.DescendingOrder)  # newest first
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._on_table_menu_requested)
        self.table.itemSelectionChanged.connect(self._on_table_selection_changed)
        # activated: a double-click, and Enter/Return on the selected row (the keyboard's way to open it)
        self.table.activated.connect(self._on_table_activated)
        self.empty_label = QLabel("")
        self.empty_label.setObjectName("vaultEmpty")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setWordWrap(True)
        table_stack = QStackedWidget()
        table_stack.addWidget(self.table)
        table_stack.addWidget(self.empty_label)
        return table_stack

    def _build_item_buttons_row(self) -> QHBoxLayout:
        """The unlocked page's bottom row: Open, Export, Details, Delete, the footer and Verify All."""
        self.open_button = QPushButton("Open")
        self.open_button.setObjectName("primary")
        self.open_button.setToolTip("Decrypt into memory and show it (nothing decrypted is written to disk)")
        self.open_button.clicked.connect(self._on_open_button_clicked)
        self.export_button = QPushButton("Export...")
        self.export_button.setToolTip(
            "Write as NIfTI (and the original DICOM files), optionally de-identified"
        )
        self.export_button.clicked.connect(self._on_export_button_clicked)
        self.details_button = QPushButton("Details...")
        self.details_button.setToolTip("Edit the label, patient and study details of the selected item")
        self.details_button.clicked.connect(self._on_details_button_clicked)
        self.delete_button = QPushButton("Delete...")
        self.delete_button.clicked.connect(self._on_delete_button_clicked)
        self.verify_button = QPushButton("Verify All")
        self.verify_button.setToolTip("Authenticate every byte of every item and check the audit trail")
        self.verify_button.clicked.connect(self._on_verify_button_clicked)
        self.footer = QLabel("")
        self.footer.setObjectName("vaultFooter")
        self.footer.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        bottom = QHBoxLayout()
        bottom.setSpacing(8)
        bottom.addWidget(self.open_button)
        bottom.addWidget(self.export_button)
        bottom.addWidget(self.details_button)
        bottom.addWidget(self.delete_button)
        bottom.addSpacing(12)
        bottom.addWidget(self.footer, 1)
        bottom.addWidget(self.verify_button)
        return bottom

    # -- controller -> view --------------------------------------------------------------------------

    def _on_controller_state_changed(self) -> None:
        unlocked = self.controller.session.is_unlocked
        self.pages.setCurrentWidget(self.unlocked_page if unlocked else self.locked_page)
        if not unlocked and self.isVisible():
            self._update_locked_page()
        self._update_buttons()

    def _update_locked_page(self) -> None:
        # Resolving the folder imports engine.vault: done when the page is seen, not at start-up.
        path = self.controller.session.path
        exists = self.controller.session.exists
        self.locked_title.setText("The vault is locked" if exists else "No vault yet")
        self.locked_text.setText(
            "Patient scans and generated volumes are kept encrypted. Unlock the vault to browse, open and import."
            if exists
            else "Create an encrypted vault to keep patient scans and generated volumes on this computer. "
            "Everything in it, names and dates included, is encrypted."
        )
        self.unlock_button.setText("Unlock..." if exists else "Create Vault...")
        self.locked_path.setText(str(path))

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if not self.controller.session.is_unlocked:
            self._update_locked_page()

    def _on_controller_items_changed(self, items: list) -> None:
        selected = self.selected_id()
        table = self.table
        table.setSortingEnabled(False)
        table.clearContents()
        table.setRowCount(len(items))
        for row, info in enumerate(items):
            cells = model.item_row(info)
            tooltip = model.item_details(info)
            sort_keys = (
                cells[0].lower(),
                cells[1].lower(),
                f"{cells[2]} {info.created}",
                info.kind,
                cells[4].lower(),
            )
            for column, text in enumerate(cells):
                item = _SortItem(text)
                item.setData(ID_ROLE, info.id)
                item.setData(SORT_ROLE, sort_keys[column])
                item.setToolTip(tooltip)
                if column == 3:
                    item.setIcon(dot_icon(KIND_COLOURS.get(info.kind, "#8b93a1")))
                if text == "\u2014":
                    item.setForeground(QColor("#5c636e"))
                table.setItem(row, column, item)
        table.setSortingEnabled(True)
        if selected is not None:
            self.select_item(selected)
        if not items:
            query = self.controller.listing.query or self.controller.listing.kind
            self.empty_label.setText(
                f"No items match \u201c{self.search_edit.text()}\u201d."
                if query
                else "The vault is empty.\nDrop NIfTI files or a DICOM folder here, or use Import."
            )
        self.table_stack.setCurrentWidget(self.table if items else self.empty_label)
        self._update_footer()
        self._update_buttons()

    def _on_controller_auto_lock_tick(self, seconds) -> None:
        self._auto_lock_text = f"auto-lock in {format_duration(seconds)}" if seconds is not None else ""
        self._update_footer()

    def _update_footer(self) -> None:
        items = self.controller.listing.items
        count = len(items)
        parts = [count_of(count, "item") + (" shown" if self.controller.listing.query else "")]
        if items:
            parts.append(model.format_size(sum(i.size_bytes for i in items)))
        if self._auto_lock_text:
            parts.append(self._auto_lock_text)
        self.footer.setText("  \u00b7  ".join(parts))

    def _update_buttons(self) -> None:
        has_item = self.selected_id() is not None
        unlocked = self.controller.session.is_unlocked
        for button in (self.open_button, self.export_button, self.details_button, self.delete_button):
            button.setEnabled(unlocked and has_item)
        self.verify_button.setEnabled(unlocked and bool(self.controller.listing.items))
        self.save_button.setEnabled(unlocked and self.controller.saving.can_save(self._state.shown))

    def _on_state_shown_changed(self, _entry) -> None:
        self._update_buttons()

    # -- selection -----------------------------------------------------------------------------------

    def selected_id(self) -> str | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if not rows:
            return None
        item = self.table.item(rows[0].row(), 0)
        return item.data(ID_ROLE) if item is not None else None

    def select_item(self, item_id: str) -> bool:
        for row in range(self.table.rowCount()):
            item = self.table.item(row, 0)
            if item is not None and item.data(ID_ROLE) == item_id:
                self.table.selectRow(row)
                return True
        return False

    def row_texts(self) -> list[tuple[str, ...]]:
        """The table as shown (tests and screenshots)."""
        return [
            tuple(_text(self.table.item(r, c)) for c in range(self.table.columnCount()))
            for r in range(self.table.rowCount())
        ]

    # -- user -> controller --------------------------------------------------------------------------

    def _on_unlock_button_clicked(self) -> None:
        self.controller.locking.request_unlock()

    def _on_folder_button_clicked(self) -> None:
        self.controller.locking.choose_vault_folder()

    def _on_lock_button_clicked(self) -> None:
        self.controller.locking.lock()

    def _on_save_button_clicked(self) -> None:
        self.controller.saving.save_entry()

    def _on_search_edit_text_changed(self, _text: str) -> None:
        self._search_timer.start()

    def _on_kind_box_changed(self, _index: int) -> None:
        self._search_timer.start()

    def _on_search_timer_timeout(self) -> None:
        self.controller.listing.set_filter(
            self.search_edit.text(), KIND_FILTERS[self.kind_box.currentIndex()][1]
        )

    def _on_table_selection_changed(self) -> None:
        self._update_buttons()

    def _on_table_activated(self, index) -> None:
        item = self.table.item(index.row(), 0)
        if item is not None:
            self.controller.opening.open_item(item.data(ID_ROLE))

    def _on_open_button_clicked(self) -> None:
        item_id = self.selected_id()
        if item_id:
            self.controller.opening.open_item(item_id)

    def _on_export_button_clicked(self) -> None:
        item_id = self.selected_id()
        if item_id:
            self.controller.exporting.export_dialog_for(item_id)

    def _on_details_button_clicked(self) -> None:
        item_id = self.selected_id()
        if item_id:
            self.controller.item_actions.edit_dialog_for(item_id)

    def _on_delete_button_clicked(self) -> None:
        item_id = self.selected_id()
        if item_id:
            self.controller.item_actions.delete_item(item_id)

    def _on_compute_tissue_maps_triggered(self) -> None:
        item_id = self.selected_id()
        if item_id:
            self.controller.item_actions.compute_tissue_maps(item_id)

    def _on_verify_button_clicked(self) -> None:
        self.controller.integrity.verify_all()

    def _on_table_menu_requested(self, pos) -> None:
        item = self.table.itemAt(pos)
        if item is None:
            return
        item_id = item.data(ID_ROLE)
        self.select_item(item_id)
        # The actions act on the selection (just set); bound methods, so no signal argument reaches them.
        menu = QMenu(self.table)
        self.table_menu = menu  # (the last one shown; tests trigger its actions)
        menu.addAction("Open", self._on_open_button_clicked)
        menu.addAction("Export...", self._on_export_button_clicked)
        menu.addAction("Edit Details...", self._on_details_button_clicked)
        menu.addAction("Compute Tissue Maps", self._on_compute_tissue_maps_triggered)
        menu.addSeparator()
        menu.addAction("Delete...", self._on_delete_button_clicked)
        menu.popup(self.table.viewport().mapToGlobal(pos))

    # -- drag and drop -------------------------------------------------------------------------------

    @staticmethod
    def _dropped_paths(event) -> list[Path]:
        mime = event.mimeData()
        if not mime.hasUrls():
            return []
        return [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile() and url.toLocalFile()]

    def _set_dropping(self, dropping: bool) -> None:
        self.frame.setProperty("dropping", dropping)
        self.frame.style().unpolish(self.frame)
        self.frame.style().polish(self.frame)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        if any(p.exists() for p in self._dropped_paths(event)):
            event.acceptProposedAction()
            self._set_dropping(True)
        else:
            event.ignore()

    def dragLeaveEvent(self, event) -> None:  # noqa: N802
        self._set_dropping(False)
        super().dragLeaveEvent(event)

    def dropEvent(self, event) -> None:  # noqa: N802
        self._set_dropping(False)
        paths = [p for p in self._dropped_paths(event) if p.exists()]
        if paths:
            event.acceptProposedAction()
            self.controller.importing.import_dropped(paths)


class VaultStatusButton(QToolButton):
    """A padlock in the status bar: shows whether the vault is unlocked; click to unlock or show it."""

    def __init__(self, controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.setObjectName("vaultStatusButton")
        self.setAutoRaise(True)
        self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.setStyleSheet(
            "QToolButton { border: none; background: transparent; padding: 0 6px; color: #aab2bf; }"
            "QToolButton:hover { color: #dfe3ea; }"
        )
        self.clicked.connect(self._on_clicked)
        controller.state_changed.connect(self._on_controller_state_changed)
        self._on_controller_state_changed()

    def _on_controller_state_changed(self) -> None:
        unlocked = self.controller.session.is_unlocked
        self.setIcon(lock_icon(UNLOCKED_COLOUR, unlocked=True) if unlocked else lock_icon(LOCKED_COLOUR))
        self.setText("Vault unlocked" if unlocked else "Vault locked")
        self.setToolTip("Show the vault" if unlocked else "Unlock the vault")

    def _on_clicked(self) -> None:
        self.controller.locking.request_unlock()
