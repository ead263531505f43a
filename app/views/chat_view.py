"""The chat pane: transcript, notices, input box and its buttons. Layout only.

The controller hands it messages (`set_messages`, `set_streaming_text`) and which buttons
apply (`set_controls`); it emits what the user asked for (`send_requested`, `stop_requested`,
`regenerate_requested`, `continue_requested`, `edit_requested`, `settings_requested`).
Pictures: the Attach image button (`attach_requested`), files or image data dropped on the pane or
pasted into the message box (`files_offered` with local paths, `image_offered` with a QImage);
the controller shows the pending ones with `set_attachments` (✕ emits `attachment_removed`), and
a message's pictures come as thumbnails in `ShownMessage.images`.
Re-rendering while streaming is coalesced to ~15 Hz so a fast model cannot flood the GUI thread.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from PySide6.QtCore import QMimeData, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QDragEnterEvent,
    QDragMoveEvent,
    QDropEvent,
    QGuiApplication,
    QImage,
    QKeyEvent,
    QPixmap,
    QTextCursor,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QCheckBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from phoenix_chat.app.views.action_links import ActionLinks
from phoenix_chat.app.views.markdown_render import render_message

RENDER_INTERVAL_MS = 66
THUMBNAIL_SCHEME = "thumb"  # <img src="thumb:<sha256>">: a message's picture, from Transcript.thumbnails
PENDING_PX = 56  # a pending attachment's thumbnail in the strip above the message box


@dataclass
class ShownMessage:
    id: int | None
    role: str
    content: str
    complete: bool = True
    note: str = ""  # e.g. "stopped", "error: …"
    figures: str = ""  # an answer's tokens, tok/s, TTFT (views/answer_figures.py); "" when not measured
    version: int = 1  # which version of a regenerated answer is shown, of `versions`
    versions: int = 1
    images: tuple[tuple[int, str, bytes], ...] = ()  # a message's pictures: (saved id, sha256, PNG thumbnail) each


def offered_pictures(mime: QMimeData) -> list[str] | QImage | None:
    """What a drop or paste offers as pictures: image data (a copied picture) first, else local
    files (the controller has each checked; a file that is no picture is refused there), else None
    (plain text, web links)."""
    if mime.hasImage():
        image = mime.imageData()
        if isinstance(image, QImage) and not image.isNull():
            return image
    paths = [url.toLocalFile() for url in mime.urls() if url.isLocalFile()] if mime.hasUrls() else []
    return paths or None


class Transcript(QTextBrowser):
    """The messages as rich text; a message's pictures are `thumb:` images served from `thumbnails`."""

    def __init__(self) -> None:
        super().__init__(openLinks=False, openExternalLinks=False)
        self.thumbnails: dict[str, QImage] = {}

    def loadResource(self, kind: int, name: QUrl | str):  # noqa: N802 — Qt's name
        url = QUrl(name)
        if kind == QTextDocument.ResourceType.ImageResource.value and url.scheme() == THUMBNAIL_SCHEME:
            return self.thumbnails.get(url.path())
        return super().loadResource(kind, name)


class MessageInput(QPlainTextEdit):
    """Enter sends, Shift+Enter inserts a newline, Escape stops an answer or cancels an edit."""

    submitted = Signal()
    escaped = Signal()
    files_offered = Signal(list)  # local paths pasted or dropped here
    image_offered = Signal(object)  # a QImage pasted or dropped here

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 — Qt's name
        return offered_pictures(source) is not None or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 — paste and drop both come here
        offered = offered_pictures(source)
        if isinstance(offered, QImage):
            self.image_offered.emit(offered)
        elif offered:
            self.files_offered.emit(offered)
        else:
            super().insertFromMimeData(source)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        shift = event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not shift:
            self.submitted.emit()
            return
        if event.key() == Qt.Key.Key_Escape:
            self.escaped.emit()
            return
        super().keyPressEvent(event)


