"""Light and dark looks: Fusion style + a palette + the style sheet from resources/themes."""

from __future__ import annotations

from PySide6.QtGui import QColor, QIcon, QPalette
from PySide6.QtWidgets import QApplication

from phoenix_chat import resources

_COLORS = {
    "light": {
        "window": "#f3f4f6",
        "base": "#ffffff",
        "alt": "#f7f7f8",
        "text": "#1f2328",
        "button": "#eceef1",
        "highlight": "#f97316",
        "htext": "#ffffff",
        "link": "#c2410c",
        "muted": "#8b8f96",
    },
    "dark": {
        "window": "#202124",
        "base": "#1b1c1f",
        "alt": "#26282c",
        "text": "#e6e6e6",
        "button": "#2d2f33",
        "highlight": "#f97316",
        "htext": "#ffffff",
        "link": "#fb923c",
        "muted": "#8b8f96",
    },
}


def app_icon() -> QIcon:
    return QIcon(str(resources.path("icons/phoenix.svg")))


def apply_theme(app: QApplication, theme: str) -> None:
    c = _COLORS.get(theme, _COLORS["light"])
    app.setStyle("Fusion")
    pal = QPalette()
    role = QPalette.ColorRole
    for r, key in (
        (role.Window, "window"),
        (role.Base, "base"),
        (role.AlternateBase, "alt"),
        (role.Text, "text"),
        (role.WindowText, "text"),
        (role.ButtonText, "text"),
        (role.Button, "button"),
        (role.Highlight, "highlight"),
        (role.HighlightedText, "htext"),
        (role.Link, "link"),
        (role.ToolTipBase, "base"),
        (role.ToolTipText, "text"),
        (role.PlaceholderText, "muted"),
    ):
        pal.setColor(r, QColor(c[key]))
    for r in (role.Text, role.WindowText, role.ButtonText):
        pal.setColor(QPalette.ColorGroup.Disabled, r, QColor(c["muted"]))
    app.setPalette(pal)
    qss = resources.path(f"themes/{theme}.qss")
    app.setStyleSheet(qss.read_text() if qss.exists() else "")
