"""Pictures waiting to go with the next message: Attach image…, drops and pastes → checked →
thumbnails above the message box. The chat controller takes them when the message is sent.

Each picture is checked as it is attached by the engine's own decoder (app/pictures.py), so a
file that is no picture, a truncated one or a decompression bomb is refused at once with the
engine's one-line reason; the others are still attached. Decoding a large photo takes a good part
of a second, so the checks run on a thread of their own, one at a time in the order offered
(their pictures are attached in that order); meanwhile the strip says "checking…" and Send waits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import html
from collections.abc import Callable
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
NO_IMAGE_INPUT = (
    "this model has no image input: the picture is kept with your message, but a text-only model cannot "
    "read it (pictures need a Gemma 3 4B, 12B or 27B multimodal model)"
)


class AttachmentsController(QObject):
    changed = Signal()  # the pending pictures changed, or a check started or ended

    def __init__(self, view: ChatView, parent: QWidget):
        super().__init__(parent)
        self.view, self.parent_widget = view, parent
        self.pending: list[Picture] = []  # the open chat's
        self._parked: dict[int, list[Picture]] = {}  # other chats' pending pictures, by conversation id
        self.checking = 0  # offers still being checked
        self.image_input: bool | None = None  # whether the loaded model reads pictures (None: not known)
        self.last_dir = str(Path.home())
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="picture-check")
        self._tasks: set[asyncio.Task] = set()  # references kept: see STYLE 14
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
        self._check([functools.partial(read_picture, path) for path in paths])

    def add_image(self, image: QImage) -> None:
        """A pasted or dropped picture (image data, not a file): kept as PNG."""
        buffer = QBuffer()
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        # PySide6 takes the format as str (its stubs say bytes)
        if image.isNull() or not image.save(buffer, "PNG"):  # type: ignore[call-overload]
            self._add([], ["the pasted picture could not be read"])
            return
        self._check([functools.partial(picture_from_bytes, bytes(buffer.data().data()), PASTED_NAME)])

    def remove(self, index: int) -> None:
        if 0 <= index < len(self.pending):
            del self.pending[index]
            self._show()

    def switch(self, old: int | None, new: int) -> None:
        """Another chat is opened: its own pending pictures come back, the old chat's wait for it
        (a picture still being checked joins whichever chat is open when its check ends)."""
        if old is not None and self.pending:
            self._parked[old] = self.pending
        self.pending = self._parked.pop(new, [])
        self._show()

    def forget(self, conversation_id: int) -> None:
        """A deleted chat's pending pictures go with it."""
        self._parked.pop(conversation_id, None)

    def take(self) -> list[Picture]:
        """The pending pictures, for the message being sent (none pending afterwards)."""
        taken, self.pending = self.pending, []
        self._show()
        return taken

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _check(self, jobs: list[Callable[[], Picture]]) -> None:
        self.checking += 1
        self._show()
        task = asyncio.get_event_loop().create_task(self._run(jobs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, jobs: list[Callable[[], Picture]]) -> None:
        loop = asyncio.get_event_loop()
        pictures, refused = [], []
        try:
            for job in jobs:
                try:
                    pictures.append(await loop.run_in_executor(self._pool, job))
                except ImageError as exc:
                    refused.append(str(exc))
        finally:
            self.checking -= 1
        self._add(pictures, refused)

    def _add(self, pictures: list[Picture], refused: list[str]) -> None:
        self.pending.extend(pictures)
        self._show()
        if refused:
            lines = "<br>".join(html.escape(line) for line in refused)
            self.view.show_notice(f"Not attached: {lines}", "error")
        elif pictures and self.image_input is False:  # said now, not only when the answer fails
            self.view.show_notice(html.escape(NO_IMAGE_INPUT), "warning")

    def _show(self) -> None:
        self.view.set_attachments([(p.name, p.thumbnail) for p in self.pending], checking=self.checking > 0)
        self.changed.emit()
