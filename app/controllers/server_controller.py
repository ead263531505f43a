"""Server menu ↔ settings ↔ the local server the worker runs beside its scheduler.

The GUI never talks HTTP: it asks the worker to start or stop the server (`request_server`) and
shows what the worker reports (`server_changed`): the URL, the requests in progress, or the one
line of an error (a port in use), which unchecks the action.
"""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QApplication

from phoenix_chat.app.controllers.wiring import connect
from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.views.main_window import MainWindow
from phoenix_chat.app.worker.client import WorkerClient


class ServerController(QObject):
    def __init__(self, window: MainWindow, worker: WorkerClient, settings: SettingsModel) -> None:
        super().__init__()
        self.window = window
        self.worker = worker
        self.settings = settings
        self.url: str | None = None  # the OpenAI base URL while the server runs
        self.active = 0
        window.server_action.setChecked(settings.values.server_enabled)
        window.server_action.triggered.connect(self.set_enabled)
        window.copy_url_action.triggered.connect(self.copy_url)
        # a (re)started worker is told again; it starts the server once its model is loaded
        connect(worker, worker_ready=lambda _pid: self._tell_worker(), server_changed=self._on_status)

    def set_enabled(self, enabled: bool) -> None:
        self.settings.set("server_enabled", enabled)
        self.window.server_label.setText("Server: starting…" if enabled else "")
        self.worker.request_server(enabled, self.settings.values.server_port)

    def copy_url(self) -> None:
        if self.url is not None:
            QApplication.clipboard().setText(self.url)

    def _tell_worker(self) -> None:
        if self.settings.values.server_enabled:
            self.worker.request_server(True, self.settings.values.server_port)

    def _on_status(self, status: dict) -> None:
        w = self.window
        self.url = status["url"] if status["running"] else None
        self.active = int(status["active"]) if status["running"] else 0
        w.copy_url_action.setEnabled(self.url is not None)
        if status["error"]:
            w.server_action.setChecked(False)
            self.settings.set("server_enabled", False)
            w.server_label.setText(f"Server: {status['error']}")
        elif self.url is not None:
            w.server_action.setChecked(True)
            w.server_label.setText(f"Server: {self.url} · {self.active} active")
        elif status["wanted"]:
            w.server_label.setText("Server: starts when the model is loaded")
        else:
            w.server_label.setText("")
