"""Builds the window and wires the controllers; owns the app-wide choices (theme, panel).

Kept small on purpose: chat logic is in ChatController, model/devices in ModelController,
gauges in GaugesController.
"""

from __future__ import annotations

from typing import cast

from PySide6.QtCore import QByteArray, QObject, QTimer
from PySide6.QtWidgets import QApplication

from phoenix_chat.app.controllers.chat_controller import ChatController
from phoenix_chat.app.controllers.defaults_controller import DefaultsController
from phoenix_chat.app.controllers.diagnostics_controller import DiagnosticsController
from phoenix_chat.app.controllers.draft_controller import DraftController
from phoenix_chat.app.controllers.engine_controller import EngineController
from phoenix_chat.app.controllers.gauges_controller import GaugesController
from phoenix_chat.app.controllers.model_controller import ModelController
from phoenix_chat.app.controllers.server_controller import ServerController
from phoenix_chat.app.controllers.wiring import choice_sets
from phoenix_chat.app.gauges.amdgpu import DEFAULT_ROOT
from phoenix_chat.app.gauges.sampler import GaugeSampler
from phoenix_chat.app.secrets import SecretStore
from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.store import Store, StoreThread
from phoenix_chat.app.views.main_window import MainWindow
from phoenix_chat.app.views.theme import app_icon, apply_theme
from phoenix_chat.app.worker.client import WorkerClient


class AppController(QObject):
    def __init__(
        self,
        home=None,
        *,
        model_path: str | None = None,
        sysfs_root: str = DEFAULT_ROOT,
        autoload: bool = True,
        secrets: SecretStore | None = None,
    ):
        """secrets: where remote servers' API keys are kept (None: the system keyring)."""
        super().__init__()
        self.settings = SettingsModel(home)
        if model_path is not None:
            self.settings.set("model_path", model_path)  # joins Recent models once it has loaded
        self.store = StoreThread(Store(home=home))
        self.worker = WorkerClient()
        self.window = MainWindow()
        self.window.setWindowIcon(app_icon())
        self.models = ModelController(self.window, self.worker, self.settings)
        self.chat = ChatController(self.window, self.worker, self.store, self.settings, self.models)
        self.drafts = DraftController(self.window, self.worker, self.settings, self.models)
        self.models.stop_answer = self.chat.stop_all  # "stop the answer and reload": every chat's Stop
        self.chat.draft_active = lambda: self.drafts.info is not None  # a draft answers one chat at a time
        self.drafts.draft_ready.connect(lambda _info: self.chat.capacity_changed())
        self.defaults = DefaultsController(self.window, self.settings)
        self.diagnostics = DiagnosticsController(self.window)
        self.secrets = secrets if secrets is not None else SecretStore()
        self.engines = EngineController(self.window, self.worker, self.settings, self.models, self.secrets)
        self.server = ServerController(self.window, self.worker, self.settings)
        self.gauges = GaugesController(self.window.devices, self.worker, GaugeSampler(sysfs_root))

        s = self.settings.values
        w = self.window
        w.theme_actions[s.theme].setChecked(True)
        choice_sets(w.theme_group, self.settings, "theme")
        w.device_dock.setVisible(s.show_device_panel)
        w.device_panel_action.toggled.connect(self._on_panel_toggled)
        w.quit_action.triggered.connect(w.close)
        w.closing.connect(self.shutdown)
        if s.window_geometry:
            w.restoreGeometry(QByteArray.fromHex(s.window_geometry.encode()))
        self.settings.subscribe(self._on_setting)
        self._apply_theme(s.theme)
        self._closed = False

        self.worker.start()
        self.worker.request_devices()
        self.gauges.start()
        if autoload:
            self.models.request_load()

    def show(self) -> None:
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
        # Focus after the window is mapped, so a user can type at once.
        QTimer.singleShot(0, self.window.chat.input.setFocus)
        self.window.chat.input.setFocus()

    def _on_panel_toggled(self, visible: bool) -> None:
        if not self._closed and self.window.isVisible():
            self.settings.set("show_device_panel", visible)

    def _on_setting(self, name: str, value) -> None:
        if name == "theme":
            self._apply_theme(value)

    def _apply_theme(self, theme: str) -> None:
        apply_theme(cast(QApplication, QApplication.instance()), theme)
        self.window.chat.set_theme(theme)
        for g in self.window.devices.gauges().values():
            g.update()

    def shutdown(self) -> None:
        """Save, stop the worker and the background threads (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.window.device_panel_action.toggled.disconnect(self._on_panel_toggled)
        self.settings.set("window_geometry", self.window.saveGeometry().toHex().toStdString())
        self.chat._save_partial()
        self.chat.attachments.close()
        self.gauges.stop()
        self.diagnostics.stop()
        self.engines.stop()
        self.worker.stop()
        self.store.close()
