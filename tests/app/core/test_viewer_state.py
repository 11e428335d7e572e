"""The viewer's settings in the Qt-free session model: Custom window, display switches, iso threshold, 4D."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.session import AppState
from app.core.volumes import VolumeEntry


def _entry(data, **kwargs) -> VolumeEntry:
    return VolumeEntry(name="v", data=np.asarray(data, dtype=np.float32), affine=np.eye(4), **kwargs)


def test_custom_preset_returns_to_the_window_set_by_hand():
    state = AppState()
    state.add_volume(_entry(np.arange(1000).reshape(10, 10, 10)))
    state.apply_window_preset("Custom")  # nothing set by hand yet: keeps what is shown, marked Custom
    assert state.window_preset == "Custom"
    state.set_window(300.0, 150.0)
    state.apply_window_preset("Full range")
    assert state.window != (300.0, 150.0)
    state.apply_window_preset("Custom")
    assert state.window == (300.0, 150.0) and state.window_preset == "Custom"
    # a denoising preview's automatic window is not the user's
    state.show_preview(np.zeros((4, 4, 4)), np.eye(4), 1, 10)
    state.set_window(1.0, 0.5, preset="Custom")
    assert state.custom_window == (300.0, 150.0)


def test_display_switches_emit_once_and_only_on_change():
    state = AppState()
    changes = []
    state.display_changed.connect(lambda: changes.append(1))
    state.set_smooth_display(False)
    state.set_smooth_display(False)
    state.set_show_crosshair(False)
    assert changes == [1, 1] and not state.smooth_display and not state.show_crosshair


def test_iso_threshold_in_intensity_units():
    state = AppState()
    assert state.iso_range() is None
    entry = _entry(np.arange(1000).reshape(10, 10, 10))
    state.add_volume(entry)
    low, high = state.iso_range()
    assert (low, high) == pytest.approx((entry.percentile(1.0), entry.percentile(99.9)))
    state.set_iso_threshold(500.0)
    assert state.iso_threshold() == pytest.approx(500.0)
    state.set_iso_threshold(1e9)  # beyond the range: the top of it
    assert state.iso_threshold() == pytest.approx(high)


def test_integer_valued_and_4d_description():
    assert _entry(np.arange(8).reshape(2, 2, 2)).integer_valued
    assert not _entry(np.arange(8).reshape(2, 2, 2) / 3).integer_valued
    entry = _entry(np.zeros((2, 2, 2)), time_points=5, time_index=3)
    assert "4D: time point 3 of 0..4" in entry.describe()
    assert "range -610 .. 30393" in _entry(np.array([-610.0, 30393.0] * 4).reshape(2, 2, 2)).describe()


def test_replace_volume_keeps_the_place_and_shows_the_new_one():
    state = AppState()
    first, old = _entry(np.zeros((4, 4, 4))), _entry(np.ones((4, 4, 4)), time_points=3)
    state.add_volume(first)
    state.add_volume(old)
    new = _entry(np.full((4, 4, 4), 2.0), time_points=3, time_index=2)
    assert state.replace_volume(old, new)
    assert state.volumes == [first, new] and state.shown is new
    assert not state.replace_volume(old, new)  # gone meanwhile: nothing changes
