"""Compare Settings opened and run as a user does, over the Generate side on ``AppServices``."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt


def open_compare(qtbot, generating, model_id: str, steps: int):
    """Choose ``model_id`` and ``steps`` in the Generate panel and open Compare Settings with Ctrl+Shift+G."""
    generating.select(model_id)
    generating.sampling_panel.steps_spin.setValue(steps)
    qtbot.keyClick(
        generating.host, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )
    window = generating.compare.window
    assert window is not None and window.isVisible()
    return window


def wait_compared(qtbot, window, press: Callable[[], object] | None = None, timeout: int = 120_000) -> str:
    """The outcome of the comparison running in ``window`` (started by ``press``, if given), once the runner
    has let go of its job."""
    with qtbot.waitSignal(window.comparison_ended, timeout=timeout) as blocker:
        if press is not None:
            press()
    qtbot.waitUntil(lambda: not window.services.runner.jobs, timeout=10_000)
    return blocker.args[0]
