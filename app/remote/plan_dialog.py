"""Generate > Plan Multi-Device Run...: ``volsynth plan`` on a connected engine server, as a sortable table.

The server plans (``POST /plan``): it enumerates ways to split one denoising step over a slice's devices,
prunes them on cheap estimates, compiles the best few with XLA for the topology and predicts each one's step
time. The request runs in a worker thread and cannot be aborted mid-way: Cancel stops waiting, gives the form
back, and the late answer is dropped when it arrives. The display strings come from ``app.core.plan_table``.
"""

from __future__ import annotations

import html
import time
from functools import partial

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core import plan_table
from app.core.remote_connection import ServerConnection
from engine.api import MAX_BATCH  # the server's limit, as for jobs
from engine.xla.planning import DEFAULT_TIME_LIMIT_S, MAX_COMPILE_TOP, MAX_TIME_LIMIT_S
from engine.xla.topology import KNOWN_TOPOLOGIES

ELAPSED_INTERVAL_MS = 500
ROW_INDEX_ROLE = Qt.ItemDataRole.UserRole + 1  # a row's index in the server's result (cells sort, rows move)
BEST_BACKGROUND = QColor("#1f3d2b")
PRUNED_FOREGROUND = QColor("#6b7380")
FAILED_FOREGROUND = QColor("#e08a7e")

_QSS = """
QLabel#planSummary { font-size: 10.5pt; }
QLabel#planDevices, QLabel#planFootnote { color: #8b93a1; }
QLabel#planStatus[error="true"] { color: #e5a06a; }
"""


class _SortItem(QTableWidgetItem):
    """A cell that sorts by the row's sort key for its column (numbers as numbers, absent ones last)."""

    def __init__(self, text: str, sort_key) -> None:
        super().__init__(text)
        self.sort_key = sort_key

    def __lt__(self, other: QTableWidgetItem) -> bool:
        theirs = getattr(other, "sort_key", None)
        if theirs is not None and type(theirs) is type(self.sort_key):
            return self.sort_key < theirs
        return super().__lt__(other)


