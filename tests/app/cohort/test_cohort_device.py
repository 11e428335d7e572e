"""The Cohort dialog's device choice: Auto / CPU / CUDA / XLA devices, the XLA device count and plan checked
as they are typed, the torch settings XLA refuses said before Run, and what reaches ``run_cohort``.

The GUI tests drive the dialog as a user does (the keyboard: mnemonics, Tab, typing; Alt+R runs) with
``engine.cohort.run_cohort`` replaced by a recorder: a real Ray cohort on XLA devices has its engine test
(tests/engine/cohort/test_cohort_xla.py). The last test runs one real XLA cohort from the dialog.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QAbstractButton, QApplication, QLabel

from app.cohort.draft import (
    DeviceChoice,
    LocalDevices,
    last_step_seconds,
    parallel_workers,
    step_device_kind,
    torch_settings_problem,
)
from tests.app.keys import type_into

HAS_JAX = importlib.util.find_spec("jax") is not None
NO_GPU_HERE = LocalDevices(cuda_gpus=0, jax=True, tpu=False, cpu_cores=2)


# -- without Qt ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("plan", "devices", "workers", "guidance", "expected"),
    [
        ("dp2x", 8, None, 3.0, "'dp2x' is not a plan name"),
        ("d2 h2", 8, None, 3.0, "is not a plan name"),
        ("dp2xd3", 8, None, 3.0, "8 devices do not split into groups of 6: choose 6, 12, 18"),
        ("best", 8, None, 3.0, "this computer has no TPU"),
        ("dp2", 4, 3, 3.0, "3 workers x 2 devices (plan dp2) need 6 XLA devices; there are 4"),
        (
            "dp2",
            8,
            None,
            1.0,
            "gives it a batch of 1 (guidance 1: no second half): use a plan without a data axis",
        ),
        (
            "dp4",
            8,
            None,
            3.0,
            "splits the U-Net's batch 4 ways, but each cohort volume gives it a batch of 2",
        ),
    ],
)
def test_a_plan_that_cannot_run_says_why(plan, devices, workers, guidance, expected):
    choice = DeviceChoice("xla", devices, plan)
    assert expected in choice.plan_problem(workers, guidance_scale=guidance)


def test_the_engine_group_arithmetic_names_the_workers():
    assert DeviceChoice("xla", 4, "dp2").describe(None, cluster=True).startswith("4 XLA devices in 2 workers")
    assert DeviceChoice("xla", 8, "").plan_problem(None) == ""
    assert DeviceChoice("xla", 8, "d2xh2").plan_problem(None, guidance_scale=1.0) == ""  # no data axis
    assert DeviceChoice("xla", 8, "dp2").plan_problem(None, guidance_scale=3.0) == ""
    assert DeviceChoice("xla", 8, "dp2xd2/cut@2").describe(None) == (
        "8 fake host devices in 2 workers of 4, each volume sharded as plan dp2xd2/cut@2"
    )
    assert (
        DeviceChoice("xla", 3, "").describe(None)
        == "3 fake host devices in 3 workers of 1, each volume on one device"
    )
    # best is chosen on TPU chips: allowed with them here or on a cluster the dialog cannot see.
    assert DeviceChoice("xla", 8, "best").plan_problem(None, tpu=True) == ""
    assert DeviceChoice("xla", 8, "best").plan_problem(None, cluster=True) == ""
    # Ray gives a TPU actor 1, 2, 4 or 8 chips: the engine's rule, as its message.
    assert "Ray gives an actor 1, 2, 4, 8 chips" in DeviceChoice("xla", 6, "dp3").plan_problem(None, tpu=True)


def test_run_options_are_the_engine_keywords():
    assert DeviceChoice("xla", 4, " dp2 ").run_options() == {
        "device": "xla",
        "xla_plan": "dp2",
        "xla_devices": 4,
    }
    assert DeviceChoice("cpu", 4, "dp2").run_options() == {
        "device": "cpu"
    }  # the XLA fields stay in the dialog


def test_torch_settings_are_named_for_xla():
    assert torch_settings_problem({}) == ""
    assert "(bf16+sdpa) are torch settings" in torch_settings_problem(
        {"autocast": "bf16", "attention": "sdpa"}
    )
    assert "allow-slower override" in torch_settings_problem({"allow_slower": True})


def test_the_estimate_counts_what_runs_at_once():
    machine = NO_GPU_HERE
    # 8 fake devices, plan of 2: 4 workers, sharing this computer's 2 cores.
    assert parallel_workers(DeviceChoice("xla", 8, "dp2"), None, machine) == 2
    assert parallel_workers(DeviceChoice("xla", 8, "dp2"), None, LocalDevices(tpu=True, cpu_cores=2)) == 4
    assert parallel_workers(DeviceChoice("xla", 8, "dp2"), None, machine, cluster=True) == 4
    assert parallel_workers(DeviceChoice("xla", 8, "dp2x"), None, machine) == 1  # not a plan: no guess
    gpus = LocalDevices(cuda_gpus=4, cpu_cores=2)
    assert parallel_workers(DeviceChoice("auto"), None, gpus) == 4  # a worker per GPU
    assert parallel_workers(DeviceChoice("cpu"), None, gpus) == 1
    assert step_device_kind(DeviceChoice("auto"), gpus) == "cuda"
    assert step_device_kind(DeviceChoice("auto"), machine) == "cpu"


def test_the_step_time_comes_from_a_volume_made_on_that_kind_of_device():
    volumes = [_Made("xla:cpu:0", [0.4, 0.5, 0.6]), _Made("cpu", [0.1, 0.1]), _Made("cuda:0", [])]
    assert last_step_seconds(volumes) == 0.1
    assert last_step_seconds(volumes, "xla") == 0.5
    assert last_step_seconds(volumes, "cuda") is None  # none measured there: no estimate from another device


class _Made:
    """A session volume as far as the estimate reads it: where it was made and its step times."""

    def __init__(self, device: str, times: list[float]):
        self.provenance = {"device": device, "step_times_s": times}


@pytest.mark.slow
@pytest.mark.skipif(not HAS_JAX, reason="the XLA choice needs the 'xla' extra (jax)")
def test_offering_and_checking_xla_never_starts_jax_in_the_app_process():
    """On a TPU VM the process that starts JAX takes every chip: the dialog finds JAX, checks plans and
    device counts, and leaves JAX to the workers (a fresh process: other tests may have imported it)."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    script = Path(__file__).with_name("child_xla_never_starts_jax.py")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=root, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]


