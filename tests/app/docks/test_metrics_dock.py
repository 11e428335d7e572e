"""The Metrics dock: live plots from the telemetry sampler, the no-GPU path, NVML stand-in GPUs, run marks,
and the per-run summary in the provenance and the session list.

GPU plots with data come from ``tests/engine/telemetry/fake_nvml.py`` (a stand-in for ``pynvml`` written from
nvidia-ml-py's documented behaviour) behind a real ``GpuMonitor``; this machine itself has no NVIDIA GPU.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from app.core.display import format_bytes, run_summary_lines
from tests.app.conftest import SCREENSHOTS

render = pytest.mark.render


# -- helpers -------------------------------------------------------------------------------------------


def _save_dock_shot(dock, name):
    """The Metrics dock as drawn (its dock frame included) in the screenshots folder."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    assert dock.parentWidget().grab().save(str(path))
    return path


def _more_points(qtbot, card, curve: str, count: int) -> None:
    """Waits for ``count`` more samples drawn on a card's curve (the samples' clock, not a fixed time)."""
    first = card.points(curve)
    qtbot.waitUntil(lambda: card.points(curve) >= first + count, timeout=20_000)


class WaitsForSamples:
    """A backend whose run ends only once ``sampler`` has taken ``count`` samples since the run began, so the
    run's telemetry summary has samples of its own however fast the machine generates."""

    def __init__(self, inner, sampler, count: int) -> None:
        self.inner, self.sampler, self.count = inner, sampler, count
        self.name = inner.name

    def info(self):
        return self.inner.info()

    def sample(self, request):
        import threading

        latest = self.sampler.latest()
        since = -1 if latest is None else latest.seq
        result = yield from self.inner.sample(request)
        sampled = threading.Event()
        while not sampled.wait(0.01):  # the sampler's thread adds the samples: their count is the condition
            if len(self.sampler.history(after_seq=since)) >= self.count:
                sampled.set()
        return result


@pytest.fixture
def fake_gpus():
    import os

    from tests.engine.telemetry.fake_nvml import FakeGpu, FakeNvml

    gpu = FakeGpu(processes=[(os.getpid(), 3 * 2**30)])
    return FakeNvml([gpu])


@pytest.fixture
def fake_gpu_generating(app_services, fake_gpus):
    """The Generate side on app services whose sampler reads the NVML stand-in (one NVIDIA RTX A6000)."""
    from engine.telemetry import GpuMonitor, LocalCollector, Sampler
    from tests.app.generating import install_generating

    sampler = Sampler(
        collector=LocalCollector(gpu=GpuMonitor(fake_gpus, pcie_interval_s=0), torch_mode="off")
    )
    generating = install_generating(app_services, sampler=sampler)
    yield generating
    app_services.runner.shutdown()
    generating.services.telemetry.stop()
    assert not sampler.running


# -- formatting (no display needed) -----------------------------------------------------------------------


def test_run_summary_lines_without_and_with_a_gpu():
    no_gpu = {
        "duration_s": 4.25,
        "gpu_available": False,
        "gpu_reason": "no NVIDIA GPU: no driver",
        "mean_gpu_util_pct": None,
        "peak_gpu_memory_bytes": None,
        "energy_j": None,
        "cpu": {"mean_cpu_pct": 96.4, "peak_process_rss_bytes": 3 * 2**29},
    }
    assert run_summary_lines(no_gpu) == [
        "telemetry: 4.2 s, no GPU, CPU 96% mean",
        "peak RSS 1.5 GiB, energy n/a",
    ]
    gpu = {
        "duration_s": 12.0,
        "gpu_available": True,
        "mean_gpu_util_pct": 87.0,
        "peak_gpu_memory_bytes": 20 * 2**30,
        "energy_j": 3018.2,
        "cpu": {},
    }
    assert run_summary_lines(gpu) == ["telemetry: 12.0 s, GPU 87% mean", "peak GPU memory 20.0 GiB, 3,018 J"]
    assert format_bytes(None) == "n/a" and format_bytes(512 * 2**20) == "512 MiB"


# -- a dock over a FeedSource: exact values, no timing ---------------------------------------------------


