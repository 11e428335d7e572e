"""The Plan view's "Use this plan for the next run": the form keeps the plan for its server, the Generate
panel shows it, the next request carries it, a finished run's details name it, and another device clears it.

The GUI test runs a real ``volsynth serve --device xla --xla-devices 4`` (4 fake host devices, tiny model)
in its own process, as users run it, and talks to it over HTTP only.
"""

from __future__ import annotations

import importlib.util

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app.core.display import xla_run_lines
from app.core.generation_form import REMOTE_PREFIX, GenerationForm
from app.core.plan_table import batch_mismatch_text, format_duration_ms, use_plan_problem, xla_device_count
from engine.api.optimization_config import OptimizationConfig
from engine.formatting import format_bytes
from tests.app.keys import pick
from tests.app.remote.xla_server import (
    PLAN_TIMEOUT_MS,
    TOKEN,
    connect_remote,
    open_plan_dialog_of,
    xla_server,
)

SERVER = REMOTE_PREFIX + "http://tpu-vm:8765"
FOUR_DEVICES = {"xla_devices": [{"id": i, "platform": "cpu", "kind": "cpu"} for i in range(4)]}
COMPILED = {"plan": "dp2xd2", "status": "compiled"}


# -- the form and the texts (Qt-free) ------------------------------------------------------------------


def test_the_plan_belongs_to_its_server_and_another_device_clears_it_with_the_reason():
    form = GenerationForm()
    changes = []
    form.changed.connect(changes.append)
    form.set(device=SERVER)
    form.use_xla_plan("dp2xd2", SERVER, origin="Plan view")
    assert (form.xla_plan, form.xla_plan_origin, form.xla_plan_cleared) == ("dp2xd2", "Plan view", "")
    assert form.to_request().xla_plan == "dp2xd2" and changes[-1] == "xla_plan"
    with pytest.raises(ValueError, match="is not a plan name"):
        form.use_xla_plan("dp2x", SERVER)
    form.set(device="cpu")
    assert form.xla_plan == "" and form.to_request().xla_plan == ""
    assert (
        form.xla_plan_cleared
        == "Plan dp2xd2 cleared: it was for the server tpu-vm:8765; the next run uses one device."
    )
    form.set(device=SERVER)  # back on its server: the note no longer says "it was for" the server in use
    assert form.xla_plan == "" and form.xla_plan_cleared.startswith(
        "Plan dp2xd2 was cleared when another device was chosen: the next run here uses one device"
    )
    form.set(device="cpu")
    form.clear_xla_plan()  # the panel's x dismisses the note
    assert form.xla_plan_cleared == "" and changes[-1] == "xla_plan"
    form.set(device=SERVER)
    form.set(xla_plan="best")  # by name, as any field: for the device chosen now
    assert form.to_request().xla_plan == "best" and form.xla_plan_device == SERVER


@pytest.mark.parametrize(
    ("details", "row", "problem"),
    [
        (FOUR_DEVICES, COMPILED, ""),
        ({**FOUR_DEVICES, "xla_device_count": 8}, {"plan": "dp2xd4", "status": "compiled"}, ""),
        ({}, COMPILED, "This server runs torch, not XLA"),
        ({"xla_devices": FOUR_DEVICES["xla_devices"][:1]}, COMPILED, "This XLA server has 1 device"),
        (FOUR_DEVICES, None, "Select a plan in the table"),
        (FOUR_DEVICES, {"plan": "d8", "status": "pruned"}, "d8 was pruned: only a compiled plan can run"),
        (FOUR_DEVICES, {"plan": "dp2xd4", "status": "compiled"}, "dp2xd4 needs 8 devices; this server has 4"),
        ({**FOUR_DEVICES, "xla_plans": ["dp2", "d2"]}, COMPILED, "this server does not offer dp2xd2"),
    ],
)
def test_use_this_plan_is_offered_only_where_it_can_run(details, row, problem):
    assert use_plan_problem(details, row).startswith(problem) and bool(problem) == bool(
        use_plan_problem(details, row)
    )


def test_device_count_prefers_the_servers_count_to_its_list():
    assert xla_device_count({**FOUR_DEVICES, "xla_device_count": 8}) == 8
    assert xla_device_count(FOUR_DEVICES) == 4 and xla_device_count(None) == 0


def test_a_next_run_of_another_batch_than_planned_is_warned_of():
    assert batch_mismatch_text({"batch": 2}, 2) == "" and batch_mismatch_text({}, 1) == ""
    assert "Planned for a U-Net batch of 2; the next run's is 1" in batch_mismatch_text({"batch": 2}, 1)


