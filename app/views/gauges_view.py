"""The device panel: one bar gauge per device figure and a tokens/s sparkline. Drawing only.

A gauge whose source is absent says "not present" (grey, no bar) — never a made-up 0%.
"""

from __future__ import annotations

from collections import deque

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

NOT_PRESENT = "not present"


def _palette(widget: QWidget) -> dict:
    dark = widget.palette().window().color().lightness() < 128
    return {
        "track": QColor("#3a3d42" if dark else "#e5e7eb"),
        "fill": QColor("#f97316"),  # phoenix orange
        "text": widget.palette().windowText().color(),
        "muted": QColor("#8b8f96"),
    }


class Gauge(QWidget):
    """Title, value text on the right, a bar underneath (fraction 0..1 or None)."""

    def __init__(self, title: str, parent=None):
        super().__init__(parent)
        self.title = title
        self.fraction: float | None = None
        self.text = NOT_PRESENT
        self.detail = ""
        self.setMinimumHeight(38)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(220, 40)

    def set_value(self, fraction: float | None, text: str | None = None, detail: str = "") -> None:
        """`fraction` None means the source is absent: show `text` (default "not present")."""
        self.fraction = None if fraction is None else max(0.0, min(1.0, float(fraction)))
        self.text = text if text is not None else (NOT_PRESENT if fraction is None else f"{fraction:.0%}")
        self.detail = detail
        self.setToolTip(detail or self.text)
        self.update()

    @property
    def present(self) -> bool:
        return self.fraction is not None

    def paintEvent(self, _event) -> None:  # noqa: N802
        colors = _palette(self)
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        w = self.width()
        p.setPen(colors["text"])
        font = p.font()
        p.drawText(QRectF(0, 0, w, 18), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self.title)
        p.setPen(colors["text"] if self.present else colors["muted"])
        if not self.present:
            font.setItalic(True)
            p.setFont(font)
        p.drawText(QRectF(0, 0, w, 18), Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, self.text)
        track = QRectF(0, 22, w, 10)
        p.setPen(Qt.PenStyle.NoPen)
        fraction = self.fraction
        if fraction is not None:
            p.setBrush(colors["track"])
            p.drawRoundedRect(track, 4, 4)
            if fraction > 0:
                p.setBrush(colors["fill"])
                p.drawRoundedRect(QRectF(0, 22, max(8.0, w * fraction), 10), 4, 4)
        else:
            pen = QPen(colors["muted"], 1, Qt.PenStyle.DashLine)
            p.setPen(pen)
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRoundedRect(track.adjusted(0.5, 0.5, -0.5, -0.5), 4, 4)
        p.end()


class Sparkline(QWidget):
    """Tokens/s over the last minute or so."""

    def __init__(self, capacity: int = 120, parent=None):
        super().__init__(parent)
        self.capacity = capacity
        self.values: deque[float] = deque(maxlen=capacity)
        self.setMinimumHeight(60)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def add(self, value: float) -> None:
        self.values.append(max(0.0, float(value)))
        self.update()

    def clear(self) -> None:
        """Another engine answers now: its speeds are not comparable with the last one's."""
        self.values.clear()
        self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802
        colors = _palette(self)
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(0, 0, self.width(), self.height()).adjusted(1, 4, -1, -2)
        p.setPen(QPen(colors["track"], 1))
        p.drawLine(rect.bottomLeft(), rect.bottomRight())
        if len(self.values) >= 2:
            top = max(max(self.values), 1.0)
            step = rect.width() / (self.capacity - 1)
            x0 = rect.right() - step * (len(self.values) - 1)
            pts = [QPointF(x0 + i * step, rect.bottom() - rect.height() * v / top) for i, v in enumerate(self.values)]
            area = QPainterPath(QPointF(pts[0].x(), rect.bottom()))
            for pt in pts:
                area.lineTo(pt)
            area.lineTo(QPointF(pts[-1].x(), rect.bottom()))
            fill = QColor(colors["fill"])
            fill.setAlpha(60)
            p.fillPath(area, fill)
            line = QPainterPath(pts[0])
            for pt in pts[1:]:
                line.lineTo(pt)
            p.setPen(QPen(colors["fill"], 1.6))
            p.drawPath(line)
            p.setPen(colors["muted"])
            p.drawText(rect.adjusted(2, -2, 0, 0), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, f"{top:.0f}")
        p.end()


class DevicePanel(QWidget):
    """Gauges: iGPU busy, GPU memory (VRAM, GTT), NPU busy, CPU, RAM; tokens/s sparkline."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("devicePanel")
        self.gpu = Gauge("iGPU busy")
        self.vram = Gauge("GPU memory (VRAM)")
        self.gtt = Gauge("GPU memory (GTT)")
        self.npu = Gauge("NPU busy")
        self.cpu = Gauge("CPU")
        self.ram = Gauge("RAM")
        self.tps_label = QLabel("Tokens/s")
        self.tps_label.setObjectName("sparkTitle")
        self.tps_value = QLabel("—", alignment=Qt.AlignmentFlag.AlignRight)
        self.tps_value.setObjectName("sparkValue")
        self.sparkline = Sparkline()
        self.source_label = QLabel(wordWrap=True)
        self.source_label.setObjectName("gaugeSource")
        self.engine_label = QLabel(wordWrap=True)  # which engine answers: this computer, or "remote: host, model"
        self.engine_label.setObjectName("engineLine")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        layout.setSpacing(6)
        layout.addWidget(self.engine_label)
        for g in (self.gpu, self.vram, self.gtt, self.npu, self.cpu, self.ram):
            layout.addWidget(g)
        row = QWidget()
        h = QHBoxLayout(row)
        h.setContentsMargins(0, 6, 0, 0)
        h.addWidget(self.tps_label)
        h.addWidget(self.tps_value, 1)
        layout.addWidget(row)
        layout.addWidget(self.sparkline)
        layout.addWidget(self.source_label)
        layout.addStretch(1)

    def gauges(self) -> dict[str, Gauge]:
        return {"gpu": self.gpu, "vram": self.vram, "gtt": self.gtt, "npu": self.npu, "cpu": self.cpu, "ram": self.ram}