def _sample(t, *, cpu=10.0, util=None, source="server-1"):
    from engine.telemetry import GpuSample, Sample, SystemSample

    gpus = (
        []
        if util is None
        else [
            GpuSample(
                index=0,
                name="NVIDIA H200",
                sm_util_pct=util,
                mem_util_pct=5.0,
                memory_used_bytes=2**30 * 10,
                memory_total_bytes=2**30 * 141,
                temperature_c=40.0,
                power_w=120.0,
                power_limit_w=700.0,
            )
        ]
    )
    return Sample(
        seq=0,
        timestamp=1_700_000_000.0 + t,
        monotonic=t,
        source=source,
        gpu_available=bool(gpus),
        gpu_reason=None if gpus else "no NVIDIA GPU: the server has none",
        driver_version="570.1",
        gpus=gpus,
        system=SystemSample(
            cpu_pct_per_core=[cpu - 5, cpu + 5],
            cpu_pct=cpu,
            ram_used_bytes=2**30 * 8,
            ram_total_bytes=2**30 * 32,
            process_rss_bytes=2**29,
            process_cpu_pct=cpu,
        ),
    )


@render
def test_dock_over_a_feed_source_plots_exact_values_and_marks(qtbot, themed_app):
    from app.docks.metrics_dock import MetricsDock
    from engine.telemetry import FeedSource

    source = FeedSource()
    dock = MetricsDock(source)
    qtbot.addWidget(dock)
    dock.resize(360, 760)
    assert not dock.refresh()  # hidden: nothing fetched or drawn
    dock.show()
    qtbot.waitExposed(dock)
    assert not dock.refresh() and not dock.plots_built  # no samples yet

    for t in range(0, 200):  # 200 s at 1 Hz: more than the 2-minute window
        source.feed(_sample(float(t), cpu=float(t % 50)))
    assert dock.refresh()
    cpu = dock.cards["cpu"]
    x, y = cpu.curves["cpu"].getData()
    assert x[-1] == 0 and x[0] <= -dock.window_s and len(x) <= dock.window_s + 3
    assert y[-1] == 199 % 50
    assert "49%" in cpu.value_label.text() and cpu.title_label.text() == "CPU (% of 2 cores)"
    assert (
        dock.gpu_warning.isVisible()
        and dock.gpu_warning.text() == "No GPU charts (no NVIDIA GPU: the server has none)"
    )
    # Which machine the charts are of is said first: here the engine server, not this computer.
    assert dock.device_label.text().startswith("Charting <b>the server server-1</b>")
    assert not dock.cards["gpu_util"].isVisible()

    # the server gains a GPU: the GPU cards appear and the warning goes
    source.feed(_sample(200.0, util=75.0))
    source.feed(_sample(201.0, util=25.0))
    assert dock.refresh()
    assert dock.cards["gpu_util"].isVisible() and not dock.gpu_warning.isVisible()
    assert "NVIDIA H200" in dock.device_label.text() and "570.1" in dock.device_label.text()
    assert "SM <b>25%</b>" in dock.cards["gpu_util"].value_label.text()
    assert dock.cards["gpu_util"].points("gpu0.sm") == 2
    assert "10.0</b> / 141 GiB" in dock.cards["gpu_memory"].value_label.text()

    # run marks sit on the samples' clock: the summary's times, not this machine's
    dock.add_run_start("run-1")
    summary = {
        "run_id": "run-1",
        "started_at": 1_700_000_000.0 + 190.0,
        "ended_at": 1_700_000_000.0 + 200.5,
        "duration_s": 10.5,
        "gpu_available": True,
        "mean_gpu_util_pct": 50.0,
        "peak_gpu_memory_bytes": 2**30 * 10,
        "energy_j": 1260.0,
        "cpu": {},
    }
    dock.add_run_end("run-1", "finished", summary)
    assert dock.refresh()  # marks changed: redrawn without a new sample
    lines = dock.cards["gpu_util"].mark_lines
    assert lines[("run-1", "start")].value() == pytest.approx(-11.0)
    assert lines[("run-1", "end")].value() == pytest.approx(-0.5)
    assert ("run-1", "end") in dock.cards["memory"].mark_lines
    assert dock.run_label.text().startswith("Last run (finished): 10.5 s, GPU 50% mean")

    # a longer window shows more history; the marks stay
    dock.window_box.setCurrentIndex(dock.window_box.findData(300.0))
    dock.window_box.activated.emit(dock.window_box.currentIndex())  # as a user's choice arrives
    x, _ = dock.cards["cpu"].curves["cpu"].getData()
    assert dock.window_s == 300 and x[0] == pytest.approx(-201.0)


