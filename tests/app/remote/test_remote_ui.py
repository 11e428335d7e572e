"""Engine servers in the app, against a real uvicorn server on 127.0.0.1 serving the tiny models."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app.core.generation_form import REMOTE_PREFIX
from app.remote import normalise_url, probe_server
from engine.backends.local import LocalBackend
from engine.errors import BackendUnavailable, InvalidRequest
from engine.server import create_app
from engine.testing import ServerThread
from tests.app.keys import pick

pytestmark = pytest.mark.render
TOKEN = "t0ken-for-tests"


@pytest.fixture
def server(registry):
    from engine.telemetry import Sampler

    metrics = Sampler(interval_s=0.2)
    metrics.start()
    with ServerThread(create_app(LocalBackend("cpu", registry), token=TOKEN, metrics_source=metrics)) as url:
        yield url
    metrics.stop()


def _connect(qtbot, remote, url, token=TOKEN):
    dialog = remote.open_dialog()
    dialog.url_edit.setText(url)
    dialog.token_edit.setText(token)
    dialog.connect_button.click()
    return dialog


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu-box:8765", "http://gpu-box:8765"),
        (" https://10.0.0.5:9000/ ", "https://10.0.0.5:9000"),
    ],
)
def test_addresses_are_normalised(text, expected):
    assert normalise_url(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "enter the engine server's address"),
        ("ftp://box:21", r"not an http\(s\) address"),
        ("http://box:8765/jobs", "has a path"),
        ("http://box:99999", "invalid port"),
    ],
)
def test_bad_addresses_are_refused_with_the_reason(text, message):
    with pytest.raises(InvalidRequest, match=message):
        normalise_url(text)


def test_probe_reports_device_and_models_and_refuses_a_wrong_token(server):
    connection = probe_server(server, TOKEN)
    assert connection.device == "cpu" and connection.device_id == REMOTE_PREFIX + server
    assert set(connection.model_ids) == {"tiny-latent", "tiny-pixel", "tiny-rflow"}
    with pytest.raises(BackendUnavailable, match="refused the token"):
        probe_server(server, "wrong")


@pytest.mark.slow
def test_generate_on_a_server_from_the_app(qtbot, generating, server, registry):
    state = generating.services.state
    state.select_model(state.model_by_id("tiny-latent"))
    generating.sampling_panel.steps_spin.setValue(5)
    dialog = _connect(qtbot, generating.remote, server.replace("http://", ""))
    qtbot.waitUntil(lambda: bool(generating.remote.connections), timeout=20_000)
    assert not dialog.isVisible()
    device = generating.sampling_panel.device_box.currentData()
    assert device == REMOTE_PREFIX + server
    assert "cpu" in generating.sampling_panel.device_box.currentText()
    assert state.form.model_reference() == "tiny-latent"  # the server's registry resolves ids
    assert "engine server" in generating.optimization_panel.summary.text()
    feed = generating.remote.feeds[device]
    qtbot.waitUntil(lambda: feed.fed >= 2, timeout=20_000)  # the server's metrics arrive
    assert generating.metrics_dock.source is feed.source

    assert generating.remote.disconnect_action.isEnabled()
    generating.sampling_panel.generate_button.click()
    assert not generating.remote.disconnect_action.isEnabled()  # the run holds the server's backend
    assert generating.wait_ended(qtbot) == "finished"
    assert generating.remote.disconnect_action.isEnabled()
    host = server.replace("http://", "")
    # The run's summary and the status bar name the server, not "auto" or this machine.
    assert (
        host in generating.sampling_panel.progress_label.text()
        and host in generating.status.device_label.text()
    )
    entry = state.shown
    assert entry.provenance["backend"] == "remote" and entry.provenance["server"] == server
    run_id = generating.metrics_dock.run_marks[
        -1
    ].run_id  # the run is marked on the server's metrics, not ours
    assert (
        feed.source.run_summary(run_id) is not None
        and generating.services.telemetry.sampler.run_summary(run_id) is None
    )
    assert entry.provenance["telemetry"]["run_id"] == run_id
    local = LocalBackend("cpu", registry)
    from engine.api import run

    expected = run(local.sample(state.form.to_request().replace(model="tiny-latent", preview_interval=0)))
    assert np.array_equal(entry.data, expected.volume())

    # Disconnect: back to this machine's devices and metrics; what the user typed stays.
    generating.sampling_panel.seed_spin.setValue(4321)
    state.form.set_condition("ventricle_volume", 60.0)
    kept = state.form.to_dict()
    generating.remote.disconnect_action.trigger()
    assert generating.sampling_panel.device_box.findData(device) < 0
    assert not generating.remote.feeds and generating.metrics_dock.source is not feed.source
    assert state.form.device == "auto" and state.form.to_dict() == kept
    assert generating.sampling_panel.seed_spin.value() == 4321


def test_a_model_the_server_lacks_blocks_generate_with_the_reason(qtbot, generating, server, tmp_path):
    from engine.testing import make_tiny_model

    state = generating.services.state
    folder = tmp_path / "only-here"
    make_tiny_model(folder, model_id="only-here")
    assert generating.services.open_model_folder(folder)
    _connect(qtbot, generating.remote, server)
    qtbot.waitUntil(lambda: bool(generating.remote.connections), timeout=20_000)
    reason = state.form.blocked_reason()
    assert "has no model 'only-here'" in reason and "tiny-latent" in reason
    panel = generating.sampling_panel
    assert not panel.generate_button.isEnabled()
    # The line under the button says why, not only the button's tooltip.
    assert panel.progress_label.text() == f"Cannot generate: {reason.splitlines()[0]}"
    generating.services.parent.activateWindow()  # the connect dialog had the keyboard
    qtbot.waitUntil(generating.services.parent.isActiveWindow, timeout=5_000)
    pick(qtbot, panel.model_box, "tiny-pixel")
    assert state.form.blocked_reason() == ""
    assert panel.generate_button.isEnabled() and panel.progress_label.text() == "Ready"


def test_wrong_token_or_no_server_keeps_the_dialog_open_with_the_reason(qtbot, generating, server):
    dialog = _connect(qtbot, generating.remote, server, token="nope")
    qtbot.waitUntil(lambda: "Could not connect" in dialog.status_label.text(), timeout=20_000)
    assert "refused the token" in dialog.status_label.text() and dialog.isVisible()
    assert not generating.remote.connections
    dialog.url_edit.setText("http://127.0.0.1:9")  # nothing listens on the discard port
    dialog.connect_button.click()
    qtbot.waitUntil(lambda: "cannot reach" in dialog.status_label.text(), timeout=20_000)
    dialog.url_edit.setText("ftp://x")
    dialog.connect_button.click()
    assert "not an http(s) address" in dialog.status_label.text()
    qtbot.keyClick(dialog, Qt.Key.Key_Escape)
    assert not dialog.isVisible() and not generating.remote.connections


@pytest.mark.slow
def test_compare_runs_on_the_server(qtbot, generating, server):
    state = generating.services.state
    state.select_model(state.model_by_id("tiny-latent"))
    generating.sampling_panel.steps_spin.setValue(5)
    _connect(qtbot, generating.remote, server)
    qtbot.waitUntil(lambda: bool(generating.remote.connections), timeout=20_000)
    panel = generating.optimization_panel
    panel.set_values({**panel.values(), "autocast": "bf16"})
    compare = generating.compare.open()
    assert compare.start()
    with qtbot.waitSignal(compare.comparison_ended, timeout=120_000) as ended:
        pass
    assert ended.args[0] == "finished"
    result = compare.comparison
    assert result.b.result.provenance["backend"] == "remote" and result.b.applied() == ["autocast"]
    assert result.b.kernel_profile["operators"]
    compare.close()


@pytest.fixture
def server_with_extra_model(tiny_models_dir, tmp_path):
    """A server whose registry has a model this computer lacks ("server-only")."""
    from engine.models.registry import ModelRegistry
    from engine.testing import make_tiny_model

    extra = tmp_path / "server-models"
    make_tiny_model(extra / "server-only", model_id="server-only", kind="pixel", conditioned=False)
    backend = LocalBackend("cpu", ModelRegistry([tiny_models_dir, extra]))
    with ServerThread(create_app(backend, token=TOKEN)) as url:
        yield url


@pytest.mark.slow
def test_models_only_the_server_has_are_listed_and_run_there(
    qtbot, generating, server_with_extra_model, error_dialogs
):
    state = generating.services.state
    url = server_with_extra_model
    _connect(qtbot, generating.remote, url)
    qtbot.waitUntil(lambda: bool(generating.remote.connections), timeout=20_000)
    remote_only = state.model_by_id("server-only")
    assert remote_only is not None and remote_only.spec.name.endswith(f"(on {url.removeprefix('http://')})")
    assert generating.sampling_panel.model_box.findData("server-only") >= 0
    assert "installed on the engine server" in remote_only.model_card()
    state.select_model(remote_only)
    generating.sampling_panel.steps_spin.setValue(3)
    assert state.form.blocked_reason() == ""  # the server is the device
    generating.sampling_panel.generate_button.click()
    assert generating.wait_ended(qtbot) == "finished"
    entry = state.shown
    assert entry.provenance["model"]["id"] == "server-only" and entry.provenance["backend"] == "remote"

    # On this computer's CPU the model cannot run: Generate and Compare say why.
    panel = generating.sampling_panel
    panel.device_box.setCurrentIndex(panel.device_box.findData("cpu"))
    reason = state.form.blocked_reason()
    assert "installed on the engine server" in reason and not panel.generate_button.isEnabled()
    compare = generating.compare.open()
    compare.b_box.setCurrentText("bf16")
    assert not compare.start() and "installed on the engine server" in error_dialogs[-1][1]
    compare.close()

    # Disconnecting takes the server's models out of the list.
    panel.device_box.setCurrentIndex(panel.device_box.findData(REMOTE_PREFIX + url))
    generating.remote.disconnect_action.trigger()
    assert state.model_by_id("server-only") is None
    assert state.selected_model is not None and state.selected_model.id != "server-only"


def test_the_dialog_shows_what_the_client_refuses_to_send(qtbot, generating):
    """A token over plain http to another machine, a fingerprint for http, a malformed fingerprint: said at
    once in the dialog, nothing sent (no probe runs)."""
    dialog = generating.remote.open_dialog()
    dialog.url_edit.setText("http://gpu-box:8765")
    qtbot.keyClicks(dialog.token_edit, "a-token")
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    assert "refusing to send the token in clear over http:// to gpu-box" in dialog.status_label.text()
    assert dialog.isVisible() and not generating.services.runner.jobs and not generating.remote.connections
    dialog.token_edit.clear()
    qtbot.keyClicks(dialog.fingerprint_edit, "AB" * 32)
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    assert "pins an https server's certificate" in dialog.status_label.text()
    dialog.url_edit.setText("https://gpu-box:8765")
    dialog.fingerprint_edit.setText("12:34")
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    assert "64 hex digits" in dialog.status_label.text() and not generating.services.runner.jobs
    qtbot.keyClick(dialog, Qt.Key.Key_Escape)


@pytest.fixture
def tls_server(registry, tmp_path):
    """An https engine server with a self-signed certificate, and that certificate's fingerprint."""
    from engine.server import certificate_file_fingerprint, self_signed_certificate
    from engine.telemetry import Sampler

    cert, key = self_signed_certificate(tmp_path / "tls", ["127.0.0.1"])
    metrics = Sampler(interval_s=0.2)
    metrics.start()
    app = create_app(LocalBackend("cpu", registry), token=TOKEN, metrics_source=metrics)
    with ServerThread(app, ssl_certfile=cert, ssl_keyfile=key) as url:
        yield url, certificate_file_fingerprint(cert)
    metrics.stop()


