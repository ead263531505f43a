"""A one-line label that always fits its width: elided with "…", whole in its tooltip.

Status-bar messages (a load step such as "dequantizing layers.17.post_feedforward_layernorm",
the model line) are longer than the room they get; a plain label or progress-bar text is
cut mid-letter, or grows the window. `text()` stays the full text; only painting elides.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

MIN_CHARS = 6  # the narrowest it gets: a few letters and "…"


class ElidedLabel(QLabel):
    def __init__(
        self, text: str = "", mode: Qt.TextElideMode = Qt.TextElideMode.ElideMiddle, parent: QWidget | None = None
    ):
        super().__init__(parent)
        self._mode = mode
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 — Qt's name
        super().setText(text)
        self._update_tooltip()

    def displayed_text(self) -> str:
        """What is painted: the text, elided to the current width."""
        width = self.contentsRect().width()
        return self.fontMetrics().elidedText(self.text(), self._mode, max(width, 0))

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        hint = super().minimumSizeHint()
        return QSize(self.fontMetrics().averageCharWidth() * MIN_CHARS, hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._update_tooltip()

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        painter.drawText(self.contentsRect(), int(align), self.displayed_text())

    def _update_tooltip(self) -> None:
        self.setToolTip(self.text() if self.displayed_text() != self.text() else "")
