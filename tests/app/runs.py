"""Generation runs started as a user starts them and waited for to their end: in the main window, or on the Generate
side installed on ``AppServices`` (tests/app/generating.py), whose fields are named as the window's."""

from __future__ import annotations

from PySide6.QtCore import Qt

GENERATION_TIMEOUT_MS = 240_000  # a tiny model's run, on a 2-core machine that may be busy


def generate(qtbot, window, *, steps: int | None = None, click: bool = False) -> str:
    """Run the Generate panel's request (``steps`` typed into it first, if given), started with Ctrl+G in the
    window the panel is docked in or, with ``click``, the Generate button; wait for its end and for the runner
    to let go of its job. ``window``: the main window or a ``Generating``.

    Returns the outcome: "finished", "cancelled", "failed" or "abandoned".
    """
    if steps is not None:
        window.sampling_panel.steps_spin.setValue(steps)
    with qtbot.waitSignal(window.generation.ended, timeout=GENERATION_TIMEOUT_MS) as ended:
        if click:
            qtbot.mouseClick(window.sampling_panel.generate_button, Qt.MouseButton.LeftButton)
        else:
            qtbot.keyClick(
                window.sampling_panel.window(), Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier
            )  # Ctrl+G
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=10_000)
    return ended.args[0]
