"""The app states its intended use (research and education, not for diagnosis) in the About box, at first
run and in the User Guide (issue 24, point 12). Before: only the README said it.

The first start of the window (its notice, its first focus, Help > About and Help > User Guide) in the window; the
notice's keys and button on a plain host window, built by the window's own ``add_intended_use_notice``."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QSpinBox, QTextBrowser

from app.core.intended_use import ACKNOWLEDGED_KEY, INTENDED_USE_HEADLINE
from app.window.menus import add_intended_use_notice

pytestmark = pytest.mark.render


def test_first_run_about_and_guide_state_the_intended_use(qtbot, main_window, qt_settings, screenshot):
    """...and the statement has the keyboard at the first start: Enter acknowledges it (it took ~58 Tabs to
    reach "I understand", and neither Enter nor a mnemonic pressed it)."""
    window = main_window
    notice = window.intended_use_notice
    assert notice is not None and notice.isVisible()
    assert "Not for diagnosis" in notice.label.text() and "not a medical device" in notice.label.text()
    button = notice.acknowledge_button
    qtbot.waitUntil(button.hasFocus, timeout=5_000)  # the first focus of a first start
    screenshot(window, "intended-use-first-run")

    seen = {}

    def read_about():
        dialog = QApplication.activeModalWidget()
        seen["text"] = " ".join(b.toPlainText() for b in dialog.findChildren(QTextBrowser))
        screenshot(dialog, "intended-use-about")
        dialog.reject()

    QTimer.singleShot(0, read_about)
    window.window_actions.about.trigger()  # Help > About VolSynth Studio (modal until read_about closes it)
    assert INTENDED_USE_HEADLINE in seen["text"]

    guide = window.help.show_guide  # Help > User Guide, as F1 triggers it
    for action in window.findChildren(type(window.window_actions.about)):
        if action.text().replace("&", "").startswith("User Guide"):
            action.trigger()
            break
    else:
        guide()
    dialog = window.help.guide_dialog
    qtbot.waitExposed(dialog)
    assert INTENDED_USE_HEADLINE in dialog.findChild(QTextBrowser).toPlainText()
    screenshot(dialog, "intended-use-guide")
    dialog.close()

    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    button.setFocus()
    qtbot.waitUntil(button.hasFocus, timeout=5_000)
    qtbot.keyClick(button, Qt.Key.Key_Return)
    assert not notice.isVisible() and qt_settings.value(ACKNOWLEDGED_KEY, False, type=bool)


def test_i_understand_hides_the_statement_for_good_and_the_next_start_has_none(
    qtbot, app_services, qt_settings
):
    """The notice at the top of a window: a click on "I understand" hides it for good, and the next start
    (a window built with the same settings) has no bar."""
    host = app_services.parent
    notice = add_intended_use_notice(host, qt_settings)
    assert notice is not None
    qtbot.waitUntil(notice.isVisible, timeout=5_000)
    qtbot.waitUntil(notice.acknowledge_button.hasFocus, timeout=5_000)  # its first show takes the keyboard
    qtbot.mouseClick(notice.acknowledge_button, Qt.MouseButton.LeftButton)
    assert not notice.isVisible() and qt_settings.value(ACKNOWLEDGED_KEY, False, type=bool)
    assert add_intended_use_notice(host, qt_settings) is None  # built again with these settings: no bar


def test_alt_u_acknowledges_from_anywhere_in_the_window(qtbot, app_services, qt_settings):
    host = app_services.parent
    notice = add_intended_use_notice(host, qt_settings)
    elsewhere = QSpinBox()  # somewhere else in the window
    host.setCentralWidget(elsewhere)
    qtbot.waitUntil(notice.isVisible, timeout=5_000)
    elsewhere.setFocus()
    qtbot.waitUntil(elsewhere.hasFocus, timeout=5_000)
    qtbot.keyClick(elsewhere, Qt.Key.Key_U, Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(lambda: not notice.isVisible(), timeout=5_000)  # a mnemonic animates the click first
    assert qt_settings.value(ACKNOWLEDGED_KEY, False, type=bool)
