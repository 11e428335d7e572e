"""The one generator relay (engine.api.relay): progress in order, cancel and errors close, result returned."""

from __future__ import annotations

import pytest

from engine.api import Progress, drive, relay, run


class Job:
    """A sampling-like generator that records how it ended."""

    def __init__(self, steps: int = 3, fail_at: int | None = None, result="done") -> None:
        self.steps, self.fail_at, self.result = steps, fail_at, result
        self.started = False
        self.closed = False
        self.finished = False
        self.advanced = 0

    def __call__(self):
        self.started = True
        try:
            for step in range(1, self.steps + 1):
                if step == self.fail_at:
                    raise RuntimeError(f"broke at {step}")
                self.advanced = step
                yield Progress("denoise", step, self.steps, 0.0, f"step {step}")
            self.finished = True
            return self.result
        except GeneratorExit:
            self.closed = True
            raise


def test_drive_relays_progress_in_order_and_returns_the_stop_iteration_value():
    job = Job(steps=4, result={"volumes": 1})
    seen = []
    assert drive(job(), on_progress=seen.append) == {"volumes": 1}
    assert [p.step for p in seen] == [1, 2, 3, 4]
    assert job.finished and not job.closed


def test_drive_cancel_closes_the_generator_at_the_next_step_boundary():
    job = Job(steps=10)
    seen = []
    result = drive(job(), on_progress=seen.append, should_stop=lambda: len(seen) >= 2)
    assert result is None
    assert [p.step for p in seen] == [1, 2]
    assert job.advanced == 2  # not one step further
    assert job.closed and not job.finished


def test_drive_stopped_before_it_starts_runs_nothing():
    job = Job()
    assert drive(job(), should_stop=lambda: True) is None
    assert not job.started


def test_an_exception_in_the_progress_callback_closes_the_generator():
    job = Job(steps=5)

    def on_progress(progress):
        if progress.step == 2:
            raise ValueError("the listener broke")

    with pytest.raises(ValueError, match="listener"):
        drive(job(), on_progress=on_progress)
    assert job.closed and job.advanced == 2


def test_an_exception_inside_the_generator_propagates_and_the_generator_is_closed():
    job = Job(steps=5, fail_at=3)
    gen = job()
    seen = []
    with pytest.raises(RuntimeError, match="broke at 3"):
        drive(gen, on_progress=seen.append)
    assert [p.step for p in seen] == [1, 2]
    assert gen.gi_frame is None  # finished: nothing left open


def test_run_is_drive_under_its_old_name():
    job = Job(steps=3)
    seen = []
    assert run(job(), seen.append) == "done"
    assert len(seen) == 3
    job = Job(steps=3)
    assert run(job(), seen.append, lambda: True) is None
    assert not job.started  # asked before the first step


def test_relay_maps_events_and_returns_the_inner_result():
    job = Job(steps=3, result=42)

    def outer():
        value = yield from relay(job(), lambda p: [p.step, -p.step])
        return value * 2

    events = []
    assert drive(outer(), on_progress=events.append) == 84
    assert events == [1, -1, 2, -2, 3, -3]


def test_relay_without_a_mapping_yields_the_events_as_they_are():
    job = Job(steps=2)

    def outer():
        return (yield from relay(job()))

    events = []
    assert drive(outer(), on_progress=events.append) == "done"
    assert [p.step for p in events] == [1, 2]


def test_closing_the_outer_generator_closes_the_relayed_one():
    job = Job(steps=10)
    outer = relay(job())
    next(outer)
    next(outer)
    outer.close()
    assert job.closed and job.advanced == 2


def test_cancelling_a_drive_over_a_relay_closes_both():
    job = Job(steps=10)
    seen = []
    assert drive(relay(job()), on_progress=seen.append, should_stop=lambda: len(seen) == 3) is None
    assert job.closed and job.advanced == 3
