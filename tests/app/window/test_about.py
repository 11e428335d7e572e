"""Help > About alone: the versions a bug report needs and the selected model's card."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QTabWidget

pytestmark = pytest.mark.render


def test_about_dialog_lists_versions_and_model_card(qtbot, themed_app, registry):
    from app.window.about import AboutDialog

    source = registry.get("tiny-latent")
    dialog = AboutDialog(source)
    qtbot.addWidget(dialog)
    versions = dialog.versions()
    assert versions["PySide6 / Qt"].startswith("6.") and "VolSynth" in versions
    tabs = dialog.findChild(QTabWidget)
    assert tabs.tabText(1) == f"Model card: {source.spec.name}"
    card = tabs.widget(1).toPlainText()
    assert card.strip() and (source.model_card() or card == "This model has no model card.")
    assert AboutDialog(None).findChild(QTabWidget).tabText(1) == "Model card"
