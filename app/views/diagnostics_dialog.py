"""Help → Diagnostics: the `phoenix-chat doctor` report in a dialog, to read, copy or save for a
bug report. Layout only: DiagnosticsController runs the report and fills it in."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout

RUNNING_TEXT = "Running the checks (system, GPUs, Vulkan, a short self-test on each device, NPU)…"


class DiagnosticsDialog(QDialog):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("diagnosticsDialog")
        self.setWindowTitle("Diagnostics")
        self.resize(860, 640)
        self.note = QLabel(RUNNING_TEXT)
        self.note.setWordWrap(True)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = QPushButton("Copy")
        self.save_button = QPushButton("Save…")
        for b in (self.copy_button, self.save_button):
            b.setEnabled(False)
            buttons.addButton(b, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        self.copy_button.clicked.connect(self.copy)
        layout = QVBoxLayout(self)
        layout.addWidget(self.note)
        layout.addWidget(self.text, 1)
        layout.addWidget(buttons)

    def show_report(self, markdown: str, note: str) -> None:
        self.text.setPlainText(markdown)
        self.note.setText(note)
        for b in (self.copy_button, self.save_button):
            b.setEnabled(bool(markdown))

    def report(self) -> str:
        return self.text.toPlainText()

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.report())
        self.note.setText("Copied: paste it into the bug report.")

    def save_to(self, path: str | Path) -> None:
        Path(path).write_text(self.report(), encoding="utf-8")
        self.note.setText(f"Saved to {path}")