def test_run_details_name_the_plan_placement_and_both_step_times():
    xla = {
        "platform": "cpu",
        "device_kind": "cpu",
        "plan": {
            "requested": "best",
            "name": "dp2xd2",
            "kind": "2-D",
            "mesh": [2, 2, 1],
            "placement": "snake-yx",
            "devices_used": 4,
            "devices_available": 8,
            "topology": "v5e:2x4",
            "predicted_step_ms": 0.0714,
            "prediction": "planner's cheap estimate (jaxpr trace, not compiled)",
            "measured_median_step_ms": 56.78,
            "measured_on": "4 x cpu cpu",
            "decoder": {"devices_used": 4, "axis": "depth", "memory_per_device_bytes": 3 * 1024**2},
            "measured_note": "measured on fake host devices: not comparable to TPU speed",
        },
    }
    assert xla_run_lines(xla) == [
        "XLA plan dp2xd2 (asked: best), 2-D: mesh data 2 \u00d7 depth 2 \u00d7 height 1 on 4 of 8 device(s)",
        "  placement snake-yx on v5e:2x4",
        "  step: predicted 71.4 \u00b5s, measured 56.8 ms (median, 4 x cpu cpu)",
        "  prediction: planner's cheap estimate (jaxpr trace, not compiled)",
        f"  decoder split over 4 devices (axis depth), {format_bytes(3 * 1024**2)} per device",
        "  measured on fake host devices: not comparable to TPU speed",
    ]
    one = {"devices_used": 1, "note": "the latent does not split 4 ways"}
    assert xla_run_lines({"plan": {**xla["plan"], "decoder": one}})[4] == (
        "  decoder on one device: the latent does not split 4 ways"
    )
    assert xla_run_lines({"platform": "tpu", "device_kind": "TPU v5 lite"}) == [
        "XLA: one device (tpu TPU v5 lite), no plan"
    ]


# -- the app against a real XLA server of 4 devices ----------------------------------------------------


@pytest.fixture(scope="module")
def xla_server4(tmp_path_factory):
    # Four fake host devices stand in for a v5e:2x2 slice: plans are costed on it, run on the host CPU.
    serve_args = ("--xla-devices", "4", "--xla-topology", "v5e:2x2")
    with xla_server(tmp_path_factory.mktemp("xla4-models"), *serve_args) as url:
        yield url


