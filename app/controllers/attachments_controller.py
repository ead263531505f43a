"""Pictures waiting to go with the next message: Attach image…, drops and pastes → checked →
thumbnails above the message box. The chat controller takes them when the message is sent.

Each picture is checked as it is attached by the engine's own decoder (app/pictures.py), so a
file that is no picture, a truncated one or a decompression bomb is refused at once with the
engine's one-line reason; the others are still attached.
"""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import QBuffer, QIODevice, QObject, Signal
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog, QWidget

from phoenix_chat.app.controllers.wiring import connect
from phoenix_chat.app.pictures import Picture, picture_from_bytes, read_picture
from phoenix_chat.app.views.chat_view import ChatView
from phoenix_chat.engine.vision.images import ImageError

FILE_FILTER = "Images (*.png *.jpg *.jpeg *.webp *.gif);;All files (*)"
PASTED_NAME = "pasted image.png"


class AttachmentsController(QObject):
    changed = Signal()  # the pending pictures changed

    def __init__(self, view: ChatView, parent: QWidget):
        super().__init__(parent)
        self.view, self.parent_widget = view, parent
        self.pending: list[Picture] = []
        self.last_dir = str(Path.home())
        connect(
            view,
            attach_requested=self.ask_files,
            files_offered=self.add_files,
            image_offered=self.add_image,
            attachment_removed=self.remove,
        )

    def ask_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self.parent_widget, "Attach images", self.last_dir, FILE_FILTER)
        if paths:
            self.last_dir = str(Path(paths[0]).parent)
            self.add_files(paths)

    def add_files(self, paths: list[str]) -> None:
        """Attach each file that is a picture the engine reads; say why for the others."""
        pictures, refused = [], []
        for path in paths:
            try:
                pictures.append(read_picture(path))
            except ImageError as exc:
                refused.append(str(exc))
        self._add(pictures, refused)

    def add_image(self, image: QImage) -> None:
        """A pasted or dropped picture (image data, not a file): kept as PNG."""
        buffer = QBuffer()
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        # PySide6 takes the format as str (its stubs say bytes)
        if image.isNull() or not image.save(buffer, "PNG"):  # type: ignore[call-overload]
            self._add([], ["the pasted picture could not be read"])
            return
        try:
            self._add([picture_from_bytes(bytes(buffer.data().data()), PASTED_NAME)], [])
        except ImageError as exc:
            self._add([], [str(exc)])

    def remove(self, index: int) -> None:
        if 0 <= index < len(self.pending):
            del self.pending[index]
            self._show()

    def take(self) -> list[Picture]:
        """The pending pictures, for the message being sent (none pending afterwards)."""
        taken, self.pending = self.pending, []
        self._show()
        return taken

    def _add(self, pictures: list[Picture], refused: list[str]) -> None:
        self.pending.extend(pictures)
        self._show()
        if refused:
            lines = "<br>".join(html.escape(line) for line in refused)
            self.view.show_notice(f"Not attached: {lines}", "error")

    def _show(self) -> None:
        self.view.set_attachments([(p.name, p.thumbnail) for p in self.pending])
        self.changed.emit()
