"""Settings → Defaults for new chats…: the system prompt and sampling a new chat starts with.

The values live in the typed settings (`Settings.system_prompt`, `sampling_defaults()`);
ChatController copies them into each conversation it creates, so chats already made keep
their own."""

from __future__ import annotations

from PySide6.QtCore import QObject

from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.views.dialogs import ChatSettingsDialog
from phoenix_chat.app.views.main_window import MainWindow

DEFAULTS_TITLE = "Defaults for new chats"
DEFAULTS_NOTE = "New chats start with these settings. Chats you already have keep their own (Chat settings…)."


class DefaultsController(QObject):
    def __init__(self, window: MainWindow, settings: SettingsModel):
        super().__init__(window)
        self.window, self.settings = window, settings
        self.dialog: ChatSettingsDialog | None = None  # the open dialog (window-modal, opened with open())
        window.defaults_action.triggered.connect(self.open_dialog)

    def open_dialog(self) -> ChatSettingsDialog:
        s = self.settings.values
        dialog = ChatSettingsDialog(
            s.system_prompt, s.sampling_defaults(), self.window, title=DEFAULTS_TITLE, note=DEFAULTS_NOTE
        )
        dialog.setObjectName("defaultsDialog")
        dialog.accepted.connect(lambda: self.settings.set_new_chat_defaults(*dialog.values()))
        dialog.finished.connect(self._closed)
        self.dialog = dialog
        dialog.open()
        return dialog

    def _closed(self) -> None:
        if self.dialog is not None:
            self.dialog.deleteLater()
            self.dialog = None
