"""Help → Diagnostics: runs `phoenix-chat doctor` in a process of its own (QProcess: the GUI
thread never waits, and a driver that crashes while probed takes only that process down) and
shows its Markdown in DiagnosticsDialog, with Copy and Save…. It is the very report the CLI
prints, so a user pastes the same thing either way."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QObject, QProcess
from PySide6.QtWidgets import QFileDialog

from phoenix_chat.app.views.diagnostics_dialog import DiagnosticsDialog
from phoenix_chat.app.views.main_window import MainWindow

DOCTOR_ARGS = ["-m", "phoenix_chat.app.cli", "doctor"]


class DiagnosticsController(QObject):
    def __init__(self, window: MainWindow):
        super().__init__(window)
        self.window = window
        self.dialog: DiagnosticsDialog | None = None
        self.process: QProcess | None = None
        window.diagnostics_action.triggered.connect(self.open_dialog)

    def open_dialog(self) -> DiagnosticsDialog:
        if self.dialog is not None:  # already open: bring it forward, keep its run
            self.dialog.raise_()
            return self.dialog
        dialog = self.dialog = DiagnosticsDialog(self.window)
        dialog.save_button.clicked.connect(self.ask_save)
        dialog.finished.connect(self._closed)
        proc = self.process = QProcess(self)
        proc.setProgram(sys.executable)
        proc.setArguments(DOCTOR_ARGS)
        proc.finished.connect(self._done)
        proc.errorOccurred.connect(self._failed)
        proc.start()
        dialog.open()
        return dialog

    def _done(self, code: int, _status: QProcess.ExitStatus) -> None:
        proc, dialog = self.process, self.dialog
        if proc is None or dialog is None:
            return
        out = bytes(proc.readAllStandardOutput().data()).decode("utf-8", "replace")
        err = bytes(proc.readAllStandardError().data()).decode("utf-8", "replace").strip()
        if code == 0 and out:
            dialog.show_report(out, "The same report as `phoenix-chat doctor`: Copy or Save… it for a bug report.")
        else:
            tail = err.splitlines()[-1] if err else "no output"
            dialog.show_report(out + ("\n" + err if err else ""), f"The report failed (exit {code}): {tail}")
        self.process = None

    def _failed(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and self.dialog is not None:
            self.dialog.show_report(
                "", f"Could not start {sys.executable}: {self.process and self.process.errorString()}"
            )
            self.process = None

    def ask_save(self) -> None:
        if self.dialog is None:
            return
        path, _ = QFileDialog.getSaveFileName(
            self.dialog, "Save the diagnostics report", str(Path.home() / "phoenix-chat-doctor.md"), "Markdown (*.md)"
        )
        if path:
            self.dialog.save_to(path)

    def stop(self) -> None:
        """End a report still running (the dialog closed, or the app quits)."""
        if self.process is not None:
            proc, self.process = self.process, None
            proc.kill()
            proc.waitForFinished(2000)

    def _closed(self) -> None:
        self.stop()
        if self.dialog is not None:
            self.dialog.deleteLater()
            self.dialog = None
