"""The Compare window's quality view on AppServices under Xvfb: compute over seeds, plots, verdicts, cancel."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.app.compare.runs import open_compare

pytestmark = [pytest.mark.render, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture
def registry(tiny_models_dir, tissue_models_dir):
    """The tiny test models and the tiny tissue-map model."""
    from engine.models.registry import ModelRegistry

    return ModelRegistry([tiny_models_dir, tissue_models_dir])


@pytest.fixture
def quality(qtbot, generating):
    window = open_compare(qtbot, generating, "tiny-tissue", 2)
    qtbot.waitExposed(window)
    window.b_box.setCurrentIndex(window.b_box.findData("bf16"))
    bar = window.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(1).center())
    assert window.tabs.currentWidget() is window.quality
    view = window.quality
    view.seeds_spin.selectAll()
    qtbot.keyClicks(view.seeds_spin, "4")
    assert view.seeds_spin.value() == 4
    yield window, view
    window.close()


def _items(plot, kind: str) -> list:
    return [item for item in plot.getPlotItem().items if type(item).__name__ == kind]


@pytest.mark.slow
def test_quality_view_computes_and_shows_distributions_and_verdicts(qtbot, generating, quality):
    window, view = quality
    assert view.schedule_spin.text() == "none"  # no shorter schedule unless asked for
    view.schedule_spin.selectAll()
    qtbot.keyClicks(view.schedule_spin, "1")  # the Generate panel's 2 steps, and a 1-step schedule beside
    assert view.schedule_spin.value() == 1
    with qtbot.waitSignal(view.report_ended, timeout=240_000) as ended:
        qtbot.mouseClick(view.compute_button, Qt.MouseButton.LeftButton)
        assert generating.state.job_running and not view.compute_button.isEnabled()
        assert view.cancel_button.isEnabled()
    assert ended.args == ["finished"]
    qtbot.waitUntil(lambda: not generating.services.runner.jobs, timeout=10_000)
    assert not generating.state.job_running and view.compute_button.isEnabled()
    run = view.run
    assert list(run.reports) == ["B: bf16", "fp32, 1 steps"]
    assert run.seeds == [0, 1, 2, 3] and run.noise_seeds == [4, 5, 6, 7]
    assert run.request["schedules"] == {"fp32, 1 steps": 1} and run.request["steps"] == 2
    assert run.tissue_source == "model"  # the tiny tissue model decodes its own GM/WM/CSF maps
    text = view.verdict_label.text()
    assert "S1 \u00b7 B: bf16" in text and "fp32, seeds B" in text and "seed-to-seed" in text
    assert run.reports["B: bf16"].verdict in text
    assert "S2 \u00b7 fp32, 1 steps" in text and run.reports["fp32, 1 steps"].verdict in text
    # Each setting's time per volume beside its quality, against fp32's by the noise rule.
    speed = run.speed()
    assert set(speed) == {"B: bf16", "fp32, 1 steps"} and all(len(t) == 4 for t in run.times_s.values())
    for pace in speed.values():
        assert f"{pace['median_s']:.2f} s a volume, " in text and pace["verdict"]["verdict"] in text
    assert "fp32, seeds B</b>" in text and f"{speed['B: bf16']['reference_median_s']:.2f} s a volume" in text
    for tissue in ("GM", "WM", "CSF"):  # fp32 A, fp32 B, bf16 and the 1-step schedule over the fp32 band
        plot = view.plots[tissue]
        assert len(_items(plot, "ScatterPlotItem")) == 4 and len(_items(plot, "LinearRegionItem")) == 1
        ticks = plot.getAxis("bottom")._tickLevels[0]
        assert [label for _, label in ticks] == ["fp32 A", "fp32 B", "S1", "S2"]
    curves = _items(view.plots["psnr"], "PlotDataItem")
    assert len(curves) == 2 and all(len(curve.yData) == 4 for curve in curves)
    assert "Done in" in view.progress_label.text()


@pytest.mark.slow
def test_quality_view_cancels_at_the_next_step(qtbot, generating, quality):
    window, view = quality
    qtbot.mouseClick(view.compute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "seed 1" in view.progress_label.text(), timeout=120_000)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    with qtbot.waitSignal(view.report_ended, timeout=60_000) as ended:
        qtbot.keyClick(window, Qt.Key.Key_Escape)  # the Compare window's Esc stops whichever of its jobs runs
        assert (
            view.progress_label.text() == "Cancelling at the next step..."
            and not view.cancel_button.isEnabled()
        )
    assert ended.args == ["cancelled"] and view.progress_label.text() == "Cancelled"
    qtbot.waitUntil(lambda: not generating.services.runner.jobs, timeout=10_000)
    assert not generating.state.job_running and view.run is None
    assert window.run_button.isEnabled()  # the comparison can run again


@pytest.mark.slow
def test_verdicts_name_the_statistic_that_decided_with_n_and_reliability():
    import json

    from app.compare.quality import SHIFT_COLOUR, WITHIN_COLOUR, QualityView
    from tests.engine.quality.phantoms import phantom_run

    data = json.loads(
        json.dumps(phantom_run().to_dict(), default=str)
    )  # as `volsynth quality --json` writes it
    lines = QualityView.verdict_html(data).split("<br>")
    by_setting = {
        name: i
        for i, line in enumerate(lines)
        for name in ("fp32, seeds B", "brighter", "less GM")
        if name in line
    }
    noise, brighter, less_gm = (lines[by_setting[n]] for n in ("fp32, seeds B", "brighter", "less GM"))
    assert f"color:{WITHIN_COLOUR}'><b>PASS</b>" in noise
    assert (
        f"color:{SHIFT_COLOUR}'><b>FAIL</b>" in brighter and f"color:{SHIFT_COLOUR}'><b>FAIL</b>" in less_gm
    )
    # the line under each verdict: the field's measures with intervals and n, the one that decided in bold
    details = lines[by_setting["brighter"] + 1]
    assert "FRD " in details and "n=8 volumes" in details and "(decided)</b>" in details.split("FRD")[1]
    assert "reliable 8/8" in details
    details = lines[by_setting["less GM"] + 1]
    assert "tissue-volume distance" in details and "reliable 4/8 (50 %" in details
    assert details.count("(decided)") >= 2  # the volume distance and the reliability drop
