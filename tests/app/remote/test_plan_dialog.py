"""Generate > Plan Multi-Device Run... against a real ``volsynth serve --device xla`` (tiny model).

The server runs in its own process, as users run it (`volsynth serve --device xla`), and the app talks to
it over HTTP only.
"""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import Qt

from app.core.plan_table import COLUMN_INDEX
from engine.server import create_app
from engine.testing import ServerThread
from tests.app.remote.xla_server import PLAN_TIMEOUT_MS, TOKEN, connect_remote, open_plan_dialog_of

pytestmark = pytest.mark.render
STATUS = COLUMN_INDEX["status"]


def _type_topology(qtbot, dialog, text):
    edit = dialog.topology_box.lineEdit()
    edit.selectAll()
    qtbot.keyClicks(edit, text)
    assert dialog.topology_box.currentText() == text


def _wait_no_plan_jobs(qtbot, generating):
    runner = generating.services.runner
    qtbot.waitUntil(lambda: not runner.running("plan-on-server"), timeout=PLAN_TIMEOUT_MS)


def _connect(qtbot, generating, url):
    connect_remote(qtbot, generating.remote, url)


def _open_plan_dialog(qtbot, generating):
    return open_plan_dialog_of(qtbot, generating.services.parent, generating.remote)


@pytest.mark.slow
def test_plan_a_run_on_an_xla_server(qtbot, generating, xla_server, screenshot):
    assert not generating.remote.plan_action.isEnabled()
    assert "Connect an engine server first" in generating.remote.plan_action.statusTip()
    assert generating.remote.plan_action in generating.services.menus.generate.actions()

    _connect(qtbot, generating, xla_server)
    # The device picker and the status bar name the server's XLA device.
    # One device, or all of its fake host devices once a server runs plans over them (\u00d7N).
    assert re.search(r"xla:cpu cpu( \u00d7\d+)?$", generating.sampling_panel.device_box.currentText())
    assert "XLA devices: #0 cpu" in generating.services.parent.statusBar().currentMessage()
    connection = next(iter(generating.remote.connections.values()))
    assert connection.details["xla_precision"] == "highest"
    # Torch settings cannot apply on an XLA server: the Optimization panel turns them off and says why.
    panel = generating.optimization_panel
    assert not panel.preset_box.isEnabled() and not panel.combos["autocast"].isEnabled()
    assert "XLA engine server" in panel.combos["autocast"].toolTip()
    assert "XLA programs" in panel.summary.text()
    screenshot(generating.services.parent, "xla-server-connected")

    dialog = _open_plan_dialog(qtbot, generating)
    assert not dialog.isModal()
    assert "xla:cpu cpu" in dialog.devices_label.text() and "#0 cpu" in dialog.devices_label.text()
    models = [dialog.model_box.itemText(i) for i in range(dialog.model_box.count())]
    assert "tiny-latent" in models and models[-1] == "brain-ldm-bundle"  # the shipped model is there too
    assert dialog.topology_box.itemText(0) == "v5e:2x4"  # no slice of its own: the README's example first
    assert dialog.cfg_check.isChecked() and dialog.top_spin.value() == 3
    assert dialog.plan_button.isDefault()

    _type_topology(qtbot, dialog, "v5e:2x2")
    dialog.top_spin.setValue(1)
    qtbot.mouseClick(dialog.plan_button, Qt.MouseButton.LeftButton)
    assert not dialog.form_widget.isEnabled() and not dialog.plan_button.isEnabled()
    assert dialog.cancel_button.isEnabled() and dialog.progress.isVisible()
    assert "Planning tiny-latent on v5e:2x2" in dialog.status_label.text()

    qtbot.waitUntil(lambda: dialog.table.rowCount() > 0, timeout=PLAN_TIMEOUT_MS)
    _wait_no_plan_jobs(qtbot, generating)
    assert dialog.form_widget.isEnabled() and dialog.plan_button.isEnabled()
    assert not dialog.cancel_button.isEnabled() and not dialog.progress.isVisible()
    assert dialog.status_label.text().startswith("Planned tiny-latent on v5e:2x2 in ")

    result = dialog.plan_result
    counts = result["counts"]
    table = dialog.table
    statuses = [table.item(r, STATUS).text() for r in range(table.rowCount())]
    assert table.rowCount() == counts["enumerated"] == len(result["rows"])
    assert sum(s.startswith("compiled") for s in statuses) == counts["compiled"] >= 1
    assert sum(s == "pruned" for s in statuses) == counts["pruned"]
    summary = dialog.summary_label.text()
    assert (
        f"{counts['enumerated']} plans enumerated: {counts['pruned']} pruned, {counts['compiled']} compiled, "
        f"{counts['failed']} failed" in summary
    )
    # The gain over the topology-unaware choice (on 2x2 both models may pick the same plan).
    assert re.search(r"x\d+\.\d\d( over|:) the topology-unaware choice", summary)
    assert "4 \u00d7 TPU v5e" in summary and "effective batch 2" in summary
    assert "compute predicted at XLA precision" in summary and "default" in summary
    # The server runs at 'highest' (float32): the view says which precision the run uses, against the prediction.
    assert "This server runs at XLA precision 'highest' (its --xla-precision), not the 'default'" in summary

    best = dialog.best_row()
    assert best == 0  # listed first
    assert table.item(best, 0).text() == result["best"]["plan"]
    assert "best" in table.item(best, STATUS).text()
    assert f"Best: {result['best']['plan']}" in summary
    assert table.item(best, 0).background().color().name() == "#1f3d2b"
    pruned = statuses.index("pruned")
    assert table.item(pruned, 0).foreground().color().name() == "#6b7380"
    step = COLUMN_INDEX["step"]
    assert table.item(best, step).textAlignment() & Qt.AlignmentFlag.AlignRight
    assert table.horizontalHeaderItem(step).toolTip()

    # Sorting by predicted step time puts rows with no estimate last and keeps the best marked.
    table.sortByColumn(step, Qt.SortOrder.AscendingOrder)
    times = [table.item(r, step).text() for r in range(table.rowCount())]
    assert times[-1] == "\u2013" and times[0] != "\u2013"
    assert "best" in table.item(dialog.best_row(), STATUS).text()
    table.sortByColumn(STATUS, Qt.SortOrder.AscendingOrder)
    screenshot(dialog, "plan-dialog")


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("9xH100-nvlink", "topology '9xH100-nvlink': a GPU box has 1 to 8 GPUs; known: v5e:2x2"),
        ("v9z:3x3", "'v9z:3x3' is not a topology name this server accepts"),  # the server's schema refuses it
    ],
)
def test_an_unknown_topology_shows_the_servers_reason(qtbot, generating, xla_server, typed, expected):
    _connect(qtbot, generating, xla_server)
    dialog = _open_plan_dialog(qtbot, generating)
    _type_topology(qtbot, dialog, typed)
    qtbot.mouseClick(dialog.plan_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "could not plan" in dialog.status_label.text(), timeout=PLAN_TIMEOUT_MS)
    text = dialog.status_label.text()
    assert text.startswith("The server could not plan: ") and expected in text
    assert "Traceback" not in text and dialog.status_label.property("error") is True
    assert dialog.table.rowCount() == 0 and dialog.form_widget.isEnabled() and dialog.plan_button.isEnabled()
    _wait_no_plan_jobs(qtbot, generating)