# -- the dialog ------------------------------------------------------------------------------------------
class RecordedRun:
    """Stands in for ``engine.cohort.run_cohort``: keeps what the dialog's worker asked for and returns the
    summary the engine would (the devices and groups of the engine's arithmetic)."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, spec, root, **options):
        from engine.cohort.runner import CohortSummary
        from engine.cohort.xla_groups import device_groups

        self.calls.append({"spec": spec, "root": root, **options})
        groups = None
        if options.get("device") == "xla":
            groups = device_groups(
                0, plan=options["xla_plan"], workers=options["workers"], devices=options["xla_devices"]
            )
        return CohortSummary(
            Path(root), "cohort-id", spec.count, spec.count, 0, 0, spec.count, 1.0,
            groups.groups if groups else 1, 1, options.get("device", "auto"),
            devices=groups.devices if groups else 0,
            device_groups=groups.groups if groups else 1,
            xla_plan=groups.plan if groups else "",
        )  # fmt: skip


@pytest.fixture
def recorded_run(monkeypatch):
    import engine.cohort

    run = RecordedRun()
    monkeypatch.setattr(engine.cohort, "run_cohort", run)  # where cohort_worker imports it from
    return run


def _open_dialog(qtbot, cohort, select_model: bool = True):
    """Generate > Cohort... over the tiny model, 3 steps, guidance 3 (the U-Net's batch is 2: data-parallel
    plans of 2 divide it), set in the Generate panel."""
    if select_model:
        state = cohort.services.state
        state.select_model(state.model_by_id("tiny-latent"))
        panel = _panel(cohort)
        panel.steps_spin.setValue(3)
        panel.guidance_spin.setValue(3.0)
    cohort.action.trigger()
    dialog = cohort.dialog
    qtbot.waitExposed(dialog)
    dialog.activateWindow()
    qtbot.waitUntil(dialog.isActiveWindow, timeout=5_000)
    return dialog


def _panel(cohort):
    """The Generate panel whose form the cohort starts from."""
    from app.panels.sampling_panel import SamplingPanel

    (panel,) = cohort.services.parent.findChildren(SamplingPanel)
    return panel


def _alt(qtbot, dialog, key) -> None:
    qtbot.keyClick(dialog, key, Qt.KeyboardModifier.AltModifier)


def _choose_xla_by_keyboard(qtbot, dialog) -> None:
    """Alt+D to the device box, then Down until XLA devices (a greyed CUDA is skipped)."""
    _alt(qtbot, dialog, Qt.Key.Key_D)
    assert QApplication.focusWidget() is dialog.device_combo
    for _ in range(3):
        if dialog.device_combo.currentData() == "xla":
            break
        qtbot.keyClick(dialog.device_combo, Qt.Key.Key_Down)
    assert dialog.device_combo.currentData() == "xla"


def _type_into(qtbot, dialog, key, widget, text: str) -> None:
    _alt(qtbot, dialog, key)
    edit = widget.lineEdit() if hasattr(widget, "lineEdit") else widget
    assert QApplication.focusWidget() in (widget, edit)
    edit.selectAll()
    qtbot.keyClicks(edit, text)


@pytest.mark.render
@pytest.mark.skipif(not HAS_JAX, reason="the XLA choice needs the 'xla' extra (jax)")
def test_xla_devices_and_a_typed_plan_reach_run_cohort(qtbot, cohort, tmp_path, recorded_run):
    dialog = _open_dialog(qtbot, cohort)
    combo = dialog.device_combo
    cuda = combo.model().item(combo.findData("cuda"))
    import torch

    if torch.cuda.is_available():
        assert cuda.isEnabled()
    else:  # this machine: greyed, and the tooltip says why
        assert not cuda.isEnabled()
        assert combo.itemData(combo.findData("cuda"), Qt.ItemDataRole.ToolTipRole) == (
            "No CUDA GPU on this machine (torch sees none)"
        )
    assert not dialog.plan_edit.isVisible()
    _choose_xla_by_keyboard(qtbot, dialog)
    assert dialog.plan_edit.isVisible() and dialog.xla_devices_spin.value() == 8
    assert dialog.xla_devices_note.text() == "off-TPU: fake host CPU devices, for correctness, not speed"
    assert "8 fake host devices in 8 workers of 1, each volume on one device" in dialog.plan_note.text()

    _type_into(qtbot, dialog, Qt.Key.Key_V, dialog.xla_devices_spin, "4")
    _type_into(qtbot, dialog, Qt.Key.Key_P, dialog.plan_edit, "dp2x")
    assert "'dp2x' is not a plan name" in dialog.plan_note.text()
    assert not dialog.run_button.isEnabled() and "not a plan name" in dialog.run_button.toolTip()
    _alt(qtbot, dialog, Qt.Key.Key_R)  # the shortcut does nothing while Run is off
    qtbot.keyClicks(dialog.plan_edit, "d3")  # dp2xd3: a plan, of 6 devices
    assert "4 devices do not split into groups of 6" in dialog.plan_note.text()
    assert not dialog.run_button.isEnabled()
    qtbot.keyClick(dialog.plan_edit, Qt.Key.Key_Backspace)
    qtbot.keyClick(dialog.plan_edit, Qt.Key.Key_Backspace)
    qtbot.keyClick(dialog.plan_edit, Qt.Key.Key_Backspace)
    assert dialog.plan_edit.text() == "dp2"
    assert dialog.plan_note.text() == "4 fake host devices in 2 workers of 2, each volume sharded as plan dp2"
    assert dialog.run_button.isEnabled()
    assert recorded_run.calls == []

    dialog.out_edit.setText(str(tmp_path / "cohort"))
    started = []
    dialog.run_button.clicked.connect(lambda: started.append(dialog.status.text()))
    _alt(qtbot, dialog, Qt.Key.Key_R)
    qtbot.waitUntil(lambda: dialog.summary is not None and dialog.job is None, timeout=30_000)
    (call,) = recorded_run.calls
    assert (call["device"], call["xla_plan"], call["xla_devices"], call["workers"]) == ("xla", "dp2", 4, None)
    assert call["address"] is None
    assert "Starting Ray and 2 volumes on 4 fake host devices in 2 workers of 2" in started[0]
    assert dialog.status.text().startswith("Finished: 2/2 volumes")
    assert "on 4 XLA devices in 2 groups of 2 (plan dp2), 2 workers" in dialog.status.text()

    # The choice stays for the session: the dialog is kept, and opened again it still says XLA and dp2.
    dialog.close()
    assert _open_dialog(qtbot, cohort, select_model=False) is dialog
    assert dialog.device_combo.currentData() == "xla" and dialog.plan_edit.text() == "dp2"
    dialog.close()


@pytest.mark.render
def test_with_two_gpus_and_no_jax_cuda_is_offered_and_xla_greyed(qtbot, cohort, monkeypatch, recorded_run):
    import app.cohort.dialog

    machine = LocalDevices(cuda_gpus=2, cuda_name="NVIDIA H100", jax=False, cpu_cores=2)
    monkeypatch.setattr(app.cohort.dialog, "local_devices", lambda: machine)
    made = _Made("cuda:0", [0.5] * 3)  # a volume the session made on a GPU, as the estimate reads it
    cohort.services.state.volumes.append(made)
    dialog = _open_dialog(qtbot, cohort)
    combo = dialog.device_combo
    xla = combo.findData("xla")
    assert not combo.model().item(xla).isEnabled()
    assert "JAX is not installed" in combo.itemData(xla, Qt.ItemDataRole.ToolTipRole)
    assert combo.itemText(combo.findData("cuda")) == "CUDA (NVIDIA H100 \u00d72)"
    # Auto runs a worker per GPU: the estimate takes the GPU volume's step time, 2 volumes at a time.
    assert "0.50 s per step, last measured on CUDA, 2 at a time" in dialog.count_label.text()
    cohort.services.state.volumes.remove(made)
    combo.setFocus()
    for _ in range(3):  # Auto -> CPU -> CUDA, and no further: XLA is greyed
        qtbot.keyClick(combo, Qt.Key.Key_Down)
    assert combo.currentData() == "cuda"
    dialog.out_edit.setText(str(dialog.out_edit.text() + "-cuda"))
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.summary is not None and dialog.job is None, timeout=30_000)
    (call,) = recorded_run.calls
    assert call["device"] == "cuda" and "xla_plan" not in call
    dialog.close()


@pytest.mark.render
def test_cpu_sends_no_xla_options(qtbot, cohort, tmp_path, recorded_run):
    dialog = _open_dialog(qtbot, cohort)
    dialog.device_combo.setFocus()
    qtbot.keyClick(dialog.device_combo, Qt.Key.Key_Down)  # Auto -> CPU
    assert dialog.device_combo.currentData() == "cpu" and not dialog.plan_edit.isVisible()
    dialog.out_edit.setText(str(tmp_path / "cohort"))
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.summary is not None and dialog.job is None, timeout=30_000)
    (call,) = recorded_run.calls
    assert call["device"] == "cpu" and "xla_plan" not in call and "xla_devices" not in call
    assert dialog.status.text().endswith("on CPU, 1 worker")
    dialog.close()


@pytest.mark.render
@pytest.mark.skipif(not HAS_JAX, reason="the XLA choice needs the 'xla' extra (jax)")
def test_torch_settings_are_refused_before_run_unless_left_out(qtbot, cohort, tmp_path, recorded_run):
    dialog = _open_dialog(qtbot, cohort)
    _choose_xla_by_keyboard(qtbot, dialog)
    assert not dialog.torch_note.isVisible() and dialog.run_button.isEnabled()
    dialog.close()
    cohort.services.state.form.set(optimization={"autocast": "bf16"})  # chosen while the dialog was closed
    assert _open_dialog(qtbot, cohort, select_model=False) is dialog
    assert dialog.torch_note.isVisible()
    assert "optimization settings (bf16) are torch settings" in dialog.torch_note.text()
    assert not dialog.run_button.isEnabled()
    assert "Torch optimization settings cannot run on XLA devices" in dialog.run_button.toolTip()
    _alt(qtbot, dialog, Qt.Key.Key_W)  # "Run this cohort without them"
    qtbot.waitUntil(dialog.drop_settings_check.isChecked, timeout=5_000)  # a mnemonic click is animated
    assert dialog.run_button.isEnabled()
    dialog.out_edit.setText(str(tmp_path / "cohort"))
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.summary is not None and dialog.job is None, timeout=30_000)
    (call,) = recorded_run.calls
    assert call["device"] == "xla" and call["spec"].request.optimization.is_default
    assert dialog.draft.request.optimization.autocast == "bf16"  # left out of this XLA run only
    dialog.device_combo.setCurrentIndex(dialog.device_combo.findData("cpu"))
    assert not dialog.torch_note.isVisible()  # torch runs them
    dialog.close()


@pytest.mark.render
@pytest.mark.skipif(not HAS_JAX, reason="the XLA choice needs the 'xla' extra (jax)")
def test_the_plan_view_plan_is_the_default_plan(qtbot, cohort):
    form = cohort.services.state.form
    form.use_xla_plan("dp2xh2", "remote:http://tpu-host:8765", "Plan view")
    dialog = _open_dialog(qtbot, cohort)
    assert dialog.plan_edit.text() == "dp2xh2"
    _choose_xla_by_keyboard(qtbot, dialog)
    assert dialog.plan_note.text() == (
        "8 fake host devices in 2 workers of 4, each volume sharded as plan dp2xh2 (the plan from Plan view)"
    )
    dialog.close()
    form.use_xla_plan("dp2", "remote:http://tpu-host:8765", "Plan view")  # chosen again while it was closed
    assert _open_dialog(qtbot, cohort, select_model=False) is dialog
    assert dialog.plan_edit.text() == "dp2"
    _type_into(qtbot, dialog, Qt.Key.Key_P, dialog.plan_edit, "d2")  # the user's own plan is kept
    dialog.close()
    form.use_xla_plan("dp2xh2", "remote:http://tpu-host:8765", "Plan view")
    _open_dialog(qtbot, cohort, select_model=False)
    assert dialog.plan_edit.text() == "d2"
    dialog.close()


def _cut(dialog) -> list[str]:
    """What scrolls or sticks out sideways: widgets past the scroll area's visible width, single-line labels
    and buttons too narrow for their text (up and down, the dialog scrolls)."""
    content, width = dialog.scroll_area.widget(), dialog.scroll_area.viewport().width()
    found = [f"the content is {content.width()} px wide in {width} px"] if content.width() > width else []
    if dialog.scroll_area.horizontalScrollBar().maximum() > 0:
        found.append("the dialog scrolls sideways")
    for widget in dialog.findChildren(QLabel) + dialog.findChildren(QAbstractButton):
        if not widget.isVisible() or widget.width() <= 0:
            continue
        left = widget.mapTo(content, QPoint(0, 0)).x()
        if left < 0 or left + widget.width() > width:
            found.append(f"{type(widget).__name__} {widget.text()[:30]!r} sticks out at the right")
        single_line = isinstance(widget, QLabel) and widget.text() and not widget.wordWrap()
        drawn = widget.text().replace("&&", "\0").replace("&", "").replace("\0", "&")  # mnemonics not drawn
        if single_line and widget.fontMetrics().horizontalAdvance(drawn) > widget.contentsRect().width():
            found.append(f"label {widget.text()[:30]!r} is cut")
        if isinstance(widget, QAbstractButton) and widget.width() < widget.minimumSizeHint().width():
            found.append(f"button {widget.text()!r} is cut")
    return found


@pytest.mark.render
@pytest.mark.skipif(not HAS_JAX, reason="the XLA choice needs the 'xla' extra (jax)")
def test_at_1024x700_with_xla_and_a_note_nothing_is_cut_and_tab_follows_the_rows(qtbot, cohort):
    cohort.services.state.form.set(optimization={"autocast": "bf16"})
    dialog = _open_dialog(qtbot, cohort)
    _choose_xla_by_keyboard(qtbot, dialog)
    _type_into(qtbot, dialog, Qt.Key.Key_P, dialog.plan_edit, "dp2xd2/cut@2")
    hint = dialog.minimumSizeHint()
    assert hint.width() <= 1024 and hint.height() <= 700, hint
    dialog.resize(1024, 700)
    qtbot.waitUntil(lambda: dialog.width() == 1024 and dialog.height() == 700, timeout=20_000)
    with contextlib.suppress(qtbot.TimeoutError):
        qtbot.waitUntil(lambda: not _cut(dialog), timeout=20_000)  # the layout settles by events
    assert _cut(dialog) == []

    dialog.workers_spin.setFocus()
    order = []
    for _ in range(4):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        order.append(QApplication.focusWidget())
    assert order == [
        dialog.device_combo,
        dialog.xla_devices_spin,
        dialog.plan_edit,
        dialog.drop_settings_check,
    ]
    qtbot.keyClick(dialog.drop_settings_check, Qt.Key.Key_Space)
    qtbot.keyClick(dialog.drop_settings_check, Qt.Key.Key_Tab)
    assert QApplication.focusWidget() is dialog.run_button  # below the fold at 700 px: scrolled into view
    qtbot.waitUntil(lambda: not dialog.run_button.visibleRegion().isEmpty(), timeout=20_000)
    dialog.close()


@pytest.mark.slow
@pytest.mark.render
@pytest.mark.skipif(not HAS_JAX, reason="the XLA choice needs the 'xla' extra (jax)")
def test_a_real_cohort_on_two_fake_xla_devices_with_plan_dp2(qtbot, cohort, tmp_path, screenshot):
    """One volume on a real local Ray runtime: one worker of 2 fake host devices, the U-Net sharded dp2."""
    pytest.importorskip("ray", reason="cohorts need the 'cohort' extra (ray)")
    dialog = _open_dialog(qtbot, cohort)
    type_into(qtbot, dialog.seeds_spin, "1")
    assert dialog.count_label.text().startswith("1 volume \u00b7 ")
    _choose_xla_by_keyboard(qtbot, dialog)
    assert "until a volume has been generated on XLA" in dialog.count_label.text()
    _type_into(qtbot, dialog, Qt.Key.Key_V, dialog.xla_devices_spin, "2")
    _type_into(qtbot, dialog, Qt.Key.Key_P, dialog.plan_edit, "dp2")
    assert dialog.plan_note.text() == "2 fake host devices in 1 worker of 2, each volume sharded as plan dp2"
    dialog.out_edit.setText(str(tmp_path / "cohort"))
    _alt(qtbot, dialog, Qt.Key.Key_R)
    qtbot.waitUntil(lambda: dialog.job is not None, timeout=5_000)  # the mnemonic's click is animated
    qtbot.waitUntil(lambda: dialog.job is None, timeout=300_000)
    summary = dialog.summary
    assert summary is not None, dialog.status.text()
    assert (summary.done, summary.devices, summary.device_groups, summary.xla_plan) == (1, 2, 1, "dp2")
    assert "on 2 XLA devices in 1 group of 2 (plan dp2), 1 worker" in dialog.status.text()
    assert "s per step, last measured on XLA" in dialog.count_label.text()  # this run's step time
    screenshot(dialog, "cohort-xla-finished")

    dialog.done_list.setCurrentRow(0)
    path = Path(dialog.done_list.item(0).data(Qt.ItemDataRole.UserRole))
    qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: any(e.path == path for e in cohort.services.state.volumes), timeout=60_000)
    provenance = next(e for e in cohort.services.state.volumes if e.path == path).provenance
    assert provenance["device"].startswith("xla:cpu")
    assert (provenance["xla"]["plan"]["name"], provenance["xla"]["plan"]["devices_used"]) == ("dp2", 2)
    dialog.close()
