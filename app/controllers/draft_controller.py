"""Model → Draft model: speculative decoding from the app (engine/speculative.py).

The menu offers, among the recent models and the embedded one, those the worker found to
share the loaded model's tokenizer with fewer parameters; "Open…" takes any file (the worker
refuses one that cannot draft, and says why); "None" turns it off. The choice is a setting:
after every load of the main model the worker is asked to load the draft again (a reload
drops it), and a draft it refuses is reset to None and the user told. The status bar shows
the acceptance rate and the speed-up (ChatController._show_stats).

A draft does not combine with the prompt cache: with one, each message's whole prompt is read
again; the status message says so when the draft loads.
"""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog

from phoenix_chat.app.controllers.model_controller import ModelController
from phoenix_chat.app.controllers.wiring import choice_sets, connect
from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.views.main_window import MainWindow
from phoenix_chat.app.worker.client import WorkerClient


class DraftController(QObject):
    draft_ready = Signal(object)  # the draft's info (None: no draft)
    draft_refused = Signal(str)  # what the user was told

    def __init__(self, window: MainWindow, worker: WorkerClient, settings: SettingsModel, models: ModelController):
        super().__init__(window)
        self.window, self.worker, self.settings, self.models = window, worker, settings, models
        self.info: dict | None = None  # the draft the worker holds
        self.candidates: list[dict] = []
        self._resetting = False
        connect(
            worker,
            draft_changed=self._on_draft,
            draft_failed=self._on_failed,
            draft_candidates_changed=self._on_candidates,
            worker_died=lambda _reason: self._on_draft("", None),
        )
        models.model_ready.connect(self._on_model_ready)
        choice_sets(window.draft_group, settings, "draft_model")
        window.draft_open_action.triggered.connect(self._open_file)
        settings.subscribe(self._on_setting)
        self._sync_menu()

    def _on_model_ready(self, info: dict) -> None:
        self.info = None  # a load drops the draft in the worker
        if info.get("remote"):  # a remote server has no draft model of ours
            self.candidates = []
            self._sync_menu()
            return
        self._ask_candidates()
        if self.settings.values.draft_model is not None:
            self.worker.request_draft(self.settings.values.draft_model)
        self._sync_menu()

    def _ask_candidates(self) -> None:
        from phoenix_chat.engine.weights import embedded_model_path

        paths = [*self.settings.values.recent_models, str(embedded_model_path())]
        self.worker.request_draft_candidates(list(dict.fromkeys(paths)))

    def _on_setting(self, name: str, value) -> None:
        if name == "recent_models" and self.models.info is not None:
            self._ask_candidates()
        elif name == "draft_model" and not self._resetting:
            if self.models.info is not None:
                self.worker.request_draft(value)
            self._sync_menu()

    def _open_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self.window, "Open a draft model", str(Path.home()), "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.settings.set("draft_model", path)

    def _on_draft(self, _request_id: str, info: dict | None) -> None:
        self.info = info
        if info is not None:
            speed = f" The model alone decodes {info['baseline_tps']:.1f} tok/s here." if info["baseline_tps"] else ""
            self.window.statusBar().showMessage(
                f"Draft model {Path(info['path']).name} loaded: speculative decoding is on.{speed} "
                "With a draft the prompt cache is off: each message's whole prompt is read again.",
                10000,
            )
        self._sync_menu()
        self.draft_ready.emit(info)

    def _on_failed(self, _request_id: str, message: str) -> None:
        self.info = None
        chosen = self.settings.values.draft_model
        text = f"Could not use {Path(chosen).name if chosen else 'the draft'} as the draft model: {message}"
        self._resetting = True
        try:
            self.settings.set("draft_model", None)  # never keep a draft that did not load
        finally:
            self._resetting = False
        self.window.chat.show_notice(html.escape(text), "error")
        self.window.statusBar().showMessage(text, 10000)
        self._sync_menu()
        self.draft_refused.emit(text)

    def _on_candidates(self, target: str, candidates: list) -> None:
        info = self.models.info
        if info is None or info.get("path") != target:
            return  # for a model that is no longer loaded
        self.candidates = candidates
        self._sync_menu()

    def _sync_menu(self) -> None:
        choices = [
            (c["path"], f"{c['name']} — {Path(c['path']).name} ({c['parameters'] / 1e6:,.0f}M)")
            for c in self.candidates
        ]
        self.window.set_draft_choices(choices, self.settings.values.draft_model)
        self.window.draft_menu.setEnabled(not (self.models.info or {}).get("remote"))
