"""Compare Settings' Repeat: a step-caching row measured for speed and quality, then repeated until the noise
rule can decide, on AppServices under Xvfb."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.app.compare.runs import wait_compared
from tests.app.keys import type_into

pytestmark = [pytest.mark.render, pytest.mark.filterwarnings("ignore::UserWarning")]


def _choose_by_keys(qtbot, box, name: str) -> None:
    """Down arrow until ``name`` is chosen (the box's heading and separator cannot be, so a count of presses
    from the index would miss)."""
    box.setFocus()
    qtbot.waitUntil(box.hasFocus, timeout=5_000)
    for _ in range(box.count()):
        if box.currentData() == name:
            return
        qtbot.keyClick(box, Qt.Key.Key_Down)
    assert box.currentData() == name


def _ended(qtbot, compare, press) -> str:
    return wait_compared(qtbot, compare, press, timeout=180_000)


def _row(table, label: str) -> int:
    return [table.verticalHeaderItem(r).text() for r in range(table.rowCount())].index(label)


@pytest.mark.slow
def test_a_step_caching_row_is_measured_for_speed_and_quality_then_repeated_until_the_rule_decides(
    qtbot, compare
):
    """Before: one run of each, "too few samples ... measure more", and a pointer to `volsynth bench --repeats 3`
    in a terminal the window's users never open."""
    qtbot.waitUntil(compare.isActiveWindow, timeout=5_000)
    _choose_by_keys(qtbot, compare.b_box, "cache:k3-l1-f")
    type_into(qtbot, compare.profile_spin, "0")
    assert not compare.repeat_button.isEnabled()  # nothing to repeat yet
    assert _ended(
        qtbot, compare, lambda: qtbot.mouseClick(compare.run_button, Qt.MouseButton.LeftButton)
    ) == ("finished")
    first = compare.comparison
    summary = compare.summary_label.text()
    # Speed: the whole loop is judged (caching mixes full and cached steps); one run a side cannot decide.
    assert summary.startswith("<b>End to end (sampling loop incl. decode)</b> (step caching mixes")
    assert "press Repeat" in summary and "volsynth bench" not in summary
    # Quality: how far the cached run's volume moved from fp32's, beside it.
    assert f"PSNR {first.psnr_db:.1f} dB" in summary or "identical volumes" in summary
    table = compare.table
    loop = _row(table, "Sampling loop (end to end)")
    assert table.item(_row(table, "Runs"), 0).text() == "1"
    assert table.item(loop, 2).text().endswith("undecided (1 vs 1)")

    # Repeat twice more (typed, then clicked): 3 runs a side, interleaved, and the verdicts count them all.
    assert compare.repeat_button.isEnabled()
    type_into(qtbot, compare.repeat_spin, "2")
    assert _ended(
        qtbot, compare, lambda: qtbot.mouseClick(compare.repeat_button, Qt.MouseButton.LeftButton)
    ) == ("finished")
    repeated = compare.comparison
    assert (
        len(repeated.repeats) == 2 and repeated.psnr_db == first.psnr_db
    )  # the volumes stay the first runs'
    verdict = repeated.verdicts()["end_to_end"]
    assert verdict.samples == (3, 3) and not verdict.too_few
    loop = _row(table, "Sampling loop (end to end) (median of 3)")
    assert table.item(_row(table, "Runs"), 1).text() == "3"
    assert (
        table.item(loop, 2).text().endswith(verdict.verdict) and "(1 vs 1)" not in table.item(loop, 2).text()
    )
    summary = compare.summary_label.text()
    assert verdict.words() in summary and "too few samples" not in summary
    assert "3 runs of each" in compare.progress_label.text()
    assert len(repeated.to_dict()["runs"]["b"]) == 3
