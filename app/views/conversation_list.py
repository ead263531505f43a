"""The conversation list: search box, list, New / Rename / Delete. Layout only.

A chat that is writing an answer, or waiting for another chat's, carries a mark before its title."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLineEdit, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout, QWidget

MARKS = {"writing": ("● ", "writing an answer…"), "waiting": ("◌ ", "waiting for another chat's answer")}


class ConversationListView(QWidget):
    selected = Signal(int)  # conversation id
    new_requested = Signal()
    rename_requested = Signal(int)
    delete_requested = Signal(int)
    search_changed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.search = QLineEdit(placeholderText="Search conversations", clearButtonEnabled=True)
        self.search.setObjectName("conversationSearch")
        self.search.textChanged.connect(self.search_changed)
        self.list = QListWidget()
        self.list.setObjectName("conversationList")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(True)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemDoubleClicked.connect(
            lambda item: self.rename_requested.emit(item.data(Qt.ItemDataRole.UserRole))
        )
        self.new_button = QPushButton("New chat")
        self.new_button.setObjectName("newChatButton")
        self.new_button.clicked.connect(self.new_requested)
        self.rename_button = QPushButton("Rename")
        self.rename_button.setObjectName("renameButton")
        self.rename_button.clicked.connect(lambda: self._emit_for_current(self.rename_requested))
        self.delete_button = QPushButton("Delete")
        self.delete_button.setObjectName("deleteButton")
        self.delete_button.clicked.connect(lambda: self._emit_for_current(self.delete_requested))

        buttons = QHBoxLayout()
        buttons.addWidget(self.rename_button)
        buttons.addWidget(self.delete_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 0, 8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addLayout(buttons)
        self._updating = False

    def set_conversations(
        self, items: list[tuple[int, str]], current: int | None, marks: dict[int, str] | None = None
    ) -> None:
        """marks: conversation id → "writing" | "waiting" (see MARKS)."""
        self._updating = True
        try:
            self.list.clear()
            for conv_id, title in items:
                mark, why = MARKS.get((marks or {}).get(conv_id, ""), ("", ""))
                item = QListWidgetItem(mark + (title or "Untitled"))
                item.setData(Qt.ItemDataRole.UserRole, conv_id)
                item.setToolTip(f"{title} — {why}" if why else title)
                self.list.addItem(item)
                if conv_id == current:
                    self.list.setCurrentItem(item)
        finally:
            self._updating = False

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def _on_current(self, item, _previous) -> None:
        if item is not None and not self._updating:
            self.selected.emit(item.data(Qt.ItemDataRole.UserRole))

    def _emit_for_current(self, signal) -> None:
        conv_id = self.current_id()
        if conv_id is not None:
            signal.emit(conv_id)
