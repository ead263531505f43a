"""Conversations and answers: chat view + conversation list ↔ store ↔ worker.

The GUI thread owns the in-memory state; the store writes on its own thread (StoreThread);
the worker only sends text. A streaming answer lives in the database from its first
token (complete=0) and is re-saved every SAVE_INTERVAL_MS while it grows, so a crash loses
at most that much text; one still unfinished at the next start is marked interrupted, with
Continue and Regenerate offered.

Several chats answer at once, each with its own state (`_Answer`: its generation id, text,
stop, figures): as many as the engine holds KV slots for (Devices → Parallel answers, the
model info's "slots"), one with a draft model (speculative decoding runs one conversation at a
time). A chat sent beyond them waits its turn, and the hint line says so (the list marks which
chats write and which wait). Stop, the transcript's live text and the status-bar figures belong
to the open chat; every worker event is routed to its chat by the generation id.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget

from phoenix_chat.app.controllers.attachments_controller import AttachmentsController
from phoenix_chat.app.controllers.model_controller import ModelController
from phoenix_chat.app.controllers.wiring import choice_sets, connect, connect_actions
from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.store import Message, StoreThread
from phoenix_chat.app.views.answer_figures import answer_figures
from phoenix_chat.app.views.chat_view import ShownMessage
from phoenix_chat.app.views.main_window import MainWindow
from phoenix_chat.app.worker.client import WorkerClient
from phoenix_chat.app.worker.protocol import GenerationStats

SAVE_INTERVAL_MS = 500
TITLE_CHARS = 48
FINISH_NOTES = {
    "cancelled": "Stopped.",
    "length": "Stopped at the answer length limit (Chat settings → Max answer tokens): Continue goes on.",
    "context": "Stopped: the conversation filled the model's context window. Start a new chat "
    "or raise Devices → Context length.",
}
INTERRUPTED_NOTE = "Interrupted: Phoenix Chat closed before this answer finished. Continue or Regenerate it below."
CONTINUABLE = ("interrupted", "length", "cancelled", "crashed", "cut")  # finish reasons Continue can go on from
STOPPING_NOTE = "stopping…"
MODE_LINES = {  # (mode, base model?) → the one line above the transcript
    ("completion", True): "Completion mode: this base model continues your text (no chat template) up to a blank line.",
    ("completion", False): "Completion mode: the model continues your text (no chat template) up to a blank line.",
    ("chat", True): "Chat mode on a base model: it was not instruction-tuned, so its answers through "
    "the chat template are often poor.",
}
STAT_FIELDS = frozenset(GenerationStats.__dataclass_fields__)


@dataclass
class _Answer:
    """One chat's answer being written (or its model loaded for it)."""

    conv_id: int
    gen_id: str | None = None  # the worker's id for it, once asked (every event about it carries it)
    answer_id: int | None = None  # its row in the store
    text: str = ""
    dirty: bool = False  # text not yet saved
    prefix: str = ""  # a continued answer's earlier text
    fit_note: str = ""  # what the model left out of a chat longer than its context
    error: str | None = None  # the engine's one-line error for it (a cut remote stream)
    engine: str | None = None  # who writes it ("local:…", "remote:host/model"), saved with it
    stopping: bool = False
    stats: GenerationStats | None = None  # its latest live figures


