"""Dark theme: Fusion style, a dark palette and the stylesheet in resources/ui/dark.qss."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtWidgets import QApplication

from engine.resources import resource_path

ACCENT = "#3d8fd6"


def apply_dark_theme(app: QApplication) -> None:
    app.setStyle("Fusion")
    palette = QPalette()
    colours = {
        QPalette.ColorRole.Window: "#1b1e23",
        QPalette.ColorRole.WindowText: "#dfe3ea",
        QPalette.ColorRole.Base: "#14171b",
        QPalette.ColorRole.AlternateBase: "#20242a",
        QPalette.ColorRole.ToolTipBase: "#2a2f37",
        QPalette.ColorRole.ToolTipText: "#dfe3ea",
        QPalette.ColorRole.Text: "#dfe3ea",
        QPalette.ColorRole.Button: "#262a31",
        QPalette.ColorRole.ButtonText: "#dfe3ea",
        QPalette.ColorRole.BrightText: "#ffffff",
        QPalette.ColorRole.Highlight: ACCENT,
        QPalette.ColorRole.HighlightedText: "#ffffff",
        QPalette.ColorRole.Link: ACCENT,
        QPalette.ColorRole.PlaceholderText: "#6b7380",
    }
    for role, colour in colours.items():
        palette.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#5c636e"))
    app.setPalette(palette)
    font = QFont(app.font())
    font.setPointSizeF(9.5)
    app.setFont(font)
    qss = resource_path("ui", "dark.qss")
    if qss.is_file():
        app.setStyleSheet(qss.read_text(encoding="utf-8"))


def dot_icon(colour: str) -> QIcon:
    """A small filled circle, the colour code of a list entry (synthetic, scan...); drawn at 2x for HiDPI."""
    pixmap = QPixmap(24, 24)
    pixmap.setDevicePixelRatio(2.0)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setBrush(QColor(colour))
    painter.setPen(Qt.PenStyle.NoPen)
    painter.drawEllipse(2, 2, 8, 8)
    painter.end()
    return QIcon(pixmap)


#: Tool bar buttons that stay pressed (Crosshair, Tissue overlay) show it in the accent colour.
CHECKED_TOOLBUTTON_STYLE = (
    "QToolButton:checked { background: #2f6fae; border-color: #3d8fd6; color: #ffffff; }"
)