@pytest.mark.render
@pytest.mark.skipif(
    importlib.util.find_spec("engine.xla.execution") is None,
    reason="an XLA server runs plans once engine.xla.execution (issue 28, xla-exec) is merged",
)
@pytest.mark.slow
def test_use_this_plan_for_the_next_run(qtbot, generating, registry, xla_server4, screenshot, error_dialogs):
    from engine.backends.local import LocalBackend
    from engine.server import create_app
    from engine.testing import ServerThread

    services, form, panel = generating.services, generating.services.state.form, generating.sampling_panel
    host = services.parent
    services.state.select_model(services.state.model_by_id("tiny-latent"))
    panel.steps_spin.setValue(3)
    panel.guidance_spin.setValue(3.0)  # with guidance, as planned (CFG: the U-Net's batch is 2)
    # Torch settings chosen before connecting (a preset picked with the keyboard) are not sent to the XLA
    # server, which refuses them; the Optimization panel says what runs there instead.
    optimization = generating.optimization_panel
    pick(qtbot, optimization.preset_box, "Fast (GPU)")
    chosen = dict(form.optimization)
    assert chosen and form.to_request().optimization.autocast == "bf16"
    connect_remote(qtbot, generating.remote, xla_server4)
    assert form.to_request().optimization.is_default and form.optimization == chosen
    assert optimization.summary.text().startswith("Runs: float32 XLA programs at XLA precision 'highest'")
    assert "not sent; kept for a torch device" in optimization.summary.text()
    assert not optimization.refused_label.isVisible() and not form.blocked_reason()
    assert not panel.plan_widget.isVisible()
    dialog = open_plan_dialog_of(qtbot, host, generating.remote)
    assert not dialog.use_button.isEnabled() and "Plan first" in dialog.use_button.toolTip()
    assert dialog.topology_box.currentText() == "v5e:2x2"  # the server's own (stand-in) slice first
    dialog.top_spin.setValue(1)
    qtbot.mouseClick(dialog.plan_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.table.rowCount() > 0, timeout=PLAN_TIMEOUT_MS)
    qtbot.waitUntil(lambda: not services.runner.running("plan-on-server"), timeout=PLAN_TIMEOUT_MS)

    # The best row is chosen until the user picks another; a pruned one is not offered, and says why.
    plan = dialog.plan_result["best"]["plan"]
    table = dialog.table
    assert [i.row() for i in table.selectionModel().selectedRows()] == [dialog.best_row()]
    assert dialog.use_button.isEnabled() and f"runs with plan {plan}" in dialog.use_button.toolTip()
    pruned = next(r for r in range(table.rowCount()) if table.item(r, 3).text() == "pruned")
    table.selectRow(pruned)
    assert not dialog.use_button.isEnabled() and "only a compiled plan can run" in dialog.use_button.toolTip()
    table.selectRow(dialog.best_row())
    qtbot.mouseClick(dialog.use_button, Qt.MouseButton.LeftButton)
    assert form.xla_plan == plan and form.to_request().xla_plan == plan
    assert (
        f"uses plan {plan}" in dialog.use_label.text()
        and "Planned for a U-Net batch" not in dialog.use_label.text()
    )
    # The tiny model's step is mostly communication when split: the view says one chip is faster, and how.
    assert dialog.plan_result["speedup"] < 1
    assert "One chip unsplit is " in dialog.use_label.text() and "clears the plan" in dialog.use_label.text()
    assert panel.plan_label.text() == f"{plan} (from Plan view)" and panel.plan_widget.isVisible()
    screenshot(dialog, "plan-view-after-use")
    dialog.hide()
    screenshot(host, "generate-form-with-plan")

    # The next run carries the plan: the server runs it sharded, and the run's details say so.
    qtbot.mouseClick(panel.generate_button, Qt.MouseButton.LeftButton)
    assert generating.wait_ended(qtbot, timeout=180_000) == "finished", error_dialogs
    provenance = services.state.shown.provenance
    assert provenance["request"]["xla_plan"] == plan
    assert OptimizationConfig.from_dict(provenance["request"]["optimization"]).is_default
    record = provenance["xla"]["plan"]
    assert record["name"] == plan and record["devices_available"] == 4
    # Predicted as the Plan view showed it: the same step, placement, and the slice's collectives.
    best = dialog.plan_result["best"]
    assert (record["predicted_step_ms"], record["placement"]) == (best["step_ms"], best["placement"])
    assert best["placed_on"] and f"placed on {best['placed_on']}" in record["prediction"]
    details = generating.session_panel.details.text().replace("\u200b", "")  # less the breaks in long words
    assert f"XLA plan {plan}" in details and f"placement {record['placement']}" in details
    assert f"step: predicted {format_duration_ms(record['predicted_step_ms'])}, measured " in details
    assert "decoder split over" in details or "decoder on one device" in details
    screenshot(host, "run-details-with-plan")

    # By keyboard: Space on the focused x clears the plan, Alt+U in the Plan view sets it again.
    panel.plan_clear_button.setFocus()
    QTest.keyClick(panel.plan_clear_button, Qt.Key.Key_Space)
    assert form.xla_plan == "" and not panel.plan_widget.isVisible()
    assert dialog.use_label.text() == "The plan was cleared: the next run uses one device."
    dialog.show()
    dialog.activateWindow()
    qtbot.waitUntil(dialog.isActiveWindow, timeout=5_000)
    QTest.keyClick(dialog, Qt.Key.Key_U, Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(lambda: form.xla_plan == plan, timeout=5_000)  # a mnemonic animates the click

    # Connecting to another server selects it, and clears the plan with the reason where it was shown.
    with ServerThread(create_app(LocalBackend("cpu", registry), token=TOKEN)) as url:
        connect_remote(qtbot, generating.remote, url)
        assert form.xla_plan == "" and form.to_request().xla_plan == ""
        text = panel.plan_note.text()
        assert (
            text
            == f"Plan {plan} cleared: it was for the server {xla_server4[7:]}; the next run uses one device."
        )
        assert panel.plan_label.text() == "none (one device)" and panel.plan_note.isVisible()
        assert text in host.statusBar().currentMessage()
        # A torch server gets the settings that were kept while the XLA server was chosen.
        assert form.to_request().optimization.autocast == "bf16"
        assert dialog.use_label.text() == text  # the Plan view no longer says the next run uses it
        dialog.hide()
        screenshot(host, "plan-cleared-on-another-server")
        generating.remote.disconnect_action.trigger()
