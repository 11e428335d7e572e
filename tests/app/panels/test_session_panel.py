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


def test_the_check_of_a_small_asked_brain_says_its_space_and_why_it_is_flagged(
    qtbot, themed_app, tiny_models_dir, tissue_models_dir
):
    """Asked for 1000 mL (the slider offers it), the check said "⚠ outside range: brain volume (GM+WM) 1042 mL
    (range 1200-2157 mL)" and "brain ≈ 764 mL in native terms": which mL, and why flag what was offered?"""
    from app.core.session import AppState
    from app.core.volumes import VolumeEntry
    from engine.anatomy.checks import AnatomyCheck, Measure
    from engine.anatomy.norms import ranges_for, space_scale
    from engine.models.registry import ModelRegistry

    space = "MNI152NLin2009aSym"
    state = AppState()
    state.set_models(ModelRegistry([tiny_models_dir, tissue_models_dir]).list(), preferred="tiny-tissue")
    panel = SessionPanel(state)
    qtbot.addWidget(panel)
    panel.resize(360, 700)
    panel.show()
    qtbot.waitExposed(panel)
    norm = ranges_for(space)["brain_volume_ml"]
    measure = Measure(norm.name, norm.label, 1042.0, norm.unit, norm.low, norm.high, norm.source, space)
    check = AnatomyCheck("outside", f"outside range: {measure.text()}", measures=(measure,), space=space)
    provenance = {
        "model": {"id": "tiny-tissue"},
        "space": space,
        "conditioning": {"brain_volume": 1000.0, "ventricle_volume": 25.0},
        "anatomy_check": check.to_dict(),
    }
    data = np.random.default_rng(0).random((8, 9, 7), dtype=np.float32)
    state.add_volume(
        VolumeEntry("asked 1000", data=data, affine=np.eye(4), kind="generated", provenance=provenance)
    )
    text = panel.details.text().replace(ZERO_WIDTH_SPACE, "").replace("&#8203;", "")
    native = 1042 / space_scale(space)
    assert (
        "anatomy check: \u26a0 outside range: brain volume (GM+WM) 1042 MNI152 mL (range 1201-2156 MNI152 mL; "
        f"native {native:.0f} mL, range 881-1582 mL)" in text
    )
    assert "brain 1042 MNI152 mL (!)" in text
    assert f"volumes in MNI152 mL ({space}: a brain there is \u00d7 " in text
    assert f"brain \u2248 {native:.0f} mL native" in text
    # Why it is flagged: it was asked for below the adult range (the ventricles asked for are within it).
    assert (
        "asked for brain volume 1000 MNI152 mL: below the adult range (1201-2156 MNI152 mL, 881-1582 mL "
        "native, Matsumae 1996): the anatomy check flags such a brain" in text
    )
    assert "asked for ventricle volume" not in text


def test_names_in_a_narrow_session_list_keep_their_seed_and_time(qtbot, themed_app):
    """In a narrow Session dock "tiny-latent s… · 02:44:31" and the next volume's name read alike; the model's
    start gives way instead, the seed and time stay whole, and the tooltip holds the whole name. Two generated
    volumes named as a run names them, in a panel as narrow as a narrowed dock."""
    from app.core.session import AppState, default_result_name
    from app.core.volumes import VolumeEntry
    from tests.app.conftest import SCREENSHOTS

    state = AppState()
    panel = SessionPanel(state)
    qtbot.addWidget(panel)
    panel.resize(200, 400)
    panel.show()
    qtbot.waitExposed(panel)
    for seed in (0, 1):
        name = state.unique_name(default_result_name({"model": {"id": "tiny-latent"}}, seed))
        data = np.zeros((16, 24, 16), np.float32)
        state.add_volume(VolumeEntry(name, data=data, affine=np.eye(4), kind="generated", synthetic=True))
    listing = panel.list
    qtbot.waitUntil(lambda: listing.count() == 2 and listing.width() < 220, timeout=5_000)
    delegate = listing.itemDelegate()
    shown = [delegate.shown_text(listing.model().index(row, 0)) for row in range(2)]
    names = [listing.item(row).text() for row in range(2)]
    for row, (text, name) in enumerate(zip(shown, names, strict=True)):
        tail = name[name.rfind(" seed ") :]
        assert text != name and text.startswith("\u2026") and text.removesuffix(" *").endswith(tail), text
        assert listing.fontMetrics().horizontalAdvance(text) < listing.viewport().width()
        assert listing.item(row).toolTip().startswith(name)
    assert shown[0] != shown[1]
    listing.grab().save(str(SCREENSHOTS / "session-narrow-names.png"))
