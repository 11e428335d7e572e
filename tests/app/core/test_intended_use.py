"""The app states its intended use (research and education, not for diagnosis) in the About box, at first
run and in the User Guide (issue 24, point 12). Before: only the README said it."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QTextBrowser

from app.core.intended_use import ACKNOWLEDGED_KEY, INTENDED_USE_HEADLINE
from tests.app.conftest import _make_window

pytestmark = pytest.mark.render


def test_first_run_about_and_guide_state_the_intended_use(
    qtbot, main_window, registry, qt_settings, screenshot
):
    notice = main_window.intended_use_notice
    assert notice is not None and notice.isVisible()
    assert "Not for diagnosis" in notice.label.text() and "not a medical device" in notice.label.text()
    screenshot(main_window, "intended-use-first-run")

    seen = {}

    def read_about():
        dialog = QApplication.activeModalWidget()
        seen["text"] = " ".join(b.toPlainText() for b in dialog.findChildren(QTextBrowser))
        screenshot(dialog, "intended-use-about")
        dialog.reject()

    QTimer.singleShot(0, read_about)
    main_window.window_actions.about.trigger()  # Help > About VolSynth Studio (modal until read_about closes it)
    assert INTENDED_USE_HEADLINE in seen["text"]

    guide = main_window.help.show_guide  # Help > User Guide, as F1 triggers it
    for action in main_window.findChildren(type(main_window.window_actions.about)):
        if action.text().replace("&", "").startswith("User Guide"):
            action.trigger()
            break
    else:
        guide()
    dialog = main_window.help.guide_dialog
    qtbot.waitExposed(dialog)
    assert INTENDED_USE_HEADLINE in dialog.findChild(QTextBrowser).toPlainText()
    screenshot(dialog, "intended-use-guide")

    qtbot.mouseClick(notice.acknowledge_button, Qt.MouseButton.LeftButton)
    assert not notice.isVisible() and qt_settings.value(ACKNOWLEDGED_KEY, False, type=bool)
    again = _make_window(qtbot, registry, qt_settings, enable_3d=False)  # the next start: no bar
    try:
        assert again.intended_use_notice is None
    finally:
        again.close()


def test_the_first_run_statement_is_acknowledged_from_the_keyboard(qtbot, main_window, registry, qt_settings):
    """It took ~58 Tabs to reach "I understand", and neither Enter nor a mnemonic pressed it."""
    window = main_window
    notice = window.intended_use_notice
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    button = notice.acknowledge_button
    qtbot.waitUntil(button.hasFocus, timeout=5_000)  # the first focus of a first start
    qtbot.keyClick(button, Qt.Key.Key_Return)
    assert not notice.isVisible() and qt_settings.value(ACKNOWLEDGED_KEY, False, type=bool)


def test_alt_u_acknowledges_from_anywhere_in_the_window(qtbot, main_window, qt_settings):
    window = main_window
    notice = window.intended_use_notice
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    window.sampling_panel.seed_spin.setFocus()  # somewhere else in the window
    qtbot.waitUntil(window.sampling_panel.seed_spin.hasFocus, timeout=5_000)
    qtbot.keyClick(window.sampling_panel.seed_spin, Qt.Key.Key_U, Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(lambda: not notice.isVisible(), timeout=5_000)  # a mnemonic animates the click first
    assert qt_settings.value(ACKNOWLEDGED_KEY, False, type=bool)
