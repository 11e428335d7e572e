"""Help > About VolSynth Studio: the versions of everything that matters for a bug report, and the selected
model's card."""

from __future__ import annotations

import platform

import numpy as np
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTabWidget, QTextBrowser, QVBoxLayout, QWidget


class AboutDialog(QDialog):
    """Versions of everything that matters for a bug report, and the selected model's card."""

    def __init__(self, source, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About VolSynth Studio")
        self.resize(720, 560)
        tabs = QTabWidget()
        versions = QTextBrowser()
        versions.setHtml(self.versions_html())
        tabs.addTab(versions, "About")
        card = QTextBrowser()
        card.setOpenExternalLinks(False)
        text = source.model_card() if source is not None else ""
        card.setMarkdown(text or "This model has no model card.")
        tabs.addTab(card, f"Model card: {source.spec.name}" if source is not None else "Model card")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(tabs)
        layout.addWidget(buttons)

    @staticmethod
    def versions() -> dict[str, str]:
        import sys

        import PySide6

        from engine import __version__

        found = {
            "VolSynth": __version__,
            "Python": platform.python_version(),
            "PySide6 / Qt": f"{PySide6.__version__} / {PySide6.QtCore.qVersion()}",
            "numpy": np.__version__,
        }
        for name in ("torch", "monai", "pyvista", "vtk", "nibabel"):
            module = sys.modules.get(name)
            found[name] = getattr(module, "__version__", "?") if module else "not loaded yet"
        found["platform"] = platform.platform()
        return found

    def versions_html(self) -> str:
        rows = "".join(
            f"<tr><td><b>{k}</b></td><td>&nbsp;&nbsp;{v}</td></tr>" for k, v in self.versions().items()
        )
        from app.core.intended_use import INTENDED_USE_HEADLINE, INTENDED_USE_TEXT

        return (
            "<h2>VolSynth Studio</h2>"
            f"<p style='color:#b45309'><b>{INTENDED_USE_HEADLINE}</b></p><p>{INTENDED_USE_TEXT}</p>"
            "<p>Synthesizes 3D brain MRI with diffusion models. "
            "Every generated volume is marked <b>synthetic</b> in its file and provenance record.</p>"
            f"<table>{rows}</table>"
        )
