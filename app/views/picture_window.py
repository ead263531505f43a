"""A message's picture full size, in a window of its own. Layout only.

Qt's image reader draws it (EXIF orientation applied, a GIF's first frame: the picture as the
model reads it, which the engine decodes with Pillow); scaled down to fit the screen, never up.
"""

from __future__ import annotations

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImageReader, QPixmap
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

SCREEN_SHARE = 0.8  # of the screen's available size, at most


class PictureWindow(QWidget):
    def __init__(self, name: str, data: bytes, parent: QWidget | None = None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setObjectName("pictureWindow")
        buffer = QBuffer()
        buffer.setData(QByteArray(data))
        buffer.open(QIODevice.OpenModeFlag.ReadOnly)
        reader = QImageReader(buffer)
        reader.setAutoTransform(True)  # EXIF orientation, as the model sees it
        image = reader.read()
        full = image.size()  # upright
        self.picture = QLabel(alignment=Qt.AlignmentFlag.AlignCenter)
        self.picture.setObjectName("picture")
        self.size_shown = image.size()
        screen = QGuiApplication.primaryScreen()
        if not image.isNull() and screen is not None:
            room = screen.availableSize() * SCREEN_SHARE
            if image.width() > room.width() or image.height() > room.height():
                image = image.scaled(
                    room, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation
                )
            self.size_shown = image.size()
            self.picture.setPixmap(QPixmap.fromImage(image))
        else:
            self.picture.setText(f"{name} cannot be shown ({reader.errorString()})")
        scroll = QScrollArea()
        scroll.setWidget(self.picture)
        scroll.setWidgetResizable(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(scroll)
        self.setWindowTitle(f"{name} — {full.width()} × {full.height()}")
        self.resize(self.size_shown.width() + 24, self.size_shown.height() + 24)
