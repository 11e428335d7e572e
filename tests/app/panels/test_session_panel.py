"""The Session panel alone: its details wrap long words and scroll (down only) in a narrow dock."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextDocument

from app.panels.session_panel import ZERO_WIDTH_SPACE, SessionPanel, wrap_long_words

pytestmark = pytest.mark.render


def _widest_line(label) -> float:
    """The widest line of the label's rich text laid out at its width (wider: a word the label cuts)."""
    document = QTextDocument()
    document.setDefaultFont(label.font())
    document.setDocumentMargin(0)
    document.setHtml(label.text())
    document.setTextWidth(label.contentsRect().width())
    return document.idealWidth()


def test_long_words_get_break_opportunities_where_letters_and_digits_meet():
    assert wrap_long_words("MNI152NLin2009aSym").split(ZERO_WIDTH_SPACE) == ["MNI152", "NLin2009", "aSym"]
    assert wrap_long_words("space scanner") == "space scanner"  # short words stay whole
    assert all(len(p) <= 14 for p in wrap_long_words("a" * 40).split(ZERO_WIDTH_SPACE))


def test_the_details_wrap_the_space_name_and_scroll_down_in_a_narrow_dock(qtbot, themed_app):
    from app.core.session import AppState
    from app.core.volumes import VolumeEntry

    state = AppState()
    panel = SessionPanel(state)
    qtbot.addWidget(panel)
    panel.resize(150, 260)
    panel.show()
    qtbot.waitExposed(panel)
    data = np.random.default_rng(0).random((8, 9, 7), dtype=np.float32)
    entry = VolumeEntry(
        "brain-t1-demo seed 7", data=data, affine=np.eye(4), kind="generated", space="MNI152NLin2009aSym"
    )
    entry.provenance["anatomy_check"] = {
        "status": "outside",
        "verdict": "outside range: brain volume (GM+WM) 1042 MNI152 mL (range 1200-2157 MNI152 mL)",
        "measures": {"brain_volume_ml": {"value": 1042.0, "unit": "mL", "within": False}},
        "space": "MNI152NLin2009aSym",
        "space_scale": 1.36,
    }
    state.add_volume(entry)
    details, scroll = panel.details, panel.details_scroll
    assert "MNI152" in details.text()
    qtbot.waitUntil(lambda: details.contentsRect().width() > 0, timeout=5_000)
    assert _widest_line(details) <= details.contentsRect().width()
    assert scroll.horizontalScrollBar().maximum() == 0
    bar = scroll.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0, timeout=5_000)
    scroll.setFocus()
    for _ in range(50):  # Page Down to the last line, as a reader does
        if bar.value() == bar.maximum():
            break
        qtbot.keyClick(scroll, Qt.Key.Key_PageDown)
    assert bar.value() == bar.maximum()
