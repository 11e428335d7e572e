"""engine.metrics.pace: the one rate/ETA rule (CLI progress line, cohort runner, app progress model)."""

from __future__ import annotations

import pytest

from engine.metrics.pace import pace


def test_rate_is_units_per_second_and_eta_the_rest_at_that_rate():
    rate, eta = pace(10, 5.0, 30)
    assert rate == pytest.approx(2.0) and eta == pytest.approx(15.0)


@pytest.mark.parametrize(("done", "elapsed"), [(0, 5.0), (3, 0.0), (-1, 2.0)])
def test_nothing_measured_yet_is_unknown_not_zero(done, elapsed):
    assert pace(done, elapsed, 10) == (None, None)


def test_time_left_is_never_negative():
    assert pace(4, 2.0, -3) == (pytest.approx(2.0), 0.0)


def test_the_cli_progress_line_uses_it():
    import io

    from engine.api import Progress
    from engine.cli._progress import ProgressLine
    from engine.formatting import format_duration

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    clock = iter([0.0, 0.0, 4.0])
    line = ProgressLine(stream=Terminal(), clock=lambda: next(clock))
    line.update(Progress("denoise", 0, 10, 0.0))
    line.update(Progress("denoise", 2, 10, 4.0))
    text = line.stream.getvalue()
    assert f"0.50 steps/s  ETA {format_duration(16.0)}" in text
