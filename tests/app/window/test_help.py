"""Help menu under Xvfb: the shortcuts list comes from the window's real actions, F1 opens the user guide."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QApplication

from app.window.help import VIEWER_KEYS, action_shortcuts
from tests.app.conftest import SCREENSHOTS

pytestmark = pytest.mark.render


def _menu_action(window, menu_title: str, text: str) -> QAction:
    for top in window.menuBar().actions():
        if top.menu() is not None and top.menu().title().replace("&", "") == menu_title:
            for action in top.menu().actions():
                if action.text().replace("&", "") == text:
                    return action
    raise AssertionError(f"no {menu_title} > {text}")


def _activate(qtbot, window) -> None:
    window.activateWindow()  # window-wide shortcuts fire only in the active window
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)


def _native(sequence) -> str:
    return QKeySequence(sequence).toString(QKeySequence.SequenceFormat.NativeText)


def test_shortcuts_list_is_read_from_the_windows_actions(qtbot, main_window, screenshot):
    action = _menu_action(main_window, "Help", "Keyboard Shortcuts")
    action.trigger()
    dialog = main_window.help.shortcuts_dialog
    qtbot.waitExposed(dialog)
    listed = {(row.keys, row.what) for row in dialog.rows}
    # Every action with a shortcut anywhere in the window is listed with its current keys.
    for candidate in main_window.findChildren(QAction):
        keys = ", ".join(_native(s) for s in candidate.shortcuts() if not s.isEmpty())
        if keys and candidate.text():
            assert (keys, candidate.text().replace("&", "")) in listed
    assert (_native(QKeySequence.StandardKey.Save), "Save") in listed
    assert ("Ctrl+Shift+S", "Save As NIfTI...") in listed
    assert ("Left drag", "Rotate the volume") in listed and ("Right drag or wheel", "Zoom") in listed
    assert ("Ctrl+Shift+G", "Compare Settings...") in {(r.keys, r.what) for r in dialog.rows}
    assert any(row.where == "Slice views" and row.keys == "Home / End" for row in dialog.rows)
    assert any(row.where == "Compare Settings window" for row in dialog.rows)
    shown = dialog.table.rowCount()
    assert shown == len(dialog.rows) and dialog.table.item(0, 0).text() == dialog.rows[0].keys
    dialog.move(20, 20)
    dialog.resize(680, 940)  # tall enough for the screenshot to show the slice views' keys too
    qtbot.waitUntil(lambda: dialog.height() >= 900, timeout=5_000)
    screenshot(dialog, "help-shortcuts")

    # A shortcut changed (or added) after start-up shows the next time the list opens: it cannot go stale.
    main_window.window_actions.open_model.setShortcut(QKeySequence("Ctrl+Alt+M"))
    dialog.close()
    _activate(qtbot, main_window)
    qtbot.keyClick(main_window, Qt.Key.Key_Slash, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    assert ("Ctrl+Alt+M", "Open Model Folder...") in {(r.keys, r.what) for r in dialog.rows}

    # Typing in the filter keeps the matching rows only.
    qtbot.keyClicks(dialog.filter_edit, "compare")
    visible = dialog.visible_rows()
    assert visible and all("compare" in f"{r.keys} {r.what} {r.where}".lower() for r in visible)
    assert len(visible) < len(dialog.rows)
    dialog.close()


def test_f1_opens_the_user_guide_with_the_folders_of_this_machine(qtbot, main_window, tmp_path):
    from app.core.recovery import default_recovery_dir
    from engine.vault.store import default_vault_path

    _activate(qtbot, main_window)
    qtbot.keyClick(main_window, Qt.Key.Key_F1)
    dialog = main_window.help.guide_dialog
    assert dialog is not None
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    text = dialog.browser.toPlainText()
    for expected in (
        str(default_recovery_dir()),
        str(default_vault_path()),
        main_window.settings.fileName(),
        "Generate panel",
        "Session list",
        "Metrics",
        "Vault",
        "Compare Settings",
    ):
        assert expected in text
    assert str(tmp_path) in str(default_recovery_dir())  # the test's own data folder, not the user's
    generate_keys = next(r.keys for r in action_shortcuts(main_window) if r.what == "Generate")
    assert f"Generate ({generate_keys})" in text  # keys in the guide are read from the actions too
    assert "[[" not in text
    dialog.close()


def test_every_listed_viewer_key_is_handled_by_a_slice_view(qtbot, main_window):
    """VIEWER_KEYS cannot drift from the slice view: a key the view ignores fails here."""
    import numpy as np

    from app.core.volumes import VolumeEntry

    data = np.random.default_rng(0).random((12, 14, 10), dtype=np.float32)
    main_window.state.add_volume(VolumeEntry(name="keys", data=data, affine=np.eye(4), kind="opened"))
    view = main_window.viewer.axial
    qtbot.waitUntil(lambda: view.current_pixels() is not None, timeout=30_000)
    names = {
        "Up": Qt.Key.Key_Up,
        "Page Up": Qt.Key.Key_PageUp,
        "Down": Qt.Key.Key_Down,
        "Page Down": Qt.Key.Key_PageDown,
        "Home": Qt.Key.Key_Home,
        "End": Qt.Key.Key_End,
        "+": Qt.Key.Key_Plus,
        "=": Qt.Key.Key_Equal,
        "-": Qt.Key.Key_Minus,
        "_": Qt.Key.Key_Underscore,
        "0": Qt.Key.Key_0,
    }
    for keys, _ in VIEWER_KEYS:
        for name in keys.split(" / "):
            event = QKeyEvent(QEvent.Type.KeyPress, names[name], Qt.KeyboardModifier.NoModifier, name)
            QApplication.sendEvent(view, event)
            assert event.isAccepted(), f"the slice view ignores {name!r}, which Help lists"


def test_the_user_guide_covers_the_newer_tasks_and_finds_words_as_they_are_typed(qtbot, main_window):
    _activate(qtbot, main_window)
    qtbot.keyClick(main_window, Qt.Key.Key_F1)
    dialog = main_window.help.guide_dialog
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    text = dialog.browser.toPlainText()
    for section in (
        "Side by side (A | B)",
        "Presets and Measure now",
        "Model folders",
        "Cohorts",
        "Plan view",
        "--device xla",
        "NV-Generate-MR-Brain (MAISI)",
        "Tissue maps",
        "Anatomy check",
        "MNI152 mL",
        "Get Models",
        "Step caching",
        "cache:k3-l1-f",
        "Quality over Seeds",
        "Declare A MNI152",
    ):
        assert section in text, section
    keys = {r.what: r.keys for r in action_shortcuts(main_window)}
    assert (
        f"Cohorts ({keys['Cohort...']})" in text
        and f"Side by side (A | B) ({keys['Side by side (A | B)']})" in text
        and f"Tissue maps ({keys['Compute Tissue Maps']})" in text
    )
    # The search field has the keyboard when the guide opens: typing finds the first match, Enter the next.
    qtbot.waitUntil(dialog.search_edit.hasFocus, timeout=5_000)
    qtbot.keyClicks(dialog.search_edit, "crosshair")
    first = dialog.browser.textCursor().selectionStart()
    assert dialog.browser.textCursor().selectedText().lower() == "crosshair"
    count = text.lower().count("crosshair")
    assert count >= 2 and dialog.search_label.text() == f"1 of {count}"
    qtbot.keyClick(dialog.search_edit, Qt.Key.Key_Return)
    assert dialog.isVisible(), "Enter in the search field closed the guide"
    assert dialog.browser.textCursor().selectionStart() > first
    # Which match this is, and the match shown with what follows it, not on the last line in view.
    assert dialog.search_label.text() == f"2 of {count}"
    viewport = dialog.browser.viewport().height()
    assert 0 <= dialog.browser.cursorRect().top() < viewport // 2
    dialog.grab().save(str(SCREENSHOTS / "guide-search.png"))
    # Commands read as code, not with Markdown's backticks.
    assert "`" not in text and "use volsynth bench" in text
    qtbot.keyClicks(dialog.search_edit, "zzz")
    assert dialog.search_label.text() == "Not in the guide"
    dialog.close()