# -- the main window: what it starts once shown, what it keeps when closed -----------------------------------


@pytest.mark.slow
@render
def test_the_window_starts_its_sampler_once_shown_and_keeps_the_docks_place_and_unsaved_volumes_when_closed(
    qtbot, themed_app, registry, qt_settings, error_dialogs, tmp_path
):
    """The main window's own start and close: the Metrics dock's sampler starts after the window shows and
    stops when it closes; closing keeps the dock's place and the unsaved generated volumes (a clean exit),
    which the next window offers back once it shows. (The recovery itself: tests/app/recovery.)"""
    from PySide6.QtCore import Qt

    from app.core.recovery import RecoveryStore
    from app.core.volumes import VolumeEntry
    from app.window.main_window import MainWindow
    from engine.nifti.volume import Volume

    root = tmp_path / "recovery"

    def new_window():
        return MainWindow(
            registry=registry,
            settings=qt_settings,
            enable_3d=False,
            preload_torch=False,
            recovery=RecoveryStore(root),
        )

    window = new_window()
    qtbot.addWidget(window)
    assert window.sampler is None  # nothing measured (or imported) during start-up
    assert "metricsDock" in window.docks
    assert window.docks["metricsDock"].toggleViewAction() in window.panels_menu.actions()
    window.show()
    qtbot.waitExposed(window)
    assert window.sampler is None
    qtbot.waitUntil(lambda: window.sampler is not None and window.sampler.running, timeout=10_000)
    # tabbed behind the session list on a first start: no plots are built or drawn while hidden
    qtbot.waitUntil(lambda: not window.session_panel.visibleRegion().isEmpty(), timeout=5_000)
    assert not window.metrics_dock.on_screen()
    # Samples go on arriving while the dock is hidden (counted, not waited for by the clock): they are not drawn.
    first = window.sampler.latest()
    since = -1 if first is None else first.seq
    qtbot.waitUntil(lambda: len(window.sampler.history(after_seq=since)) >= 3, timeout=30_000)
    assert not window.metrics_dock.on_screen()
    assert not window.metrics_dock.plots_built and window.metrics_dock.redraw_count == 0
    sampler = window.sampler
    # The dock moved to the bottom: the next window puts it there again.
    window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, window.docks["metricsDock"])
    # A generated volume, never saved: kept on disk while the session runs.
    made = Volume(np.zeros((4, 5, 6), np.float32), np.eye(4), provenance={"seed": 3})
    window.state.add_volume(VolumeEntry("seed 3 \u00b7 unsaved", volume=made, kind="generated"))
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=30_000)
    assert window.recovery_bar.isHidden()  # nothing was left by an earlier session
    window.close()
    assert not sampler.running
    (left,) = RecoveryStore(root).orphans()  # closing is a clean exit that keeps the unsaved volume
    assert left.clean_exit and len(left.volumes) == 1
    second = new_window()
    qtbot.addWidget(second)
    assert second.dockWidgetArea(second.docks["metricsDock"]) == Qt.DockWidgetArea.BottomDockWidgetArea
    assert second.dockWidgetArea(second.docks["sessionDock"]) == Qt.DockWidgetArea.RightDockWidgetArea
    assert second.recovery_bar.isHidden()  # looked for once the window shows, not before
    second.show()
    qtbot.waitExposed(second)
    bar = second.recovery_bar
    assert bar.isVisible() and "1 unsaved generated volume made " in bar.label.text()
    assert "from your last session" in bar.label.text()
    second.close()