def test_connect_over_tls_with_a_pinned_fingerprint(qtbot, generating, tls_server):
    url, fingerprint = tls_server
    dialog = generating.remote.open_dialog()
    dialog.url_edit.setText(url)
    dialog.token_edit.setText(TOKEN)
    qtbot.keyClicks(dialog.fingerprint_edit, "00" * 32)  # not this server's certificate
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Could not connect" in dialog.status_label.text(), timeout=20_000)
    assert "not the pinned" in dialog.status_label.text() and not generating.remote.connections
    dialog.fingerprint_edit.clear()
    qtbot.keyClicks(dialog.fingerprint_edit, fingerprint.lower())
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(generating.remote.connections), timeout=20_000)
    device = REMOTE_PREFIX + url
    assert generating.remote.connections[device].fingerprint == fingerprint
    assert (
        generating.services.backends.get(device).fingerprint == fingerprint
    )  # runs go to the pinned server only
    feed = generating.remote.feeds[device]
    qtbot.waitUntil(lambda: feed.fed >= 1, timeout=20_000)  # metrics arrive over the pinned connection
    generating.remote.disconnect_action.trigger()
    dialog = generating.remote.open_dialog()  # the address and the (public) fingerprint are remembered
    assert dialog.url_edit.text() == url and dialog.fingerprint_edit.text() == fingerprint
    qtbot.keyClick(dialog, Qt.Key.Key_Escape)