class ChatView(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    regenerate_requested = Signal()
    continue_requested = Signal()
    edit_requested = Signal(int)  # message id
    version_requested = Signal(int, int)  # answer message id, -1 (‹ older) or +1 (› newer)
    edit_cancelled = Signal()
    settings_requested = Signal()
    completion_toggled = Signal(bool)  # the chat's mode switch: True for completion, False for chat
    attach_requested = Signal()  # the Attach image button
    files_offered = Signal(list)  # picture files dropped on the pane or pasted (local paths)
    image_offered = Signal(object)  # a picture dropped or pasted as image data (QImage)
    attachment_removed = Signal(int)  # ✕ on the pending picture at this index
    picture_requested = Signal(int)  # a message's thumbnail clicked: its saved id

    def __init__(self, parent=None):
        super().__init__(parent)
        self.theme = "light"
        self.links = ActionLinks()  # Edit/Copy links: only this view can make them
        self._messages: list[ShownMessage] = []
        self._html_cache: dict[tuple, tuple[str, list[str]]] = {}
        self._codes: list[str] = []
        self._full_render = True
        self._live_start: int | None = None  # where the last message starts in the document
        self._prefix_codes = 0  # code blocks before the last message
        self._render_timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render)

        self.notice = QLabel(wordWrap=True)
        self.notice.setObjectName("notice")
        self.notice.setTextFormat(Qt.TextFormat.RichText)
        self.notice.hide()
        self.notice_close = QToolButton(autoRaise=True)
        self.notice_close.setText("✕")
        self.notice_close.setObjectName("noticeClose")
        self.notice_close.setToolTip("Dismiss")
        self.notice_close.clicked.connect(self.hide_notice)
        self.notice_close.hide()
        notice_row = QHBoxLayout()
        notice_row.setContentsMargins(0, 0, 0, 0)
        notice_row.addWidget(self.notice, 1)
        notice_row.addWidget(self.notice_close, 0, Qt.AlignmentFlag.AlignTop)

        self.transcript = Transcript()
        self.transcript.setObjectName("transcript")
        # drops land on the pane (dropEvent below), not in the read-only transcript
        self.transcript.setAcceptDrops(False)
        self.transcript.viewport().setAcceptDrops(False)
        self.transcript.setFrameShape(QFrame.Shape.NoFrame)
        self.transcript.anchorClicked.connect(self._on_anchor)
        self.transcript.setPlaceholderText("")

        self.edit_banner = QLabel(wordWrap=True)
        self.edit_banner.setObjectName("editBanner")
        self.edit_banner.setText(
            "Editing an earlier message: sending replaces it and everything after it. Esc cancels."
        )
        self.edit_banner.hide()

        self.input = MessageInput()
        self.input.setObjectName("messageInput")
        self.input.setPlaceholderText("Message Gemma…  (Enter sends, Shift+Enter for a new line)")
        self.input.setTabChangesFocus(True)
        self.input.setFixedHeight(84)
        self.input.submitted.connect(self._on_submit)
        self.input.escaped.connect(self._on_escape)
        self.input.files_offered.connect(self.files_offered)
        self.input.image_offered.connect(self.image_offered)
        self.attach_button = QPushButton("Attach image…")
        self.attach_button.setObjectName("attachButton")
        self.attach_button.setToolTip(
            "Add pictures to the message (PNG, JPEG, WebP, GIF); you can also drop them on the chat or paste them"
        )
        self.attach_button.clicked.connect(self.attach_requested)
        # the pictures that go with the next message, as thumbnails with ✕
        self.attachments = QWidget()
        self.attachments.setObjectName("attachments")
        self._attachment_row = QHBoxLayout(self.attachments)
        self._attachment_row.setContentsMargins(0, 0, 0, 0)
        self.attachments_checking = QLabel("checking…")  # a picture is being checked (app/pictures.py)
        self.attachments_checking.setObjectName("attachmentsChecking")
        self.attachments_checking.hide()
        self._attachment_row.addWidget(self.attachments_checking)
        self._attachment_row.addStretch(1)
        self._attachment_tiles: list[QFrame] = []
        self.attachments.hide()

        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._on_submit)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.setEnabled(False)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setObjectName("regenerateButton")
        self.regenerate_button.clicked.connect(self.regenerate_requested)
        self.continue_button = QPushButton("Continue")
        self.continue_button.setObjectName("continueButton")
        self.continue_button.setToolTip("Go on writing the last answer where it stopped")
        self.continue_button.clicked.connect(self.continue_requested)
        self.continue_button.setEnabled(False)
        # why Send waits or what Stop is doing ("stopping…", another chat answering)
        self.hint = QLabel(wordWrap=True)
        self.hint.setObjectName("answerHint")
        self.hint.hide()
        self.settings_button = QPushButton("Chat settings…")
        self.settings_button.setObjectName("chatSettingsButton")
        self.settings_button.setToolTip("System prompt and sampling for this conversation")
        self.settings_button.clicked.connect(self.settings_requested)
        # completion mode (the chat as one text the model continues) or chat mode (the template)
        self.completion_switch = QCheckBox("Completion mode")
        self.completion_switch.setObjectName("completionSwitch")
        self.completion_switch.setToolTip(
            "On: the model continues the conversation as one text (no chat template), stopping at a "
            "blank line. Off: chat mode, through the model's chat template. Kept per chat."
        )
        self.completion_switch.clicked.connect(self.completion_toggled)
        self.mode_line = QLabel(wordWrap=True)  # one line on what the chat's mode means for this model
        self.mode_line.setObjectName("modeLine")
        self.mode_line.hide()

        buttons = QHBoxLayout()
        buttons.addWidget(self.settings_button)
        buttons.addStretch(1)
        buttons.addWidget(self.continue_button)
        buttons.addWidget(self.regenerate_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addLayout(notice_row)
        mode_row = QHBoxLayout()  # the chat's mode: what it means, and the switch
        mode_row.setContentsMargins(0, 0, 0, 0)
        mode_row.addWidget(self.mode_line, 1)
        mode_row.addStretch(0)
        mode_row.addWidget(self.completion_switch, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(mode_row)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.edit_banner)
        layout.addWidget(self.hint)
        layout.addWidget(self.attachments)
        input_row = QHBoxLayout()  # the message box, and the Attach image button beside it
        input_row.setContentsMargins(0, 0, 0, 0)
        input_row.addWidget(self.input, 1)
        input_row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(input_row)
        layout.addLayout(buttons)
        self.setAcceptDrops(True)
        self.input.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFocusProxy(self.input)

    # -- hooks for the controller ---------------------------------------------------------
    def set_theme(self, theme: str) -> None:
        self.theme = theme
        self._html_cache.clear()
        self._full_render = True
        self.schedule_render(now=True)

    def set_attachments(self, items: list[tuple[str, bytes]], *, checking: bool = False) -> None:
        """The pending pictures as (name, PNG thumbnail); each gets a ✕ (`attachment_removed`);
        `checking`: more are being checked (a "checking…" after them)."""
        for old in self._attachment_tiles:
            self._attachment_row.removeWidget(old)
            old.hide()
            old.setParent(None)  # out of the strip now (findChildren, layout), deleted later
            old.deleteLater()
        self._attachment_tiles = []
        for index, (name, thumbnail) in enumerate(items):
            tile = QFrame()
            tile.setObjectName("attachment")
            tile.setToolTip(name)
            row = QHBoxLayout(tile)
            row.setContentsMargins(2, 2, 2, 2)
            picture = QLabel()
            pixmap = QPixmap()
            pixmap.loadFromData(thumbnail, "PNG")
            picture.setPixmap(
                pixmap.scaled(
                    PENDING_PX,
                    PENDING_PX,
                    Qt.AspectRatioMode.KeepAspectRatio,
                    Qt.TransformationMode.SmoothTransformation,
                )
            )
            remove = QToolButton(autoRaise=True)
            remove.setText("✕")
            remove.setObjectName("removeAttachment")
            remove.setToolTip(f"Remove {name}")
            remove.clicked.connect(lambda _checked=False, i=index: self.attachment_removed.emit(i))
            row.addWidget(picture)
            row.addWidget(remove, 0, Qt.AlignmentFlag.AlignTop)
            self._attachment_row.insertWidget(index, tile)
            self._attachment_tiles.append(tile)
        self.attachments_checking.setVisible(checking)
        self.attachments.setVisible(bool(items) or checking)

    def attachment_names(self) -> list[str]:
        """The pending pictures' names, in order (what the strip shows)."""
        return [tile.toolTip() for tile in self._attachment_tiles]

    def set_messages(self, messages: list[ShownMessage]) -> None:
        self._messages = list(messages)
        shown = {sha for m in self._messages for _, sha, _ in m.images}
        for sha in set(self.transcript.thumbnails) - shown:  # another chat's pictures are not kept
            del self.transcript.thumbnails[sha]
        self._full_render = True
        self.schedule_render(now=True)

    def messages(self) -> list[ShownMessage]:
        return list(self._messages)

    def set_streaming_text(self, text: str, *, complete: bool = False, note: str = "") -> None:
        """Replace the text of the last (assistant) message."""
        if not self._messages or self._messages[-1].role != "assistant":
            self._messages.append(ShownMessage(None, "assistant", "", False))
            self._full_render = True
        last = self._messages[-1]
        last.content, last.complete, last.note = text, complete, note
        self.schedule_render(now=complete)

    def set_busy(self, busy: bool) -> None:
        self.set_controls(send=not busy, stop=busy, regenerate=not busy, continue_=False)

    def set_controls(self, *, send: bool, stop: bool, regenerate: bool, continue_: bool, hint: str = "") -> None:
        """Which buttons apply to the open chat, and a line saying why Send waits (or "Stopping…")."""
        self.send_button.setEnabled(send)
        self.stop_button.setEnabled(stop)
        self.regenerate_button.setEnabled(regenerate)
        self.continue_button.setEnabled(continue_)
        self.hint.setText(hint)
        self.hint.setVisible(bool(hint))

    def set_mode(self, completion: bool, line: str) -> None:
        """The chat's mode on the switch, and the line that says what it means (empty: hidden)."""
        self.completion_switch.setChecked(completion)
        self.mode_line.setText(line)
        self.mode_line.setVisible(bool(line))

    def show_notice(self, text_html: str, kind: str = "info") -> None:
        self.notice.setProperty("kind", kind)
        self.notice.setText(text_html)
        self.notice.style().unpolish(self.notice)
        self.notice.style().polish(self.notice)
        self.notice.show()
        self.notice_close.show()

    def notice_kind(self) -> str | None:
        """The kind of the notice on show ("info", "warning", "error"), None when hidden."""
        return str(self.notice.property("kind")) if self.notice.isVisible() else None

    def hide_notice(self) -> None:
        self.notice.hide()
        self.notice_close.hide()

    def set_editing(self, text: str | None) -> None:
        """Show the edit banner with `text` in the box, or leave edit mode (None)."""
        if text is None:
            self.edit_banner.hide()
            self.input.clear()
        else:
            self.edit_banner.show()
            self.input.setPlainText(text)
            self.input.moveCursor(QTextCursor.MoveOperation.End)
        self.input.setFocus()

    def transcript_text(self) -> str:
        return self.transcript.toPlainText()

    # -- rendering ------------------------------------------------------------------------
    def schedule_render(self, now: bool = False) -> None:
        if now:
            self._render_timer.stop()
            self._render()
        elif not self._render_timer.isActive():
            self._render_timer.start()

    def _render(self) -> None:
        """Redraw: everything after set_messages, else only the last (streaming) message.

        Re-setting a long transcript costs ~0.2 s per 200 messages, far too much at 15 Hz;
        the streaming answer is the last block, so only it is replaced in place.
        """
        bar = self.transcript.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        old = bar.value()
        if self._full_render or self._live_start is None:
            self._render_all()
        else:
            cursor = QTextCursor(self.transcript.document())
            cursor.setPosition(self._live_start)
            cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
            del self._codes[self._prefix_codes :]
            self._insert_last()
        bar.setValue(bar.maximum() if at_bottom else old)

    def _render_all(self) -> None:
        self._full_render = False
        self._codes = []
        if not self._messages:
            self._live_start = None
            self.transcript.setHtml(
                '<p style="color:gray" align="center"><br><br>Start a conversation: type below and press Enter.</p>'
            )
            return
        self.transcript.setHtml("".join(self._message_html(m, i) for i, m in enumerate(self._messages[:-1])))
        self._prefix_codes = len(self._codes)
        self._live_start = self.transcript.document().characterCount() - 1
        self._insert_last()

    def _insert_last(self) -> None:
        cursor = QTextCursor(self.transcript.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertHtml(self._message_html(self._messages[-1], len(self._messages) - 1))

    def _message_html(self, m: ShownMessage, index: int) -> str:
        key = (m.role, m.content, self.theme, len(self._codes))
        cached = self._html_cache.get(key)
        if cached is None:
            body, codes = (
                render_message(m.content, self.links, self.theme, len(self._codes))
                if m.content
                else ("<p>…</p>" if not m.complete else "", [])
            )
            cached = (body, codes)
            if m.complete:
                self._html_cache[key] = cached
        body, codes = cached
        self._codes.extend(codes)
        body = self._pictures_html(m) + body
        dark = self.theme == "dark"
        if m.role == "user":
            bg, who = ("#2b3a55" if dark else "#e8f0fe"), "You"
        elif m.role == "assistant":
            bg, who = ("#26282c" if dark else "#ffffff"), "Gemma"
        else:
            bg, who = ("#3a3324" if dark else "#fff7e0"), "System"
        links = ""
        if m.role == "user" and m.id is not None:
            links = f'&nbsp;&nbsp;<a href="{self.links.href("edit", m.id)}" style="font-size:small">Edit</a>'
        elif m.role == "assistant" and m.complete and m.content:
            links = f'&nbsp;&nbsp;<a href="{self.links.href("copymsg", index)}" style="font-size:small">Copy</a>'
        note = ""
        if m.note:
            note = f'<p style="color:#b45309; font-size:small"><i>{html.escape(m.note)}</i></p>'
        elif not m.complete and m.role == "assistant":
            note = '<p style="color:gray; font-size:small"><i>writing…</i></p>'
        return (
            f'<table width="100%" cellspacing="0" cellpadding="8" style="margin-bottom:6px">'
            f'<tr><td bgcolor="{bg}"><b>{who}</b>{links}{body}{note}{self._footer_html(m)}</td></tr></table>'
        )

    def _pictures_html(self, m: ShownMessage) -> str:
        """A message's pictures as a row of thumbnails (served by the transcript, never fetched);
        clicking one asks for it full size (`picture_requested`)."""
        if not m.images:
            return ""
        tags = []
        for image_id, sha, thumbnail in m.images:
            if sha not in self.transcript.thumbnails:
                self.transcript.thumbnails[sha] = QImage.fromData(thumbnail)  # a PNG: the format is in its header
            image = self.transcript.thumbnails[sha]
            tags.append(
                f'<a href="{self.links.href("picture", image_id)}">'
                f'<img src="{THUMBNAIL_SCHEME}:{sha}" width="{image.width()}" height="{image.height()}"></a>'
            )
        return "<p>" + "&nbsp;".join(tags) + "</p>"

    def message_pictures(self) -> list[list[str]]:
        """Per message shown, the pictures its HTML shows (their sha256) that the transcript can serve."""
        return [[sha for _, sha, _ in m.images if not self.transcript.thumbnails[sha].isNull()] for m in self._messages]

    def _footer_html(self, m: ShownMessage) -> str:
        """Under an answer: ‹ 2/3 › when it has versions, and its figures once it is finished."""
        parts = []
        if m.role == "assistant" and m.versions > 1 and m.id is not None:
            older = f'<a href="{self.links.href("older", m.id)}">‹</a>' if m.version > 1 else "‹"
            newer = f'<a href="{self.links.href("newer", m.id)}">›</a>' if m.version < m.versions else "›"
            parts.append(f"{older}&nbsp;{m.version}/{m.versions}&nbsp;{newer}")
        if m.role == "assistant" and m.complete and m.figures:
            parts.append(html.escape(m.figures))
        if not parts:
            return ""
        return f'<p style="color:gray; font-size:small">{"&nbsp;&nbsp;·&nbsp;&nbsp;".join(parts)}</p>'

    def _on_anchor(self, url: QUrl) -> None:
        """Act on this view's own action links only; any other link does nothing."""
        action = self.links.parse(url.toString())
        if action is None:
            return
        name, arg = action
        if name == "copy" and arg < len(self._codes):
            QGuiApplication.clipboard().setText(self._codes[arg])
        elif name == "copymsg" and arg < len(self._messages):
            QGuiApplication.clipboard().setText(self._messages[arg].content)
        elif name == "edit":
            self.edit_requested.emit(arg)
        elif name in ("older", "newer"):
            self.version_requested.emit(arg, -1 if name == "older" else 1)
        elif name == "picture":
            self.picture_requested.emit(arg)

    def _on_escape(self) -> None:
        """Esc stops a running answer, otherwise leaves edit mode."""
        if self.stop_button.isEnabled():
            self.stop_requested.emit()
        else:
            self.edit_cancelled.emit()

    # -- drops ----------------------------------------------------------------------------
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 — Qt's name
        if offered_pictures(event.mimeData()) is not None:
            event.acceptProposedAction()

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:  # noqa: N802 — Qt's name
        if offered_pictures(event.mimeData()) is not None:
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 — Qt's name
        offered = offered_pictures(event.mimeData())
        if offered is None:
            return
        event.acceptProposedAction()
        if isinstance(offered, QImage):
            self.image_offered.emit(offered)
        else:
            self.files_offered.emit(offered)

    def _on_submit(self) -> None:
        if not self.send_button.isEnabled():
            return
        text = self.input.toPlainText().strip()
        if text or self._attachment_tiles:  # a picture alone is a message too
            self.send_requested.emit(text)
