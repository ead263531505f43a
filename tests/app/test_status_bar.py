"""The status bar never clips what it says (issue 24, defect 9: clipped progress text).

A real load of the embedded model reports steps such as "dequantizing layers.17.…" and
"loading tokenizer (built once, then cached)"; at every step, every text in the status
bar must fit the room it has, and the whole step must be readable (shown, or in a tooltip).
"""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QLabel, QProgressBar, QStyle, QStyleOptionProgressBar

from tests.app.conftest import wait_loaded

pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.cold_cache]  # the load builds the tokenizer


def shown_and_room(widget) -> tuple[str, int]:
    """The text a widget paints and the width it has for it."""
    if isinstance(widget, QProgressBar):
        option = QStyleOptionProgressBar()
        widget.initStyleOption(option)
        rect = widget.style().subElementRect(QStyle.SubElement.SE_ProgressBarLabel, option, widget)
        return widget.text(), rect.width()
    text = widget.displayed_text() if hasattr(widget, "displayed_text") else widget.text()
    return text, widget.contentsRect().width()


def test_load_steps_fit_the_status_bar(qtbot, make_app):
    app = make_app()
    w = app.window
    problems: list[str] = []
    widest = [0]

    def check(_load_id: str, _fraction: float, message: str) -> None:
        bar = w.statusBar()
        widgets = [c for c in bar.findChildren(QLabel) + bar.findChildren(QProgressBar) if c.isVisible()]
        readable = False
        for widget in widgets:
            text, room = shown_and_room(widget)
            width = widget.fontMetrics().horizontalAdvance(text)
            if width > room:
                problems.append(f"{widget.objectName()} paints {text!r} ({width} px) in {room} px")
            readable |= message in text or widget.toolTip() == message
        if message and not readable:
            problems.append(f"step {message!r} is neither shown whole nor in a tooltip")
        widest[0] = max(widest[0], w.fontMetrics().horizontalAdvance(message))

    app.worker.loading_changed.connect(check)  # after the controller's slot: sees its result
    wait_loaded(qtbot, app)
    assert widest[0] > 220, "no long load step was seen: the test would prove nothing"
    assert problems == []
    # The model line elides too (it grows with name, quant, backend, device and context).
    w.resize(w.minimumSizeHint().width(), w.height())
    qtbot.waitUntil(lambda: w.width() < 900)
    text, room = shown_and_room(w.model_label)
    assert w.fontMetrics().horizontalAdvance(text) <= room
    assert text == w.model_label.text() or w.model_label.toolTip() == w.model_label.text()
