"""Conversations and answers: chat view + conversation list ↔ store ↔ worker.

The GUI thread owns the in-memory state; the store writes on its own thread (StoreThread);
the worker only sends text. A streaming answer lives in the database from its first
token (complete=0) and is re-saved every SAVE_INTERVAL_MS while it grows, so a crash loses
at most that much text.
"""

from __future__ import annotations

import asyncio
import html
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from phoenix_chat.app.controllers.model_controller import ModelController
from phoenix_chat.app.controllers.wiring import connect, connect_actions
from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.store import Message, StoreThread
from phoenix_chat.app.views.chat_view import ShownMessage
from phoenix_chat.app.views.main_window import MainWindow
from phoenix_chat.app.worker.client import WorkerClient
from phoenix_chat.app.worker.protocol import GenerationStats

SAVE_INTERVAL_MS = 500
TITLE_CHARS = 48
FINISH_NOTES = {
    "cancelled": "Stopped.",
    "length": "Stopped at the answer length limit (Chat settings → Max answer tokens).",
    "context": "Stopped: the conversation filled the model's context window. Start a new chat "
    "or raise Devices → Context length.",
}


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
        # the answer being generated
        self.gen_id: str | None = None
        self.gen_conversation: int | None = None
        self.answer_id: int | None = None
        self.answer_text = ""
        self.answer_dirty = False
        self.busy = False
        self._tasks: set[asyncio.Task] = set()
        self._save_timer = QTimer(self, interval=SAVE_INTERVAL_MS)
        self._save_timer.timeout.connect(self._save_partial)

        connect(
            self.view,
            send_requested=self.send,
            stop_requested=self.stop,
            regenerate_requested=self.regenerate,
            edit_requested=self.begin_edit,
            edit_cancelled=self.cancel_edit,
            settings_requested=self._edit_chat_settings,
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
            tokens_changed=self._on_tokens,
            stats_changed=self._on_stats,
            generation_finished=self._on_finished,
            error_raised=self._on_error,
            worker_died=self._on_worker_died,
        )

        last = settings.values.last_conversation_id
        convs = self.store.list_conversations()
        if last is not None and any(c.id == last for c in convs):
            self.open_conversation(last)
        elif convs:
            self.open_conversation(convs[0].id)
        else:
            self.new_conversation()

    # -- conversations --------------------------------------------------------------------
    def refresh_list(self) -> None:
        convs = self.store.list_conversations(self.search)
        self.list_view.set_conversations([(c.id, c.title) for c in convs], self.conversation_id)

    def new_conversation(self) -> int:
        s = self.settings.values
        conv = self.store.create_conversation("New chat", s.system_prompt, s.sampling_defaults())
        self.open_conversation(conv.id)
        return conv.id

    def open_conversation(self, conversation_id: int) -> None:
        if conversation_id == self.conversation_id:
            return
        self.cancel_edit()
        self.conversation_id = conversation_id
        self.messages = self.store.messages(conversation_id)
        self.settings.set("last_conversation_id", conversation_id)
        self._show_messages()
        self.refresh_list()
        self.view.input.setFocus()
        self.conversation_changed.emit(conversation_id)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title.strip() or "Untitled")
        self.refresh_list()

    def delete_conversation(self, conversation_id: int) -> None:
        if self.busy and self.gen_conversation == conversation_id:
            self.stop()
        self.store.delete_conversation(conversation_id)
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
        """Send `text` as a new user message (or as the edit of an earlier one)."""
        text = text.strip()
        if not text or self.busy:
            return
        conv_id = self.conversation_id if self.conversation_id is not None else self.new_conversation()
        if self.editing_id is not None:
            self.store.edit_message(self.editing_id, text)
            self.editing_id = None
            self.view.set_editing(None)
        else:
            self.store.add_message(conv_id, "user", text)
            self.view.input.clear()
            conv = self.store.conversation(conv_id)
            if conv is not None and conv.title == "New chat":
                title = " ".join(text.split())
                title = title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 1] + "…"
                self.store.rename_conversation(conv_id, title)
        self.messages = self.store.messages(conv_id)
        self.refresh_list()
        self._start_answer()

    def regenerate(self) -> None:
        """Answer the last user message again (its old answer is replaced)."""
        if self.busy or not self.messages:
            return
        last = self.messages[-1]
        if last.role == "assistant":
            self.store.truncate_after(last.id, inclusive=True)
            self.messages = self.store.messages(self._open_id())
        if self.messages and self.messages[-1].role == "user":
            self._start_answer()

    def begin_edit(self, message_id: int) -> None:
        if self.busy:
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
        if self.gen_id is not None:
            self.worker.cancel_generation(self.gen_id)
        elif self.busy:
            # Still loading the model for this answer: give up on it.
            self.models.cancel_load()

    def _start_answer(self) -> None:
        self.busy = True
        self.view.set_busy(True)
        conv_id = self._open_id()
        self.gen_conversation = conv_id
        self.answer_text = ""
        self._show_messages(pending=True)
        task = asyncio.get_event_loop().create_task(self._answer(conv_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, conv_id: int) -> None:
        if not await self.models.ensure_loaded():
            self._finish_view("The model is not loaded, so there is no answer. See the message above.")
            return
        conv = self.store.conversation(conv_id)
        history = self.store.messages(conv_id)
        sampling = {**self.settings.values.sampling_defaults(), **(conv.sampling if conv else {})}
        max_tokens = int(sampling.pop("max_tokens", self.settings.values.max_tokens))
        prompt = []
        if conv and conv.system_prompt.strip():
            prompt.append({"role": "system", "content": conv.system_prompt})
        prompt += [{"role": m.role, "content": m.content} for m in history if m.content]
        answer = self.store.add_message(conv_id, "assistant", "", complete=False)
        self.answer_id = answer.id
        self.answer_dirty = False
        self.gen_id = self.worker.request_generation(prompt, sampling, max_tokens)
        self._save_timer.start()

    # -- events from the worker -----------------------------------------------------------
    def _on_tokens(self, gen_id: str, delta: str) -> None:
        if gen_id != self.gen_id:
            return
        self.answer_text += delta
        self.answer_dirty = True
        if self.conversation_id == self.gen_conversation:
            self.view.set_streaming_text(self.answer_text)

    def _on_stats(self, gen_id: str, stats: GenerationStats) -> None:
        if gen_id == self.gen_id:
            self._show_stats(stats)

    def _on_error(self, request_id: str, message: str) -> None:
        if request_id and request_id == self.gen_id:
            self.view.show_notice(html.escape(f"The engine reported an error: {message}"), "error")

    def _on_finished(self, gen_id: str, reason: str, stats: GenerationStats, text: str) -> None:
        if gen_id != self.gen_id:
            return
        self.answer_text = text or self.answer_text
        note = FINISH_NOTES.get(reason, "The answer failed (see the message above)." if reason == "error" else "")
        self._close_answer(note, reason, stats)
        self._show_stats(stats)

    def _on_worker_died(self, reason: str) -> None:
        message = (
            f"The engine stopped: {reason}. Your conversation is safe; "
            "the engine restarts when you send the next message."
        )
        self.view.show_notice(html.escape(message), "error")
        self.window.statusBar().showMessage(message, 10000)
        if self.gen_id is not None:
            self._close_answer("Interrupted: the engine stopped.", "crashed", None)
        elif self.busy:
            self._finish_view("Interrupted: the engine stopped.")

    def _close_answer(self, note: str, reason: str, stats: GenerationStats | None) -> None:
        self._save_timer.stop()
        answer_id = self.answer_id
        if answer_id is not None:
            saved = {**(stats.to_dict() if stats else {}), "finish_reason": reason, **({"note": note} if note else {})}
            self.store.update_message(answer_id, self.answer_text, complete=True, stats=saved)
        self.gen_id = None
        self.answer_id = None
        if self.conversation_id is not None and self.gen_conversation == self.conversation_id:
            self.messages = self.store.messages(self.conversation_id)
        self._finish_view(None)
        if answer_id is not None:
            self.answer_finished.emit(answer_id, reason)

    def _finish_view(self, note: str | None) -> None:
        self.busy = False
        self.view.set_busy(False)
        if note is not None:
            self.view.set_streaming_text(self.answer_text, complete=True, note=note)
        else:
            self._show_messages()
        self.view.input.setFocus()

    def _save_partial(self) -> None:
        if self.answer_dirty and self.answer_id is not None:
            self.answer_dirty = False
            self.store.update_message(self.answer_id, self.answer_text, complete=False)

    # -- view -----------------------------------------------------------------------------
    def _show_messages(self, pending: bool = False) -> None:
        shown = []
        conv = self.store.conversation(self.conversation_id) if self.conversation_id else None
        if conv is not None and conv.system_prompt.strip():
            shown.append(ShownMessage(None, "system", conv.system_prompt))
        for m in self.messages:
            shown.append(
                ShownMessage(
                    m.id,
                    m.role,
                    m.content,
                    m.complete or m.role != "assistant",
                    m.stats.get("note", "") if m.role == "assistant" else "",
                )
            )
        if pending:
            shown.append(ShownMessage(None, "assistant", "", False))
        self.view.set_messages(shown)

    def _show_stats(self, stats: GenerationStats) -> None:
        w = self.window
        if stats.generation_tps:
            w.tps_label.setText(f"{stats.generation_tps:.1f} tok/s")
        if stats.ttft_s is not None:
            w.ttft_label.setText(f"TTFT {stats.ttft_s * 1000:.0f} ms")
        used, limit = stats.prompt_tokens + stats.generation_tokens, stats.context_limit
        w.context_label.setText(f"context {used:,}/{limit:,}" if limit else f"context {used:,}")