class ChatController(QObject):
    answer_finished = Signal(int, str)  # assistant message id, finish reason
    conversation_changed = Signal(int)

    def __init__(
        self,
        window: MainWindow,
        worker: WorkerClient,
        store: StoreThread,
        settings: SettingsModel,
        models: ModelController,
    ):
        super().__init__(window)
        self.window, self.view, self.list_view = window, window.chat, window.conversations
        self.worker, self.store, self.settings, self.models = worker, store, settings, models
        self.conversation_id: int | None = None
        self.messages: list[Message] = []
        self.editing_id: int | None = None
        self.search = ""
        self.answers: dict[int, _Answer] = {}  # conversation id → its answer being written
        self.queue: list[int] = []  # chats whose answer waits for a free slot (oldest first)
        self._queued: dict[int, tuple[bool, bool]] = {}  # ... and what it waits to do: (continuing, regenerating)
        # Whether a draft model is in use (AppController points it at DraftController): one answer at a time.
        self.draft_active: Callable[[], bool] = lambda: False
        self.picture_window: QWidget | None = None  # a message's picture shown full size
        self.model_is_base: bool | None = None  # of the last model that loaded (None: none yet)
        self._tasks: set[asyncio.Task] = set()
        self._save_timer = QTimer(self, interval=SAVE_INTERVAL_MS)
        self._save_timer.timeout.connect(self._save_partial)
        self.attachments = AttachmentsController(self.view, window)  # pictures for the next message
        self.attachments.changed.connect(self._sync_controls)  # Send waits while a picture is checked

        connect(
            self.view,
            send_requested=self.send,
            stop_requested=self.stop,
            regenerate_requested=self.regenerate,
            continue_requested=self.continue_answer,
            edit_requested=self.begin_edit,
            version_requested=self.show_version,
            edit_cancelled=self.cancel_edit,
            settings_requested=self._edit_chat_settings,
            completion_toggled=self._on_completion_toggled,
            picture_requested=self.show_picture,
        )
        connect(
            self.list_view,
            selected=self.open_conversation,
            new_requested=self.new_conversation,
            rename_requested=self._ask_rename,
            delete_requested=self._ask_delete,
            search_changed=self._on_search,
        )
        connect_actions(
            window,
            new_chat_action=self.new_conversation,
            export_markdown_action=lambda: self._ask_export("markdown"),
            export_json_action=lambda: self._ask_export("json"),
        )
        connect(
            worker,
            prompt_fitted=self._on_prompt_fitted,
            tokens_changed=self._on_tokens,
            stats_changed=self._on_stats,
            generation_finished=self._on_finished,
            error_raised=self._on_error,
            worker_died=self._on_worker_died,
        )

        choice_sets(window.overflow_group, settings, "context_overflow")
        window.overflow_actions[settings.values.context_overflow].setChecked(True)
        window.pan_and_scan_action.setChecked(settings.values.pan_and_scan)
        window.pan_and_scan_action.toggled.connect(lambda on: settings.set("pan_and_scan", on))
        models.model_ready.connect(self._on_model_ready)
        settings.subscribe(lambda name, _value: self.capacity_changed() if name == "parallel_answers" else None)
        self.store.close_unfinished_answers(INTERRUPTED_NOTE)  # nothing streams yet: these were cut off

        last = settings.values.last_conversation_id
        convs = self.store.list_conversations()
        if last is not None and any(c.id == last for c in convs):
            self.open_conversation(last)
        elif convs:
            self.open_conversation(convs[0].id)
        else:
            self.new_conversation()

    # -- conversations --------------------------------------------------------------------
    # -- the open chat's answer, and how many may be written at once -------------------------
    @property
    def busy(self) -> bool:
        """Whether any chat's answer is being written."""
        return bool(self.answers)

    def _open_answer(self) -> _Answer | None:
        return self.answers.get(self.conversation_id) if self.conversation_id is not None else None

    @property
    def gen_id(self) -> str | None:
        """The worker's id of the open chat's answer (None: none is asked for)."""
        answer = self._open_answer()
        return answer.gen_id if answer else None

    @property
    def answer_text(self) -> str:
        """The open chat's answer as written so far ("" when it writes none)."""
        answer = self._open_answer()
        return answer.text if answer else ""

    def capacity(self) -> int:
        """How many chats may answer at once: the loaded model's KV slots (the worker reports what
        the backend really holds), 1 with a draft model or before a model is loaded; a remote
        server's requests are Devices → Parallel answers at once (it queues the rest itself)."""
        info = self.models.info
        if info is None:
            return 1
        if info.get("remote"):
            return self.settings.values.parallel_answers
        if self.draft_active():
            return 1
        return max(1, int(info.get("slots") or 1))

    def capacity_changed(self) -> None:
        """A draft model came or went, or Parallel answers changed for a remote server: start the
        waiting chats that now have room, and say so."""
        self._start_waiting()
        self._sync_controls()
        self.refresh_list()

    def _why_one_at_a_time(self) -> str:
        info = self.models.info
        if info is None:
            return " (until the model has loaded)"
        if info.get("remote") or self.capacity() > 1:
            return ""
        if self.draft_active():
            return " (a draft model answers one chat at a time)"
        if info.get("slots_note"):
            return f" ({info['slots_note']})"
        return " (Devices → Parallel answers)"

    def refresh_list(self) -> None:
        convs = self.store.list_conversations(self.search)
        marks = {conv_id: "waiting" for conv_id in self.queue}
        marks.update({conv_id: "writing" for conv_id in self.answers})
        self.list_view.set_conversations([(c.id, c.title) for c in convs], self.conversation_id, marks)

    def new_conversation(self) -> int:
        s = self.settings.values
        conv = self.store.create_conversation("New chat", s.system_prompt, s.sampling_defaults())
        self.open_conversation(conv.id)
        return conv.id

    def open_conversation(self, conversation_id: int) -> None:
        if conversation_id == self.conversation_id:
            return
        self.cancel_edit()
        self.attachments.switch(self.conversation_id, conversation_id)  # pending pictures are per chat
        self.conversation_id = conversation_id
        self.messages = self.store.messages(conversation_id)
        self.settings.set("last_conversation_id", conversation_id)
        # back to a chat that is answering: its answer row (saved every 0.5 s) shows its live text
        answer = self.answers.get(conversation_id)
        self._show_messages(pending=answer is not None and answer.answer_id is None)
        if answer is not None and answer.answer_id is not None:
            self.view.set_streaming_text(answer.text, note=self._streaming_note(answer))
        self._show_chat_stats()
        self._show_mode()
        self._sync_controls()
        self.refresh_list()
        self.view.input.setFocus()
        self.conversation_changed.emit(conversation_id)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title.strip() or "Untitled")
        self.refresh_list()

    def delete_conversation(self, conversation_id: int) -> None:
        self._unqueue(conversation_id)
        if conversation_id in self.answers:
            self._stop(conversation_id)
        self.store.delete_conversation(conversation_id)
        self.attachments.forget(conversation_id)
        if conversation_id == self.conversation_id:
            self.conversation_id = None
            convs = self.store.list_conversations()
            if convs:
                self.open_conversation(convs[0].id)
            else:
                self.new_conversation()
        else:
            self.refresh_list()

    def _open_id(self) -> int:
        """The open conversation: there is one from __init__ on (None only inside delete_conversation)."""
        assert self.conversation_id is not None
        return self.conversation_id

    def _on_search(self, text: str) -> None:
        self.search = text
        self.refresh_list()

    def _ask_rename(self, conversation_id: int) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        title, ok = QInputDialog.getText(self.window, "Rename conversation", "Title:", text=conv.title)
        if ok:
            self.rename_conversation(conversation_id, title)

    def _ask_delete(self, conversation_id: int) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        answer = QMessageBox.question(
            self.window, "Delete conversation", f"Delete “{conv.title}” and all its messages?"
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_conversation(conversation_id)

    def _edit_chat_settings(self) -> None:
        from phoenix_chat.app.views.dialogs import ChatSettingsDialog

        conv = self.store.conversation(self._open_id())
        if conv is None:
            return
        sampling = {**self.settings.values.sampling_defaults(), **conv.sampling}
        dialog = ChatSettingsDialog(conv.system_prompt, sampling, self.window)
        if dialog.exec():
            prompt, sampling = dialog.values()
            self.set_chat_settings(prompt, sampling)

    def set_chat_settings(self, system_prompt: str, sampling: dict) -> None:
        self.store.update_conversation_settings(self._open_id(), system_prompt=system_prompt, sampling=sampling)
        self._show_messages()

    # -- chat or completion mode --------------------------------------------------------------
    def chat_mode(self, conversation_id: int | None = None) -> str:
        """ "chat" or "completion" for a conversation (default: the open one): its own choice, else
        the model's default — completion for a base model, which answers poorly through a template."""
        conv_id = self.conversation_id if conversation_id is None else conversation_id
        conv = self.store.conversation(conv_id) if conv_id is not None else None
        if conv is not None and conv.mode:
            return conv.mode
        return "completion" if self.model_is_base else "chat"

    def set_chat_mode(self, mode: str) -> None:
        """Switch the open chat to "chat" or "completion" mode (saved with the chat)."""
        self.store.set_conversation_mode(self._open_id(), mode)
        self._show_mode()

    def _on_completion_toggled(self, completion: bool) -> None:
        self.set_chat_mode("completion" if completion else "chat")

    def _show_mode(self) -> None:
        mode = self.chat_mode()
        self.view.set_mode(mode == "completion", MODE_LINES.get((mode, bool(self.model_is_base)), ""))

    def show_picture(self, image_id: int) -> None:
        """A message's picture full size, in a window of its own (kept: `picture_window`)."""
        from phoenix_chat.app.views.picture_window import PictureWindow

        picture = self.store.picture(image_id)
        if picture is None:
            return
        if self.picture_window is not None:
            self.picture_window.close()
        self.picture_window = PictureWindow(picture.name, picture.data, self.window)
        self.picture_window.show()

    # -- export ---------------------------------------------------------------------------
    def export_current(self, fmt: str, path: str | Path) -> None:
        text = self.store.export(fmt, [self._open_id()])
        Path(path).write_text(text, encoding="utf-8")

    def _ask_export(self, fmt: str) -> None:
        conv = self.store.conversation(self._open_id())
        if conv is None:
            return
        suffix = ".md" if fmt == "markdown" else ".json"
        name = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conv.title).strip() or "conversation"
        path, _ = QFileDialog.getSaveFileName(
            self.window,
            "Export conversation",
            str(Path.home() / (name + suffix)),
            "Markdown (*.md)" if fmt == "markdown" else "JSON (*.json)",
        )
        if path:
            self.export_current(fmt, path)
            self.window.statusBar().showMessage(f"Exported to {path}", 5000)

    # -- sending --------------------------------------------------------------------------
    def send(self, text: str) -> None:
        """Send `text` and the pending pictures as a new user message (or as the edit of an
        earlier one, which keeps its pictures and gains the pending ones)."""
        text = text.strip()
        conv_id = self.conversation_id if self.conversation_id is not None else self.new_conversation()
        if not (text or self.attachments.pending) or conv_id in self.answers or conv_id in self.queue:
            return
        if self.attachments.checking:  # Send is off meanwhile; a message must not go without them
            return
        pictures = self.attachments.take()
        if self.editing_id is not None:
            self.store.edit_message(self.editing_id, text)
            if pictures:
                self.store.add_pictures(self.editing_id, pictures)
            self.editing_id = None
            self.view.set_editing(None)
        else:
            self.store.add_message(conv_id, "user", text, pictures=pictures)
            self.view.input.clear()
            conv = self.store.conversation(conv_id)
            if conv is not None and conv.title == "New chat":
                title = " ".join(text.split()) or pictures[0].name
                title = title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 1] + "…"
                self.store.rename_conversation(conv_id, title)
        self.messages = self.store.messages(conv_id)
        self._begin(conv_id)

    def regenerate(self) -> None:
        """Answer the last user message again; the old answer is kept as an earlier version (‹ ›)."""
        if self._busy_here() or not self.messages:
            return
        self._begin(self._open_id(), regenerating=self.messages[-1].role == "assistant")

    def show_version(self, message_id: int, step: int) -> None:
        """‹ ›: show the previous (-1) or next (+1) version of an answer; the conversation goes
        on from the version shown (it is what the next prompt holds)."""
        if self._busy_here():
            return
        msg = next((m for m in self.messages if m.id == message_id and m.role == "assistant"), None)
        if msg is None or not 1 <= msg.version + step <= msg.versions:
            return
        if self.store.show_version(message_id, msg.version + step):
            self.messages = self.store.messages(self._open_id())
            self._show_messages()
            self._show_chat_stats()
            self._sync_controls()

    def continue_answer(self) -> None:
        """Go on writing the last answer where it stopped (interrupted, stopped, length limit)."""
        if self._busy_here() or not self._can_continue():
            return
        self._begin(self._open_id(), continuing=True)

    def begin_edit(self, message_id: int) -> None:
        if self._answering_here():
            return
        msg = next((m for m in self.messages if m.id == message_id and m.role == "user"), None)
        if msg is not None:
            self.editing_id = message_id
            self.view.set_editing(msg.content)

    def cancel_edit(self) -> None:
        if self.editing_id is not None:
            self.editing_id = None
            self.view.set_editing(None)

    def stop(self) -> None:
        """Stop the open chat's answer (or its waiting turn); the other chats' answers go on."""
        if self.conversation_id is not None:
            self._stop(self.conversation_id)

    def stop_all(self) -> None:
        """Stop every chat's answer and waiting turn (before a reload)."""
        for conv_id in list(self.queue):
            self._stop(conv_id)
        for conv_id in list(self.answers):
            self._stop(conv_id)

    def _stop(self, conv_id: int) -> None:
        """Stop one chat's answer; says "stopping…" at once, since the engine may be in the
        middle of reading a long prompt."""
        if self._unqueue(conv_id):
            if conv_id == self.conversation_id:
                self._show_messages()
            self._sync_controls()
            self.refresh_list()
            return
        answer = self.answers.get(conv_id)
        if answer is None or answer.stopping:
            return
        answer.stopping = True
        if answer.gen_id is not None:
            self.worker.cancel_generation(answer.gen_id)
        elif not any(a.gen_id is None for a in self.answers.values() if a is not answer):
            # Still loading the model for this answer alone: give up on it (the answer notices once
            # the load ends, as one that waits for a load another chat needs does).
            self.models.cancel_load()
        if conv_id == self.conversation_id:
            self.view.set_streaming_text(answer.text, note=STOPPING_NOTE)
            self.view.schedule_render(now=True)  # acknowledged now, not at the next coalesced redraw
            self._sync_controls()

    def _unqueue(self, conv_id: int) -> bool:
        """Take a chat's waiting turn out of the queue; True when it had one."""
        if conv_id not in self.queue:
            return False
        self.queue.remove(conv_id)
        self._queued.pop(conv_id, None)
        return True

    def _begin(self, conv_id: int, continuing: bool = False, regenerating: bool = False) -> None:
        """Start the chat's answer now, or queue it while as many chats answer as may at once."""
        if len(self.answers) >= self.capacity():
            self.queue.append(conv_id)
            self._queued[conv_id] = (continuing, regenerating)
            if conv_id == self.conversation_id:
                self._show_messages()  # the hint line and the list's mark say it waits
            self._sync_controls()
            self.refresh_list()
            return
        self._start_answer(conv_id, continuing, regenerating)

    def _start_waiting(self) -> None:
        """Start the waiting chats' answers while there is room (oldest first)."""
        while self.queue and len(self.answers) < self.capacity():
            conv_id = self.queue.pop(0)
            continuing, regenerating = self._queued.pop(conv_id, (False, False))
            self._start_answer(conv_id, continuing, regenerating)

    def _start_answer(self, conv_id: int, continuing: bool = False, regenerating: bool = False) -> None:
        answer = self.answers[conv_id] = _Answer(conv_id)
        if conv_id == self.conversation_id:
            self._show_messages(pending=not continuing, replacing=regenerating)
            self._show_chat_stats()
        self._sync_controls()
        self.refresh_list()
        task = asyncio.get_event_loop().create_task(self._answer(answer, continuing, regenerating))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, answer: _Answer, continuing: bool, regenerating: bool = False) -> None:
        if not await self.models.ensure_loaded():
            self._finish_view(answer, "The model is not loaded, so there is no answer. See the message above.")
            return
        if answer.stopping:  # Stop came while the model loaded
            self._finish_view(answer, FINISH_NOTES["cancelled"])
            return
        conv_id = answer.conv_id
        conv = self.store.conversation(conv_id)
        history = self.store.messages(conv_id)
        # Regenerate: the prompt ends before the answer it replaces, which stays as a version
        redo = history.pop() if regenerating and history and history[-1].role == "assistant" else None
        sampling = {**self.settings.values.sampling_defaults(), **(conv.sampling if conv else {})}
        max_tokens = int(sampling.pop("max_tokens", self.settings.values.max_tokens))
        prompt: list[dict] = []
        if conv and conv.system_prompt.strip():
            prompt.append({"role": "system", "content": conv.system_prompt})
        for m in history:
            if m.images:  # the engine's image parts (the pictures' bytes), then the text
                pas = self.settings.values.pan_and_scan
                pictures = self.store.message_pictures(m.id)
                parts: list[dict] = [{"type": "image", "image": p.data, "pan_and_scan": pas} for p in pictures]
                if m.content:
                    parts.append({"type": "text", "text": m.content})
                prompt.append({"role": m.role, "content": parts})
            elif m.content:
                prompt.append({"role": m.role, "content": m.content})
        if continuing:
            row = history[-1]
            answer.prefix = answer.text = row.content
            self.store.update_message(row.id, row.content, complete=False)
        elif redo is not None and redo.content:
            row = self.store.add_version(redo.id)
        elif redo is not None:  # an empty answer (it failed at once) is not worth keeping as a version
            row = redo
            self.store.update_message(redo.id, "", complete=False, stats={})
        else:
            row = self.store.add_message(conv_id, "assistant", "", complete=False)
        answer.answer_id = row.id
        answer.dirty = False
        answer.engine = self.models.engine_label()
        answer.gen_id = self.worker.request_generation(
            prompt,
            sampling,
            max_tokens,
            overflow=self.settings.values.context_overflow,
            continue_answer=continuing,
            mode=self.chat_mode(conv_id),
        )
        self._save_timer.start()

    # -- events from the worker (each routed to its chat by the generation id) -------------
    def _answer_for(self, gen_id: str) -> _Answer | None:
        return next((a for a in self.answers.values() if a.gen_id == gen_id), None) if gen_id else None

    def _on_prompt_fitted(self, gen_id: str, info: dict) -> None:
        answer = self._answer_for(gen_id)
        if answer is None:
            return
        left_out = []
        if info["dropped_messages"]:
            left_out.append(f"{info['dropped_messages']} earlier messages")
        if info["cut_tokens"] and info.get("cut_from") == "start":
            left_out.append(f"the first {info['cut_tokens']:,} tokens of the text")
        elif info["cut_tokens"]:
            left_out.append(f"{info['cut_tokens']:,} tokens from the middle of a long message")
        answer.fit_note = (
            f"This chat ({info['total_tokens']:,} tokens) is longer than the model's context "
            f"({info['context_limit']:,}): the model read it without {' and '.join(left_out)} "
            "(Devices → Context length)."
        )
        if answer.conv_id == self.conversation_id:
            self.view.set_streaming_text(answer.text, note=self._streaming_note(answer))

    def _streaming_note(self, answer: _Answer) -> str:
        if answer.stopping:
            return STOPPING_NOTE
        return f"{answer.fit_note} Writing…" if answer.fit_note else ""

    def _on_tokens(self, gen_id: str, delta: str) -> None:
        answer = self._answer_for(gen_id)
        if answer is None:
            return
        answer.text += delta
        answer.dirty = True
        if answer.conv_id == self.conversation_id:
            self.view.set_streaming_text(answer.text, note=self._streaming_note(answer))

    def _on_stats(self, gen_id: str, stats: GenerationStats) -> None:
        answer = self._answer_for(gen_id)
        if answer is not None:
            answer.stats = stats
            if answer.conv_id == self.conversation_id:
                self._show_stats(stats)

    def _on_error(self, request_id: str, message: str) -> None:
        answer = self._answer_for(request_id)
        if answer is None:
            return
        answer.error = message
        text = f"The engine reported an error: {message}"
        if answer.conv_id != self.conversation_id:  # the banner is shared: say whose answer failed
            conv = self.store.conversation(answer.conv_id)
            text = f"“{conv.title if conv else 'Another chat'}”: {text}"
        self.view.show_notice(html.escape(text), "error")

    def _on_finished(self, gen_id: str, reason: str, stats: GenerationStats, text: str) -> None:
        answer = self._answer_for(gen_id)
        if answer is None:
            return
        answer.text = answer.prefix + text if text else answer.text
        note = FINISH_NOTES.get(reason, "The answer failed (see the message above)." if reason == "error" else "")
        if reason == "cut":  # a remote stream that broke off: what came is kept
            note = f"Answer cut: {answer.error or 'the stream ended early'}"
        note = " ".join(n for n in (answer.fit_note, note) if n)
        self._close_answer(answer, note, reason, stats)

    def _on_worker_died(self, reason: str) -> None:
        message = (
            f"The engine stopped: {reason}. Your conversation is safe; "
            "the engine restarts when you send the next message."
        )
        self.view.show_notice(html.escape(message), "error")
        self.window.statusBar().showMessage(message, 10000)
        for answer in list(self.answers.values()):
            if answer.gen_id is not None:
                self._close_answer(answer, "Interrupted: the engine stopped.", "crashed", None)
            else:
                self._finish_view(answer, "Interrupted: the engine stopped.")

    def _close_answer(self, answer: _Answer, note: str, reason: str, stats: GenerationStats | None) -> None:
        answer_id = answer.answer_id
        if answer_id is not None:
            saved = {**(stats.to_dict() if stats else {}), "finish_reason": reason, **({"note": note} if note else {})}
            self.store.update_message(answer_id, answer.text, complete=True, stats=saved, engine=answer.engine)
        answer.gen_id = None
        answer.answer_id = None
        if answer.conv_id == self.conversation_id:
            self.messages = self.store.messages(answer.conv_id)
        self._finish_view(answer, None)
        if answer_id is not None:
            self.answer_finished.emit(answer_id, reason)

    def _finish_view(self, answer: _Answer, note: str | None) -> None:
        self.answers.pop(answer.conv_id, None)
        if not self.answers:
            self._save_timer.stop()
        if answer.conv_id == self.conversation_id:
            if note is not None:
                self.view.set_streaming_text(answer.text, complete=True, note=note)
            else:
                self._show_messages()
            self._show_chat_stats()
            self.view.input.setFocus()
        self._start_waiting()  # a slot is free: the next waiting chat's turn
        self._sync_controls()
        self.refresh_list()

    def _save_partial(self) -> None:
        for answer in self.answers.values():
            if answer.dirty and answer.answer_id is not None:
                answer.dirty = False
                self.store.update_message(answer.answer_id, answer.text, complete=False)

    # -- view -----------------------------------------------------------------------------
    def _answering_here(self) -> bool:
        """Whether the open chat's answer is being written (or its model loaded for it)."""
        return self.conversation_id in self.answers

    def _busy_here(self) -> bool:
        """Whether the open chat answers or waits to: its regenerate, continue and versions wait."""
        return self.conversation_id in self.answers or self.conversation_id in self.queue

    def _can_continue(self) -> bool:
        last = self.messages[-1] if self.messages else None
        return (
            last is not None
            and last.role == "assistant"
            and bool(last.content)
            and last.stats.get("finish_reason") in CONTINUABLE
        )

    def _writers(self) -> str:
        """The chats writing an answer, in a few words ("“Hi”", "2 chats")."""
        others = [c for c in self.answers if c != self.conversation_id]
        if len(others) != 1:
            return f"{len(others)} chats"
        conv = self.store.conversation(others[0])
        return f"“{conv.title}”" if conv else "Another chat"

    def _sync_controls(self) -> None:
        """Send, Stop, Regenerate, Continue and the hint line for the open chat."""
        answer = self._open_answer()
        here = answer is not None
        waiting = self.conversation_id in self.queue
        others = len(self.answers) - (1 if here else 0)
        full = len(self.answers) >= self.capacity()
        writers = self._writers()
        hint = ""
        if answer is not None and answer.stopping:
            hint = "Stopping the answer…"
        elif waiting:
            one = others == 1
            hint = (
                f"Waiting: {writers} {'is' if one else 'are'} still answering{self._why_one_at_a_time()}; this "
                f"chat's answer starts when {'it' if one else 'one'} finishes (Stop cancels the wait)."
            )
        elif not here and others:
            verb = "is writing an answer" if others == 1 else "are writing answers"
            hint = f"{writers} {verb} (● in the list); " + (
                f"a message sent here waits for {'it' if others == 1 else 'one to finish'}{self._why_one_at_a_time()}."
                if full
                else "a message sent here is answered at the same time."
            )
        self.view.set_controls(
            send=not here and not waiting and not self.attachments.checking,
            stop=(here and answer is not None and not answer.stopping) or waiting,
            regenerate=not here and not waiting,
            continue_=not here and not waiting and self._can_continue(),
            hint=hint,
        )

    def _on_model_ready(self, info: dict) -> None:
        self.model_is_base = not info.get("is_instruction_tuned", True)
        self.attachments.image_input = info.get("image_input")  # None: not known (a remote server)
        self._show_mode()
        self.window.set_auto_context(
            info.get("context_length") if self.settings.values.context_length is None else None
        )
        self._start_waiting()  # chats that waited for the load while its slot count was not known
        self._sync_controls()

    def _show_messages(self, pending: bool = False, replacing: bool = False) -> None:
        """replacing: leave the last answer out (Regenerate writes its next version in its place)."""
        shown = []
        conv = self.store.conversation(self.conversation_id) if self.conversation_id else None
        if conv is not None and conv.system_prompt.strip():
            shown.append(ShownMessage(None, "system", conv.system_prompt))
        for m in self.messages[:-1] if replacing else self.messages:
            answer = m.role == "assistant"
            figures = answer_figures(m.stats) if answer else ""
            if answer and m.engine and m.engine.startswith("remote:"):  # who wrote it, when not this computer
                figures = " · ".join(part for part in (figures, f"via {m.engine.removeprefix('remote:')}") if part)
            shown.append(
                ShownMessage(
                    m.id,
                    m.role,
                    m.content,
                    m.complete or not answer,
                    m.stats.get("note", "") if answer else "",
                    figures,
                    m.version,
                    m.versions,
                    tuple((picture.id, picture.sha256, picture.thumbnail) for picture in m.images),
                )
            )
        if pending:
            shown.append(ShownMessage(None, "assistant", "", False))
        self.view.set_messages(shown)

    def _show_chat_stats(self) -> None:
        """The open chat's figures: the live ones while it answers, else its last answer's saved
        ones, else none (never another chat's)."""
        answer = self._open_answer()
        if answer is not None:
            self._show_stats(answer.stats)
            return
        saved = next(
            (m.stats for m in reversed(self.messages) if m.role == "assistant" and "prompt_tokens" in m.stats), None
        )
        self._show_stats(GenerationStats(**{k: v for k, v in saved.items() if k in STAT_FIELDS}) if saved else None)

    def _show_stats(self, stats: GenerationStats | None) -> None:
        w = self.window
        if stats is None:
            for label in (w.tps_label, w.draft_label, w.ttft_label, w.context_label):
                label.setText("")
            return
        draft = ""
        if stats.draft_acceptance is not None:
            draft = f"draft {stats.draft_acceptance:.0%} accepted"
            if stats.draft_speedup is not None:
                draft += f", {stats.draft_speedup:.2f}× speed"
        w.draft_label.setText(draft)
        w.tps_label.setText(f"{stats.generation_tps:.1f} tok/s" if stats.generation_tps else "")
        w.ttft_label.setText(f"TTFT {stats.ttft_s * 1000:.0f} ms" if stats.ttft_s is not None else "")
        used, limit = stats.prompt_tokens + stats.generation_tokens, stats.context_limit
        w.context_label.setText(f"context {used:,}/{limit:,}" if limit else f"context {used:,}")