class PlanDialog(QDialog):
    """The form (server, model, batch, topology, CFG, compile top N), the busy line, the summary and the table."""

    def __init__(self, controller) -> None:
        # One linear Qt form build; splitting it would scatter the tab order.
        super().__init__(controller.dialog_parent)
        self.controller = controller
        self.setObjectName("planDialog")
        self.setWindowTitle("Plan Multi-Device Run")
        self.setModal(False)
        self.setStyleSheet(_QSS)
        self.plan_result: dict | None = None
        self._request = 0  # the id of the request whose answer is awaited; 0 when none is
        self._issued = 0  # requests sent so far (ids start at 1)
        self._started = 0.0
        self._waiting_on = ""
        self._topology = ""

        intro = self._build_form()  # what it does, then server, model, topology | batch, top N, CFG
        actions = self._build_actions()  # Plan, Cancel, the busy bar and the status line
        self._build_results()  # the summary, the plans' table and its footnote

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.buttons.rejected.connect(self.reject)
        self.buttons.button(QDialogButtonBox.StandardButton.Close).setAutoDefault(False)

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.form_widget)
        layout.addWidget(self.devices_label)  # outside the form: it stays readable while the form is disabled
        layout.addLayout(actions)
        layout.addWidget(self.summary_label)
        layout.addWidget(self.table, 1)
        layout.addLayout(self._build_use_row())  # "Use this plan for the next run" and what it did
        layout.addWidget(self.footnote)
        layout.addWidget(self.buttons)

        self._timer = QTimer(self)
        self._timer.setInterval(ELAPSED_INTERVAL_MS)
        self._timer.timeout.connect(self._on_timer_timeout)
        self.resize(1280, 680)
        self.set_connections(list(controller.connections.values()))

    # -- building (called in this order from __init__: the widgets' creation order is the Tab order)

    def _build_form(self) -> QLabel:
        """The request's controls in two columns (``self.form_widget``); returns the intro text above them."""
        intro = QLabel(
            "Predict how one denoising step of a model would run split over a multi-device slice: the "
            "connected engine server enumerates the ways to split it, compiles the most promising with XLA "
            "for the topology and ranks them (volsynth plan). Times are the planner's predictions, not "
            "measurements."
        )
        intro.setWordWrap(True)

        self.server_box = QComboBox()
        self.server_box.setToolTip("The engine server that plans (its own models are offered below)")
        self.server_box.currentIndexChanged.connect(self._on_server_changed)
        self.devices_label = QLabel("")
        self.devices_label.setObjectName("planDevices")
        self.devices_label.setWordWrap(True)
        self.devices_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.model_box = QComboBox()
        self.model_box.setToolTip(
            "One of the server's models, or brain-ldm-bundle: MONAI's brain latent-diffusion U-Net by "
            "architecture (no weights needed)"
        )
        self.batch_spin = QSpinBox()
        self.batch_spin.setRange(1, MAX_BATCH)
        self.batch_spin.setToolTip("Volumes generated together in one step")
        self.topology_box = QComboBox()
        self.topology_box.setEditable(True)
        self.topology_box.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.topology_box.setMinimumContentsLength(16)
        self.topology_box.setToolTip(
            "The slice to plan for: a TPU slice <family>:<shape> (v5e:2x4, v5p:2x2x2) or a GPU box "
            "<N>xH100-<link>. The server's own slice comes first when it is one; type another to try it."
        )
        self.cfg_check = QCheckBox("Classifier-free guidance (doubles the batch)")
        self.cfg_check.setChecked(True)
        self.cfg_check.setToolTip(
            "Each step runs the conditioned and the unconditioned half together, as generation with a "
            "guidance scale does"
        )
        self.top_spin = QSpinBox()
        self.top_spin.setRange(1, MAX_COMPILE_TOP)
        self.top_spin.setValue(3)
        self.top_spin.setToolTip(
            "How many of the best-estimated plans the server compiles with XLA (each compile takes from "
            "seconds to minutes); the rest are pruned with their estimates"
        )
        self.limit_spin = QSpinBox()
        self.limit_spin.setRange(0, int(MAX_TIME_LIMIT_S))
        self.limit_spin.setValue(int(DEFAULT_TIME_LIMIT_S))
        self.limit_spin.setSuffix(" s")
        self.limit_spin.setToolTip(
            "When the server answers with the best plan so far, marked cut short (0: rank on the estimates "
            "alone). A compile under way then finishes on the server, so planning again goes on from there."
        )

        left = QFormLayout()
        left.addRow("Server", self.server_box)
        left.addRow("Model", self.model_box)
        left.addRow("Topology", self.topology_box)
        for spin in (self.batch_spin, self.top_spin, self.limit_spin):
            spin.setMinimumWidth(80)
            spin.setMaximumWidth(110)
        right = QFormLayout()
        right.addRow("Batch", self.batch_spin)
        right.addRow("Compile top N", self.top_spin)
        right.addRow("Time limit", self.limit_spin)
        right.addRow("", self.cfg_check)
        for column in (left, right):
            column.setHorizontalSpacing(12)
        form = QGridLayout()
        form.addLayout(left, 0, 0)
        form.addLayout(right, 0, 1)
        form.setColumnStretch(0, 3)
        form.setColumnStretch(1, 2)
        form.setHorizontalSpacing(24)
        self.form_widget = QWidget()
        self.form_widget.setLayout(form)
        return intro

    def _build_actions(self) -> QHBoxLayout:
        """Plan (the default button), Cancel, the busy bar and the status line, in one row."""
        self.plan_button = QPushButton("Plan")
        self.plan_button.setDefault(True)
        self.plan_button.setAutoDefault(True)
        self.plan_button.setToolTip(
            "Ask the server to plan (a full-size model: 1-2 minutes, the server's planning-time limit)"
        )
        self.plan_button.clicked.connect(self.start)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAutoDefault(False)
        self.cancel_button.setEnabled(False)
        self.cancel_button.setToolTip(
            "Stop waiting for the server's answer (the server finishes the plan in the background)"
        )
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy: the server reports no progress while it plans
        self.progress.setTextVisible(False)
        self.progress.setMaximumWidth(160)
        self.progress.setVisible(False)
        self.status_label = QLabel("")
        self.status_label.setObjectName("planStatus")
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        actions = QHBoxLayout()
        actions.addWidget(self.plan_button)
        actions.addWidget(self.cancel_button)
        actions.addWidget(self.progress)
        actions.addWidget(self.status_label, 1)
        return actions

    def _build_results(self) -> None:
        """The summary line, the sortable table of plans (columns from ``app.core.plan_table``), the footnote."""
        self.summary_label = QLabel("")
        self.summary_label.setObjectName("planSummary")
        self.summary_label.setWordWrap(True)
        self.summary_label.setTextFormat(Qt.TextFormat.RichText)
        self.summary_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTableWidget(0, len(plan_table.COLUMNS))
        self.table.setObjectName("planTable")
        for index, column in enumerate(plan_table.COLUMNS):
            item = QTableWidgetItem(column.header)
            item.setToolTip(column.tooltip)
            if column.numeric:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setHorizontalHeaderItem(index, item)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setAlternatingRowColors(False)
        self.table.setWordWrap(True)  # the reasons and collectives wrap in their (last) column
        self.table.verticalHeader().setVisible(False)
        # Rows grow when the last column wraps a long reason onto a second line (and shrink as it widens).
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        header.setSortIndicatorShown(True)
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        header.setSortIndicator(plan_table.COLUMN_INDEX["status"], Qt.SortOrder.AscendingOrder)
        self._fit_columns()  # to the headers until a result comes
        self.footnote = QLabel(
            "~ = a cheap estimate from the traced program (the plan was pruned before compiling). Step = "
            "compute + communication with no overlap: an upper bound on a good schedule. Hover a cell or a "
            "column header for details."
        )
        self.footnote.setObjectName("planFootnote")
        self.footnote.setWordWrap(True)

    def _build_use_row(self) -> QHBoxLayout:
        """The button that makes the selected plan (the best one, until another row is chosen) the next
        run's on this server, and a line saying why it is off or what it did."""
        self.use_button = QPushButton("&Use this plan for the next run")
        self.use_button.setObjectName("usePlanButton")
        self.use_button.setAutoDefault(False)
        self.use_button.setEnabled(False)
        self.use_button.clicked.connect(self.use_selected_plan)
        self.use_label = QLabel("")
        self.use_label.setObjectName("planFootnote")
        self.use_label.setWordWrap(True)
        self.use_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table.itemSelectionChanged.connect(self._update_use_button)
        self.controller.state.form.changed.connect(self._on_form_changed)
        row = QHBoxLayout()
        row.addWidget(self.use_button)
        row.addWidget(self.use_label, 1)
        return row

    # -- the servers ---------------------------------------------------------------------------------

    def set_connections(self, connections: list[ServerConnection]) -> None:
        """Offer these servers (keeping the chosen one when it is still connected)."""
        chosen = self.server_box.currentData()
        self.server_box.blockSignals(True)
        self.server_box.clear()
        for connection in connections:
            self.server_box.addItem(connection.label, connection.url)
        index = self.server_box.findData(chosen) if chosen is not None else -1
        self.server_box.setCurrentIndex(max(index, 0) if connections else -1)
        self.server_box.blockSignals(False)
        if self.server_box.currentData() != chosen or chosen is None:
            self._on_server_changed()
        self._update_enabled()

    def connection(self) -> ServerConnection | None:
        url = self.server_box.currentData()
        for connection in self.controller.connections.values():
            if connection.url == url:
                return connection
        return None

    def _on_server_changed(self, _index: int = -1) -> None:
        connection = self.connection()
        self.model_box.clear()
        self.topology_box.clear()
        if connection is None:
            self.devices_label.setText(
                "No engine server is connected: Generate > Connect to Engine Server..."
            )
            return
        models = plan_table.plan_models(connection.model_ids)
        self.model_box.addItems(models)
        selected = self.controller.state.selected_model
        if selected is not None and selected.id in models:
            self.model_box.setCurrentText(selected.id)
        choices = plan_table.topology_choices(connection.xla_topology, KNOWN_TOPOLOGIES)
        self.topology_box.addItems(choices)
        if connection.xla_topology:
            self.topology_box.setItemData(0, "This server's own slice", Qt.ItemDataRole.ToolTipRole)
        self.topology_box.setCurrentIndex(0)
        devices = connection.xla_devices
        if devices:
            summary = plan_table.xla_device_summary(devices, connection.xla_topology)
            self.devices_label.setText(
                f"XLA devices on this server ({summary}): {plan_table.xla_device_list(devices, limit=16)}"
            )
            self.devices_label.setToolTip(plan_table.xla_device_list(devices, limit=64).replace("; ", "\n"))
        else:
            self.devices_label.setText(
                f"This server runs on {connection.device} {connection.device_name} (not XLA); it plans on "
                "its host CPU if it has the xla extra installed."
            )
            self.devices_label.setToolTip("")

    # -- planning ------------------------------------------------------------------------------------

    @property
    def planning(self) -> bool:
        return self._request != 0

    def start(self) -> None:
        connection = self.connection()
        topology = self.topology_box.currentText().strip()
        if connection is None:
            self._say("Connect an engine server first (Generate > Connect to Engine Server...).", error=True)
            return
        if not topology:
            self._say("Enter a topology, e.g. v5e:2x4 or 8xH100-nvlink.", error=True)
            return
        if self.planning:
            return
        self._request = self._next_request_id()
        self._started = time.monotonic()
        self._topology = topology
        self._waiting_on = f"{self.model_box.currentText()} on {topology}"
        self.controller.runner.run_task(
            "plan-on-server",
            plan_table.request_plan,
            connection.url,
            connection.token,
            connection.fingerprint,
            self.model_box.currentText(),
            topology,
            self.batch_spin.value(),
            self.cfg_check.isChecked(),
            self.top_spin.value(),
            float(self.limit_spin.value()),
            finished=partial(self._on_plan_finished, self._request),
            failed=partial(self._on_plan_failed, self._request),
        )
        self._timer.start()
        self._on_timer_timeout()
        self._update_enabled()

    def cancel(self) -> None:
        """Stop waiting: the form comes back and the answer, when it arrives, is dropped."""
        if not self.planning:
            return
        self._request = 0
        self._timer.stop()
        self._say(
            "Cancelled: no longer waiting. The server cannot be interrupted: it finishes this plan in the "
            "background and refuses a new one until then; its result will be discarded.",
        )
        self._update_enabled()

    def _next_request_id(self) -> int:
        self._issued += 1
        return self._issued

    def _on_plan_finished(self, request: int, result: dict) -> None:
        if request != self._request:
            self._on_late_answer()
            return
        self._finish()
        self.show_result(result)
        elapsed = time.monotonic() - self._started
        cut = (
            " (cut short by the server's planning-time limit: the best plan so far)"
            if result.get("cut_short")
            else ""
        )
        self._say(f"Planned {self._waiting_on} in {elapsed:.1f} s{cut}.")

    def _on_plan_failed(self, request: int, message: str) -> None:
        if request != self._request:
            self._on_late_answer()
            return
        self._finish()
        self._say(plan_table.plan_error_text(message, self._topology), error=True)

    def _on_late_answer(self) -> None:
        if not self.planning:
            self._say("The cancelled plan has finished on the server; its result was discarded.")

    def _finish(self) -> None:
        self._request = 0
        self._timer.stop()
        self._update_enabled()

    def _on_timer_timeout(self) -> None:
        elapsed = time.monotonic() - self._started
        self._say(
            f"Planning {self._waiting_on} on the server: {elapsed:.0f} s of at most about "
            f"{self.limit_spin.value()} s (a full-size model takes 1-2 minutes)..."
        )

    def _say(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setProperty("error", error)
        self.status_label.style().unpolish(self.status_label)
        self.status_label.style().polish(self.status_label)

    def _update_enabled(self) -> None:
        busy = self.planning
        has_server = self.connection() is not None
        self.form_widget.setEnabled(not busy)
        self.plan_button.setEnabled(not busy and has_server)
        self.cancel_button.setEnabled(busy)
        self.progress.setVisible(busy)
        self._update_use_button()

    # -- using a plan --------------------------------------------------------------------------------

    def selected_plan_row(self) -> dict | None:
        """The result's row of the table's selected plan (None when no row is selected)."""
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if not rows or self.plan_result is None:
            return None
        item = self.table.item(rows[0].row(), 0)
        index = item.data(ROW_INDEX_ROLE) if item is not None else None
        result_rows = [r for r in self.plan_result.get("rows") or [] if isinstance(r, dict)]
        return result_rows[index] if isinstance(index, int) and 0 <= index < len(result_rows) else None

    def use_problem(self) -> str:
        """Why "Use this plan" is off ("" when it is on)."""
        connection = self.connection()
        if connection is None:
            return "Connect an XLA engine server first"
        if self.planning:
            return "Planning..."
        if self.plan_result is None:
            return "Plan first: then choose a plan in the table"
        return plan_table.use_plan_problem(connection.details, self.selected_plan_row())

    def _update_use_button(self) -> None:
        problem = self.use_problem()
        self.use_button.setEnabled(not problem)
        row, server = self.selected_plan_row(), self.connection()
        if not problem and row is not None and server is not None:  # (no problem means both are there)
            problem_or_tip = (
                f"The next generation on {server.url} runs with plan {row['plan']} over its devices"
            )
        else:
            problem_or_tip = problem
        self.use_button.setToolTip(problem_or_tip)
        if problem and self.plan_result is not None and not self.use_label.property("used"):
            self.use_label.setText(problem)

    @staticmethod
    def _next_run_batch(form) -> int:
        """The U-Net batch of the form's next run: its batch, twice with classifier-free guidance."""
        model = form.model
        guided = model is not None and model.spec.supports_guidance and (form.guidance_scale or 1.0) != 1.0
        return form.batch_size * (2 if guided else 1)

    def _on_form_changed(self, name: str) -> None:
        """A plan cleared elsewhere (another device, the Generate panel's x): the line says so."""
        form = self.controller.state.form
        if name == "xla_plan" and not form.xla_plan and self.use_label.property("used"):
            self.use_label.setProperty("used", False)
            self.use_label.setText(
                form.xla_plan_cleared or "The plan was cleared: the next run uses one device."
            )

    def use_selected_plan(self) -> bool:
        """Make the selected plan the next run's on this dialog's server (and that server the device)."""
        problem = self.use_problem()
        connection, row = self.connection(), self.selected_plan_row()
        if problem or connection is None or row is None:  # (no problem means both are there)
            self.use_label.setText(problem)
            return False
        form = self.controller.state.form
        form.set(device=connection.device_id)
        form.use_xla_plan(str(row["plan"]), connection.device_id, origin="Plan view")
        text = (
            f"The next run on {connection.url} uses plan {row['plan']} (shown in the Generate panel's "
            "Sampling group, where \u00d7 clears it)."
        )
        text += plan_table.batch_mismatch_text(self.plan_result, self._next_run_batch(form))
        text += plan_table.slower_than_one_chip_text(self.plan_result)
        self.use_label.setText(text)
        self.use_label.setProperty("used", True)
        self.controller.show_status(text, 8000)
        return True

    # -- the result ----------------------------------------------------------------------------------

    def show_result(self, result: dict) -> None:
        self.plan_result = result
        lines = [html.escape(line) for line in plan_table.summary_lines(result)]
        lines[-1] = f"<b>{lines[-1]}</b>"  # the best plan and its gain: what the user came for
        connection = self.connection()
        note = plan_table.precision_note(result, connection.details if connection is not None else None)
        if note:  # which precision the run uses, beside the one predicted
            lines.insert(-1, html.escape(note, quote=False))
        self.summary_label.setText("<br>".join(lines))
        rows = plan_table.display_rows(result)
        table = self.table
        table.setSortingEnabled(False)
        table.clearContents()
        table.setRowCount(len(rows))
        bold = QFont(table.font())
        bold.setBold(True)
        for r, row in enumerate(rows):
            for c, column in enumerate(plan_table.COLUMNS):
                item = _SortItem(row.cells[c], row.sort_keys[c])
                item.setToolTip(row.tooltips[c] or column.tooltip)
                align = Qt.AlignmentFlag.AlignRight if column.numeric else Qt.AlignmentFlag.AlignLeft
                item.setTextAlignment(align | Qt.AlignmentFlag.AlignVCenter)
                item.setData(ROW_INDEX_ROLE, r)  # the result's row, whatever the sorting
                if row.best:
                    item.setBackground(BEST_BACKGROUND)
                    item.setFont(bold)
                    item.setData(Qt.ItemDataRole.UserRole, "best")
                elif row.status == "pruned":
                    item.setForeground(PRUNED_FOREGROUND)
                elif row.status == "failed":
                    item.setForeground(FAILED_FOREGROUND)
                table.setItem(r, c, item)
        self._fit_columns()
        table.setSortingEnabled(True)
        table.sortByColumn(plan_table.COLUMN_INDEX["status"], Qt.SortOrder.AscendingOrder)
        self.use_label.setProperty("used", False)
        self.use_label.setText("")
        if self.best_row() >= 0:  # "Use this plan" offers the best one until the user picks another
            table.selectRow(self.best_row())
        self._update_use_button()

    def _fit_columns(self) -> None:
        """Every column but the last (which stretches and wraps) as wide as its content, with a little air."""
        for c in range(plan_table.COLUMN_INDEX["note"]):
            self.table.resizeColumnToContents(c)
            self.table.setColumnWidth(c, self.table.columnWidth(c) + 12)

    def best_row(self) -> int:
        """The table row of the best plan (after any sorting), or -1."""
        for r in range(self.table.rowCount()):
            item = self.table.item(r, 0)
            if item is not None and item.data(Qt.ItemDataRole.UserRole) == "best":
                return r
        return -1
