"""The menu bar (app/window/menus.py and the entries features add): one mnemonic per letter in every menu, so that
Alt+letter and a menu's letter keys reach one entry each (Get Models and Disconnect both answered D)."""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMenu

pytestmark = pytest.mark.render


def mnemonic(text: str) -> str | None:
    """The letter a menu text underlines ("Get Mo&dels..." -> "d"; "R&&D" has none)."""
    found = re.search(r"&(.)", text.replace("&&", ""))
    return found.group(1).lower() if found else None


def duplicate_mnemonics(menu, path: str) -> list[str]:
    """Every letter two entries of ``menu`` (a QMenu or the QMenuBar) or of its submenus share, one line each."""
    found, letters = [], {}
    for action in menu.actions():
        if action.isSeparator():
            continue
        sub = action.menu()
        text = sub.title() if sub is not None else action.text()
        letter = mnemonic(text)
        if letter:
            letters.setdefault(letter, []).append(text)
        if sub is not None:
            found += duplicate_mnemonics(sub, f"{path} > {text.replace('&', '')}")
    found += [f"{path}: {letter!r} in {texts}" for letter, texts in letters.items() if len(texts) > 1]
    return found


def test_mnemonic_finds_the_underlined_letter():
    assert mnemonic("Get Mo&dels...") == "d" and mnemonic("R&&D") is None and mnemonic("&Quit") == "q"


def test_no_menu_has_two_entries_on_one_letter(main_window):
    window = main_window
    problems = duplicate_mnemonics(window.menuBar(), "menu bar")
    # Menus not on the bar (a tool bar button's, a context menu built up front) keep the rule too.
    on_bar = {id(a.menu()) for a in window.menuBar().actions() if a.menu() is not None}
    for menu in window.findChildren(QMenu):
        if id(menu) not in on_bar and menu.parent() is not None:
            problems += duplicate_mnemonics(menu, menu.title().replace("&", "") or menu.objectName())
    assert problems == []


def test_alt_v_then_l_opens_the_layout_menu(qtbot, main_window):
    """View's L opens Layout at once; while Left/Right Convention shared it, L only moved between the two."""
    window = main_window
    layout_menu = window.viewer_toolbar.layout_menu
    qtbot.keyClick(window, Qt.Key.Key_V, Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(window.services.menus.view.isVisible, timeout=5_000)
    qtbot.keyClick(window.services.menus.view, Qt.Key.Key_L)
    qtbot.waitUntil(layout_menu.isVisible, timeout=5_000)
    layout_menu.close()
    window.services.menus.view.close()