def test_a_time_limit_of_zero_gets_the_best_estimate_marked_cut_short(
    qtbot, generating, xla_server, screenshot
):
    _connect(qtbot, generating, xla_server)
    dialog = _open_plan_dialog(qtbot, generating)
    assert dialog.limit_spin.value() == 120 and dialog.limit_spin.suffix() == " s"  # the server's default
    _type_topology(qtbot, dialog, "v5e:2x2")
    dialog.limit_spin.selectAll()
    qtbot.keyClicks(dialog.limit_spin, "0")
    assert dialog.limit_spin.value() == 0
    qtbot.mouseClick(dialog.plan_button, Qt.MouseButton.LeftButton)
    assert "of at most about 0 s" in dialog.status_label.text()
    qtbot.waitUntil(lambda: dialog.status_label.text().startswith("Planned"), timeout=PLAN_TIMEOUT_MS)
    _wait_no_plan_jobs(qtbot, generating)
    result = dialog.plan_result
    # Blocks this module's other plans compiled come from the server's plan cache even now; nothing else.
    assert result["cut_short"] and result["time_limit_s"] == 0
    summary = dialog.summary_label.text()
    assert (
        "Cut short: Planning-time limit of 0 s reached" in summary
        and "Plan again to go on from there" in summary
    )
    assert f"<b>Best so far: {result['best']['plan']} on placement" in summary
    assert (
        "(cut short by the server's planning-time limit: the best plan so far)." in dialog.status_label.text()
    )
    screenshot(dialog, "plan-dialog-cut-short")


def test_cancel_gives_the_form_back_and_drops_the_late_result(qtbot, generating, xla_server):
    _connect(qtbot, generating, xla_server)
    dialog = _open_plan_dialog(qtbot, generating)
    _type_topology(qtbot, dialog, "v5e:2x2")
    dialog.top_spin.setValue(1)
    qtbot.mouseClick(dialog.plan_button, Qt.MouseButton.LeftButton)
    assert dialog.cancel_button.isEnabled()
    qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    assert dialog.form_widget.isEnabled() and dialog.plan_button.isEnabled()
    assert not dialog.cancel_button.isEnabled() and not dialog.progress.isVisible()
    assert dialog.status_label.text().startswith("Cancelled: no longer waiting")
    assert "result will be discarded" in dialog.status_label.text()

    qtbot.waitUntil(
        lambda: "discarded" in dialog.status_label.text() and "has finished" in dialog.status_label.text(),
        timeout=PLAN_TIMEOUT_MS,
    )
    _wait_no_plan_jobs(qtbot, generating)
    assert dialog.table.rowCount() == 0 and dialog.plan_result is None and dialog.summary_label.text() == ""


def test_plan_view_of_a_torch_server_and_disconnecting_disables_plan(qtbot, generating, registry):
    from engine.backends.local import LocalBackend

    with ServerThread(create_app(LocalBackend("cpu", registry), token=TOKEN)) as url:
        _connect(qtbot, generating, url)
        assert "  \u2013  cpu " in generating.sampling_panel.device_box.currentText()  # "cpu x86_64"
        assert "XLA devices" not in generating.services.parent.statusBar().currentMessage()
        # A torch server checks the settings with its own hardware probe, which the panel names.
        panel = generating.optimization_panel
        assert panel.combos["autocast"].isEnabled()
        assert "Checked by the engine server (" in panel.summary.text() and "cores" in panel.summary.text()
        dialog = _open_plan_dialog(qtbot, generating)
        assert "(not XLA)" in dialog.devices_label.text()
        assert dialog.model_box.count() == 4 and dialog.model_box.itemText(3) == "brain-ldm-bundle"
        assert dialog.plan_button.isEnabled()
        generating.remote.disconnect_action.trigger()
        assert not generating.remote.plan_action.isEnabled()
        assert "Connect an engine server first" in generating.remote.plan_action.statusTip()
        assert dialog.server_box.count() == 0 and not dialog.plan_button.isEnabled()
        assert "No engine server is connected" in dialog.devices_label.text()
