"""Screenshots of the real window (3D included) for people to look at: $VOLSYNTH_SCREENSHOTS/*.png
(a temporary folder when it is not set)."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QFileDialog

pytestmark = pytest.mark.render


@pytest.mark.slow
def test_screenshots_fresh_generation_and_finished_volume(
    qtbot, window_3d, screenshot, mni_t1, error_dialogs, monkeypatch, tmp_path
):
    window = window_3d
    shots = [screenshot(window, "01-fresh-start")]

    # mid-generation, with the x0 preview in the slice views
    window.state.select_model(window.state.model_by_id("tiny-latent"))
    window.sampling_panel.steps_spin.setValue(300)
    window.sampling_panel.generate_button.click()
    with qtbot.waitSignal(window.generation.preview_drawn, timeout=60_000):
        pass
    qtbot.waitUntil(lambda: window.state.progress.steps_per_second is not None, timeout=10_000)
    qtbot.wait(300)
    assert window.state.shown.kind == "preview"
    shots.append(screenshot(window, "02-mid-generation-preview"))
    window.generation.cancel_action.trigger()  # Generate > Cancel Generation
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=30_000)

    # a finished volume in 3D and slices: a real T1 so the picture means something
    with qtbot.waitSignal(window.volume_opened, timeout=30_000):
        window.open_path(mni_t1)
    view3d = window.viewer.view3d
    assert view3d.render_count > 0
    shots.append(screenshot(window, "03-volume-mri-grey"))
    for preset, name in (("MIP", "04-volume-mip"), ("Iso-surface", "05-volume-iso")):
        window.state.set_render_preset(preset)
        shots.append(view3d.save_screenshot(shots[0].parent / f"{name}-3d.png"))
    window.state.set_render_preset("MRI grey")
    for path in shots:
        assert path.is_file() and path.stat().st_size > 10_000

    # File > Save 3D Screenshot...: the file asked for is written and said; one that cannot be written is an error
    (tmp_path / "a-file").write_text("not a folder")
    targets = iter([tmp_path / "scan-3d.png", tmp_path / "a-file" / "scan-3d.png"])
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args, **kwargs: (str(next(targets)), ""))
    with qtbot.waitSignal(view3d.screenshot_saved, timeout=30_000):
        window.window_actions.screenshot.trigger()
    assert (tmp_path / "scan-3d.png").stat().st_size > 10_000
    assert window.statusBar().currentMessage() == f"Saved {tmp_path / 'scan-3d.png'}"
    window.window_actions.screenshot.trigger()
    assert [title for title, _ in error_dialogs] == ["Cannot save screenshot"]