# -- the dock beside the Generate panel, on app services --------------------------------------------------


@pytest.mark.slow
@render
def test_live_cpu_plots_and_no_gpu_reason_then_marks_around_a_cancelled_run(qtbot, generating):
    dock = generating.show_metrics(qtbot)
    sampler = generating.services.telemetry.sampler
    latest = sampler.latest()
    if latest.gpu_available:
        pytest.skip("this machine has an NVIDIA GPU; the no-GPU path is covered with the FeedSource")
    cpu = dock.cards["cpu"]
    qtbot.waitUntil(lambda: cpu.points("cpu") >= 3, timeout=10_000)
    _more_points(qtbot, cpu, "cpu", 3)  # live: more points over time
    assert re.search(r"total <b>\d+%</b>.*app <b>\d+%</b>", cpu.value_label.text())
    assert re.fullmatch(r"CPU \(% of \d+ cores?\)", cpu.title_label.text())
    assert re.search(r"[\d.]+</b> / \d+", dock.cards["memory"].value_label.text())
    assert dock.cards["memory"].points("rss") >= 3
    # the reason is shown, the GPU plots are not, and CPU/RAM stay live
    # A note that there is no GPU to chart (nothing is wrong on a CPU machine), of this computer.
    assert dock.gpu_warning.isVisible() and dock.gpu_warning.text() == f"No GPU charts ({latest.gpu_reason})"
    assert dock.device_label.text().startswith("Charting <b>this computer</b>")
    assert not any(
        dock.cards[k].isVisible() for k in ("gpu_util", "gpu_memory", "gpu_power", "gpu_temperature")
    )
    texts = {cpu.value_label.text()}

    def remember(seq):
        texts.add(cpu.value_label.text())

    dock.redrawn.connect(remember)

    # during a generation: a start mark on the plots, then the screenshot (a 1-minute window, so that the
    # few seconds measured here fill more than a sliver of it)
    dock.set_window(60)
    assert cpu.plot_item.viewRange()[0][0] == pytest.approx(-60, abs=1)
    _more_points(qtbot, cpu, "cpu", 8)  # a couple of seconds of samples before the run
    # 1000 steps: long enough on a fast idle machine that the run is still going when checked below
    generating.select("tiny-latent", steps=1000)
    assert generating.generation.start()
    qtbot.waitUntil(lambda: generating.services.state.progress.step >= 3, timeout=60_000)
    qtbot.waitUntil(lambda: any(k[1] == "start" for k in cpu.mark_lines), timeout=5_000)
    qtbot.waitUntil(lambda: dock.run_label.text().startswith("Generating"), timeout=5_000)
    _more_points(qtbot, cpu, "cpu", 4)  # a few more samples on the plots for the screenshot
    path = _save_dock_shot(dock, "06-metrics-dock")
    assert path.stat().st_size > 10_000
    assert len(texts) > 1  # the current values follow the samples

    generating.generation.cancel_action.trigger()  # Generate > Cancel Generation
    assert generating.wait_ended(qtbot) == "cancelled"
    # 10 minutes of history from here on: on a loaded machine the two runs can take more than the 1-minute
    # window, and a start mark that scrolled out of it is not drawn (seen once: 3 lines instead of 4).
    dock.set_window(600)
    kinds = {(m.kind, m.outcome) for m in dock.run_marks}
    assert kinds == {("start", ""), ("end", "cancelled")}
    qtbot.waitUntil(lambda: any(k[1] == "end" for k in cpu.mark_lines), timeout=5_000)
    assert dock.run_label.text().startswith("Last run (cancelled)")
    assert sampler.active_runs() == []


