"""The Qt side of engine servers: the connect dialog, the Generate menu entries, the device and metrics wiring."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
)

from app.core.plan_table import xla_device_list
from app.core.remote_connection import (
    MetricsFeed,
    RemoteModelSource,
    ServerConnection,
    check_connection_settings,
    probe_server,
    remote_model_sources,
)
from app.panels.sampling_panel import SamplingPanel
from app.services import AppServices
from app.services.shortcuts import SHORTCUTS, set_shortcut
from engine.errors import InvalidRequest
from engine.formatting import count_of

if TYPE_CHECKING:
    from app.remote.plan_dialog import PlanDialog  # (imported when first opened: it is not needed at start)

LAST_URL_KEY = "remote/last_url"
LAST_FINGERPRINT_KEY = "remote/last_fingerprint"  # not a secret: the certificate's public hash
DEFAULT_URL = "http://127.0.0.1:8765"
BLOCK_SOURCE = "remote"
PLAN_SHORTCUT = SHORTCUTS["generate.plan"].keys
PLAN_TIP = "Predict how a model's steps split over a multi-device slice (volsynth plan on the engine server)"
PLAN_NEEDS_SERVER = (
    "Connect an engine server first (Generate > Connect to Engine Server...): it does the planning"
)


class ServerDialog(QDialog):
    """Address, token and (for https) the certificate fingerprint to pin; Connect checks them in a worker
    thread and stays open with the reason if they fail, or at once if the client refuses to send them."""

    connected = Signal(object)  # ServerConnection

    def __init__(self, controller: RemoteController) -> None:
        super().__init__(controller.dialog_parent)
        self.controller = controller
        self.setWindowTitle("Connect to Engine Server")
        self.setModal(True)
        self.connection: ServerConnection | None = None
        self.url_edit = QLineEdit(str(controller.settings.value(LAST_URL_KEY, DEFAULT_URL, type=str)))
        self.url_edit.setPlaceholderText(DEFAULT_URL)
        self.url_edit.setToolTip(
            "The address `volsynth serve` prints on the server, e.g. http://gpu-box:8765"
        )
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("the server's --token (empty if it has none)")
        self.token_edit.setToolTip("Kept in memory for this session only")
        self.fingerprint_edit = QLineEdit(
            str(controller.settings.value(LAST_FINGERPRINT_KEY, "", type=str))
            if self.url_edit.text().startswith("https://")
            else ""
        )
        self.fingerprint_edit.setPlaceholderText("https only, optional: the SHA-256 the server printed")
        self.fingerprint_edit.setToolTip(
            "The certificate fingerprint `volsynth serve --tls-self-signed` prints (AB:CD:...). With it, "
            "the app talks only to the server holding that certificate; without it, an https server needs "
            "a certificate this computer trusts."
        )
        self.status_label = QLabel("")
        self.status_label.setObjectName("serverStatus")
        self.status_label.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.connect_button = self.buttons.addButton("Connect", QDialogButtonBox.ButtonRole.AcceptRole)
        self.connect_button.setDefault(True)
        self.buttons.accepted.connect(self.try_connect)
        self.buttons.rejected.connect(self.reject)
        form = QFormLayout()
        form.addRow("Address", self.url_edit)
        form.addRow("Token", self.token_edit)
        form.addRow("Fingerprint", self.fingerprint_edit)
        layout = QVBoxLayout(self)
        layout.addWidget(
            QLabel(
                "Run generations on another machine's GPU. Start the server there with\n"
                "`volsynth serve --host 0.0.0.0 --token TOKEN --tls-self-signed` (a token from\n"
                "`volsynth serve --new-token`), connect to https://host:8765 and paste the fingerprint\n"
                "it prints; or serve on 127.0.0.1 and connect through an SSH tunnel."
            )
        )
        layout.addLayout(form)
        layout.addWidget(self.status_label)
        layout.addWidget(self.buttons)
        self.resize(520, self.sizeHint().height())

    def try_connect(self) -> None:
        token = self.token_edit.text() or None
        try:  # what the client refuses (nothing is sent) is said here, and the dialog stays open
            url, fingerprint = check_connection_settings(
                self.url_edit.text(), token, self.fingerprint_edit.text()
            )
        except InvalidRequest as exc:
            self.status_label.setText(str(exc))
            return
        self.connect_button.setEnabled(False)
        self.status_label.setText(f"Connecting to {url}...")
        self.controller.runner.run_task(
            "probe-server",
            probe_server,
            url,
            token,
            fingerprint,
            finished=self._on_probe_finished,
            failed=self._on_probe_failed,
        )

    def _on_probe_finished(self, connection: ServerConnection) -> None:
        self.connect_button.setEnabled(True)
        self.connection = connection
        self.connected.emit(connection)
        self.accept()

    def _on_probe_failed(self, message: str) -> None:
        self.connect_button.setEnabled(True)
        self.status_label.setText(f"Could not connect: {message}")


class RemoteController:
    """Connects engine servers to one main window: devices, backends, request model ids, metrics.

    ``panel`` is the Generate panel (its device list gains and loses the servers); of ``services`` it uses
    the session, runner, backends, settings and status line, the Metrics dock's sources (a server's metrics,
    or this machine's) and ``parent``, the widget the dialogs and actions belong to.
    """

    def __init__(self, services: AppServices, panel: SamplingPanel) -> None:
        self.state = services.state
        self.panel = panel
        self.runner = services.runner
        self.backends = services.backends
        self.settings = services.settings
        self.show_status = services.show_status
        self.show_metrics_source = services.telemetry.show
        parent = services.parent
        self.dialog_parent = parent  # the widget its dialogs belong to (the main window), nothing else
        self.connections: dict[str, ServerConnection] = {}  # device id -> connection
        self.feeds: dict[str, MetricsFeed] = {}
        self.models: dict[str, list[RemoteModelSource]] = {}  # device id -> the server's models we lack
        self.dialog: ServerDialog | None = None
        self.plan_dialog: PlanDialog | None = None  # made on first use
        self.connect_action = set_shortcut(
            QAction("Connect to Engine &Server...", parent), "generate.connect_server"
        )
        self.connect_action.setStatusTip("Run generations on a VolSynth engine server (volsynth serve)")
        self.connect_action.triggered.connect(self.open_dialog)
        self.disconnect_action = QAction("Disco&nnect from Engine Server", parent)
        self.disconnect_action.setStatusTip("Forget the selected engine server")
        self.disconnect_action.triggered.connect(self._on_disconnect_triggered)
        self.disconnect_action.setEnabled(False)
        self.plan_action = set_shortcut(QAction("&Plan Multi-Device Run...", parent), "generate.plan")
        self.plan_action.triggered.connect(self.open_plan_dialog)
        self._update_plan_action()
        self.state.form.changed.connect(self._on_form_changed)
        self.state.job_changed.connect(self._on_state_job_changed)

    # -- connecting ----------------------------------------------------------------------------------

    def open_dialog(self) -> ServerDialog:
        self.dialog = ServerDialog(self)
        self.dialog.connected.connect(self.add_connection)
        self.dialog.open()
        return self.dialog

    def open_plan_dialog(self):
        """Show the (non-modal) Plan dialog for the connected servers."""
        from app.remote.plan_dialog import PlanDialog

        if not self.connections:
            self.show_status(PLAN_NEEDS_SERVER, 8000)
            return None
        if self.plan_dialog is None:  # later connections reach it through _update_plan_action
            self.plan_dialog = PlanDialog(self)
        self.plan_dialog.show()
        self.plan_dialog.raise_()
        self.plan_dialog.activateWindow()
        return self.plan_dialog

    def add_connection(self, connection: ServerConnection) -> None:
        """Make a checked server a device (and select it)."""
        device = connection.device_id
        self.remove_connection(device)
        self.connections[device] = connection
        self.state.form.set_server_details(device, connection.details)
        self.backends.add_server(device, connection.url, connection.token, connection.fingerprint)
        feed = MetricsFeed(connection.url, connection.token, fingerprint=connection.fingerprint)
        feed.start()
        self.feeds[device] = feed
        self.settings.setValue(LAST_URL_KEY, connection.url)
        self.settings.setValue(LAST_FINGERPRINT_KEY, connection.fingerprint or "")
        local_ids = {m.id for m in self.state.models if not isinstance(m, RemoteModelSource)}
        sources, problems = remote_model_sources(connection, local_ids)
        self.models[device] = sources
        self.state.add_models(sources)
        planned = self.state.form.xla_plan
        self.panel.add_device(connection.label, device)  # selects it: a plan for another server is cleared
        cleared = self.state.form.xla_plan_cleared if planned and not self.state.form.xla_plan else ""
        self._update()
        extra = f", {len(sources)} of them only there (added to the model list)" if sources else ""
        unreadable = f"; could not read {len(problems)}: {'; '.join(problems)}" if problems else ""
        devices = connection.xla_devices
        listed = f"; XLA devices: {xla_device_list(devices)}" if devices else ""
        self.show_status(
            f"Connected to {connection.url}: {connection.device_summary}, "
            f"{count_of(len(connection.model_ids), 'model')}{extra}{unreadable}{listed}"
            + (f". {cleared}" if cleared else ""),
            10000,
        )

    def remove_connection(self, device: str) -> None:
        if device not in self.connections:
            return
        del self.connections[device]
        self.state.form.set_server_details(device, None)
        feed = self.feeds.pop(device, None)
        if feed is not None:
            feed.stop()
        self.backends.remove(device)
        self.state.remove_models(self.models.pop(device, []))
        self.panel.remove_device(device)
        self._update()

    def _on_disconnect_triggered(self) -> None:
        device = self.selected_device()
        if device in self.connections:
            url = self.connections[device].url
            self.remove_connection(device)
            self.show_status(f"Disconnected from {url}", 5000)

    def close(self) -> None:
        for device in list(self.connections):
            self.remove_connection(device)

    # -- while connected -----------------------------------------------------------------------------

    def selected_device(self) -> str:
        return self.state.form.device

    def metrics_source_for(self, device: str):
        """The server's metrics feed for a ``remote:`` device; None for this machine's devices."""
        feed = self.feeds.get(device)
        return None if feed is None else feed.source

    def _update_plan_action(self) -> None:
        connected = bool(self.connections)
        self.plan_action.setEnabled(connected)
        tip = PLAN_TIP if connected else PLAN_NEEDS_SERVER
        self.plan_action.setStatusTip(tip)
        self.plan_action.setToolTip(f"{tip} ({PLAN_SHORTCUT})")
        if self.plan_dialog is not None:
            self.plan_dialog.set_connections(list(self.connections.values()))

    def _update(self) -> None:
        self._update_plan_action()
        device = self.selected_device()
        connection = self.connections.get(device)
        # Not while a run is in flight: it holds the server's backend (cancel first, then disconnect).
        self.disconnect_action.setEnabled(connection is not None and not self.state.job_running)
        source = self.state.selected_model
        reason = None
        if isinstance(source, RemoteModelSource) and (connection is None or connection.url != source.url):
            reason = (
                f"{source.spec.name} is installed on the engine server {source.url} only; choose that server "
                "as the device"
            )
        elif connection is not None and source is not None and source.spec.id not in connection.model_ids:
            models = ", ".join(connection.model_ids) or "none"
            reason = (
                f"the engine server {connection.url} has no model {source.spec.id!r} (it has: {models}); "
                "choose one of those or install the model there"
            )
        self.state.form.set_blocked(BLOCK_SOURCE, reason)
        self.show_metrics_source(self.metrics_source_for(device))

    def _on_form_changed(self, name: str) -> None:
        if name in ("device", "model"):
            self._update()
        elif name == "xla_plan" and self.state.form.xla_plan_cleared:
            self.show_status(self.state.form.xla_plan_cleared, 10000)  # the Generate panel shows it too

    def _on_state_job_changed(self, _running: bool) -> None:
        self._update()


def install_remote(services: AppServices, sampling_panel: SamplingPanel) -> RemoteController:
    """Give the main window its engine-server entries in the Generate menu (the servers join the device
    list of ``sampling_panel``), and let its Metrics dock follow a server chosen as the device."""
    controller = RemoteController(services, sampling_panel)
    services.telemetry.follow_remote(controller.metrics_source_for)
    menu = services.menus.generate
    menu.addSeparator()
    for action in (controller.connect_action, controller.disconnect_action, controller.plan_action):
        services.menus.add_window_action(action)
        menu.addAction(action)
    return controller
