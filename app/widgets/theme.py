"""Dark theme: Fusion style, a dark palette and the stylesheet in resources/ui/dark.qss."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle, QStyleFactory, QStyleOptionHeader

from engine.files.shipped import resource_path

ACCENT = "#3d8fd6"
NOTE_COLOUR = "#e5c07b"  # amber: a value the model was not trained on, one that was clamped, a cleared plan


class SortArrowStyle(QProxyStyle):
    """Fusion, with a table header's sort arrow pointing the way the rows run: up (\u25b2) for ascending,
    down (\u25bc) for descending, as file managers draw it.

    Qt hands the style ``SortUp`` for a *descending* column (``QHeaderView`` maps Ascending to SortDown),
    and Fusion draws SortUp as an up arrow, so a Date column listing newest first showed \u25b2, which
    users read as oldest first. Swapping the two here fixes every header in the app at once (the vault
    table, the session and plan tables); style sheets without their own arrow image fall through to it.
    """

    def __init__(self) -> None:
        super().__init__(QStyleFactory.create("Fusion"))

    def drawPrimitive(self, element, option, painter, widget=None) -> None:  # noqa: N802 - Qt override
        if element == QStyle.PrimitiveElement.PE_IndicatorHeaderArrow and isinstance(
            option, QStyleOptionHeader
        ):
            order = option.sortIndicator
            up, down = QStyleOptionHeader.SortIndicator.SortUp, QStyleOptionHeader.SortIndicator.SortDown
            if order in (up, down):
                flipped = QStyleOptionHeader(option)
                flipped.sortIndicator = down if order == up else up
                option = flipped
        super().drawPrimitive(element, option, painter, widget)


def apply_dark_theme(app: QApplication) -> None:
    app.setStyle(SortArrowStyle())
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