@pytest.mark.slow
@render
def test_finished_run_summary_goes_into_provenance_session_details_and_sidecar(qtbot, generating, tmp_path):
    dock = generating.show_metrics(qtbot)
    sampler = generating.services.telemetry.sampler
    state = generating.services.state
    generating.select("tiny-pixel", steps=3)
    assert generating.generation.start()
    assert generating.wait_ended(qtbot) == "finished"
    entry = state.shown
    telemetry = entry.provenance["telemetry"]
    assert telemetry["duration_s"] > 0 and telemetry["run_id"].startswith("gen-")
    assert telemetry["run_id"] == sampler.run_summary(telemetry["run_id"])["run_id"]
    assert telemetry["gpu_available"] == sampler.latest().gpu_available
    details = generating.session_panel.details.text()
    assert "telemetry: " in details and f"{telemetry['duration_s']:.1f} s" in details
    if not telemetry["gpu_available"]:
        assert "no GPU" in details and "peak RSS" in details
    marks = [(m.run_id, m.kind, m.outcome) for m in dock.run_marks]
    assert marks == [(telemetry["run_id"], "start", ""), (telemetry["run_id"], "end", "finished")]
    end = next(m for m in dock.run_marks if m.kind == "end")
    assert end.timestamp == telemetry["ended_at"]

    # saved with the volume
    target = tmp_path / "out.nii.gz"
    generating.files.save_entry(entry, target)
    qtbot.waitUntil(lambda: not generating.services.runner.jobs, timeout=20_000)
    sidecar = json.loads((tmp_path / "out.json").read_text())
    assert sidecar["telemetry"]["run_id"] == telemetry["run_id"]
    assert sidecar["telemetry"]["duration_s"] == telemetry["duration_s"]

    # a failed run is marked too, and leaves no run open
    generating.select("tiny-pixel", steps=3, device="cuda")  # no CUDA here: fails in the worker
    assert generating.generation.start()
    assert generating.wait_ended(qtbot) == "failed"
    assert dock.run_marks[-1].outcome == "failed" and sampler.active_runs() == []


@pytest.mark.slow
@render
def test_fake_nvml_gpu_plots_device_name_and_gpu_summary(qtbot, fake_gpu_generating, fake_gpus):
    generating = fake_gpu_generating
    dock = generating.show_metrics(qtbot)
    sampler = generating.services.telemetry.sampler
    util = dock.cards["gpu_util"]
    qtbot.waitUntil(lambda: util.points("gpu0.sm") >= 3, timeout=10_000)
    for key, curve in (
        ("gpu_memory", "gpu0.mem_used"),
        ("gpu_power", "gpu0.power"),
        ("gpu_power", "gpu0.power_limit"),
        ("gpu_temperature", "gpu0.temp"),
    ):
        assert dock.cards[key].isVisible() and dock.cards[key].points(curve) >= 1, key
    assert "NVIDIA RTX A6000" in dock.device_label.text() and "550.54.15" in dock.device_label.text()
    assert not dock.gpu_warning.isVisible()
    assert "SM <b>87%</b>" in util.value_label.text()
    assert "20.0</b> / 48 GiB" in dock.cards["gpu_memory"].value_label.text()
    assert "252 W</b> / 300 W" in dock.cards["gpu_power"].value_label.text()
    assert "66 \u00b0C" in dock.cards["gpu_temperature"].value_label.text()
    fake_gpus.gpus[0].util_gpu = 12  # the reading changes: the label follows
    qtbot.waitUntil(lambda: "SM <b>12%</b>" in util.value_label.text(), timeout=5_000)
    _, y = util.curves["gpu0.sm"].getData()
    assert y[-1] == 12 and np.nanmax(y) == 87

    # a screenshot mid-run (the run is cut short), then a short run to the end
    dock.set_window(60)
    generating.select("tiny-pixel", steps=1000)
    assert generating.generation.start()
    qtbot.waitUntil(lambda: generating.services.state.progress.step >= 3, timeout=60_000)
    _more_points(qtbot, util, "gpu0.sm", 3)
    _save_dock_shot(dock, "06b-metrics-dock-nvml-stand-in")
    generating.generation.cancel_action.trigger()  # Generate > Cancel Generation
    assert generating.wait_ended(qtbot) == "cancelled"
    # A run that spans several 4 Hz samples however fast this machine is (a run shorter than one sampling
    # interval has no GPU samples to summarise): it ends once the sampler has taken 4 during it. 10 minutes
    # of history so that the first run's marks do not scroll out of the plots before the count below.
    dock.set_window(600)
    backends = generating.services.backends
    backends._backends["auto"] = WaitsForSamples(backends.get("auto"), sampler, 4)
    generating.select("tiny-pixel", steps=3)
    assert generating.generation.start()
    assert generating.wait_ended(qtbot) == "finished"
    telemetry = generating.services.state.shown.provenance["telemetry"]
    assert telemetry["gpu_available"] and telemetry["mean_gpu_util_pct"] == 12
    assert telemetry["peak_gpu_memory_bytes"] == 20 * 2**30 and telemetry["energy_j"] > 0
    assert telemetry["gpus"][0]["name"] == "NVIDIA RTX A6000"
    details = generating.session_panel.details.text()
    assert "GPU 12% mean" in details and "peak GPU memory 20.0 GiB" in details and " J" in details
    assert [(m.kind, m.outcome) for m in dock.run_marks] == [
        ("start", ""),
        ("end", "cancelled"),
        ("start", ""),
        ("end", "finished"),
    ]
    qtbot.waitUntil(lambda: len(util.mark_lines) == 4, timeout=5_000)


@render
def test_elapsed_counts_whole_seconds_from_the_start_of_the_run(qtbot, themed_app):
    """On the samples' clock (a FeedSource: exact times, no waiting): 0:00 for the first second, not 0:01."""
    from app.docks.metrics_dock import MetricsDock
    from engine.telemetry import FeedSource

    source = FeedSource()
    dock = MetricsDock(source)
    qtbot.addWidget(dock)
    dock.show()
    qtbot.waitExposed(dock)
    for t in range(0, 11):
        source.feed(_sample(float(t)))
    assert dock.refresh()
    dock.add_run_start("run-1")  # at t = 10 on the samples' clock
    for t, shown in ((10.4, "0:00"), (11.0, "0:01"), (12.6, "0:02"), (75.2, "1:05")):
        source.feed(_sample(t))
        dock.refresh()
        assert dock.run_label.text() == f"Generating \u00b7 {shown}"
    # A run whose end never reached the dock (its telemetry failed) does not shift the next run's clock.
    dock.add_run_start("run-2")  # at t = 75.2
    source.feed(_sample(78.5))
    dock.refresh()
    assert dock.run_label.text() == "Generating \u00b7 0:03"


@render
@pytest.mark.parametrize("width", [278, 340])  # the dock at 1024x700, and its default width
def test_legends_and_axes_fit_the_dock(qtbot, themed_app, width):
    from app.docks.metrics_dock import MetricsDock
    from engine.telemetry import FeedSource

    source = FeedSource()
    dock = MetricsDock(source)
    qtbot.addWidget(dock)
    dock.resize(width, 900)
    dock.show()
    qtbot.waitExposed(dock)
    for t in range(0, 60):
        source.feed(_sample(float(t), cpu=40.0, util=60.0))
    assert dock.refresh()
    qtbot.waitUntil(lambda: all(card.width() > 0 for card in dock.cards.values()), timeout=5_000)
    cpu = dock.cards["cpu"]
    # The app's own share next to the machine's: psutil's process CPU (one core = 100 %) over the cores.
    assert "total <b>40%</b>" in cpu.value_label.text() and "app <b>20%</b>" in cpu.value_label.text()
    assert cpu.curves["app_cpu"].getData()[1][-1] == pytest.approx(20.0)
    shown = [card for card in dock.cards.values() if card.isVisible()]
    assert len(shown) == 6  # four GPU cards, CPU, memory

    def clipped() -> list[str]:
        """Labels narrower than their text (a legend or title cut off), once the layouts have settled."""
        return [
            label.text()
            for card in shown
            for label in (card.title_label, card.value_label)
            if label.width() < label.sizeHint().width()
        ]

    qtbot.waitUntil(lambda: not clipped(), timeout=5_000)
    for card in shown:
        for axis in ("left", "bottom"):
            assert card.plot_item.getAxis(axis).style["tickFont"].pointSizeF() >= 8.0
    _save_dock_shot_widget(dock, f"metrics-dock-{width}px")


def _save_dock_shot_widget(widget, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    assert widget.grab().save(str(path))
    return path
