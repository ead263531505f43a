"""Which model runs where: File/Model/Devices menus ↔ settings ↔ worker loads.

Owns the model's lifetime in the worker: loads on start, reloads when a setting that
shapes the model changes (file, quantization, backend, NPU, context length), shows
progress with a Cancel button, and reloads after the worker died when the next request
needs a model (`ensure_loaded`).
"""

from __future__ import annotations

import asyncio
import html
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QMessageBox

from phoenix_chat.app.controllers.wiring import choice_sets, connect, connect_actions
from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.views.main_window import APP_TITLE, MainWindow
from phoenix_chat.app.worker.client import WorkerClient

RELOAD_KEYS = ("model_path", "quant", "backend", "npu", "context_length")
BASE_MODEL_NOTICE = (
    "<b>This is a base model, not a chat model.</b> It was not instruction-tuned, so it "
    "continues your text rather than answering it, and often repeats the prompt. "
    "That is how the model is, not a fault. Open an instruction-tuned Gemma 3 "
    "(a “-it” file) from the File menu for real answers."
)


class ModelController(QObject):
    model_ready = Signal(dict)  # info from the worker
    model_unavailable = Signal(str)  # why (load failed or cancelled)

    def __init__(self, window: MainWindow, worker: WorkerClient, settings: SettingsModel):
        super().__init__(window)
        self.window, self.worker, self.settings = window, worker, settings
        self.info: dict | None = None
        self.load_id: str | None = None
        self._load_future: asyncio.Future | None = None
        self._base_notice_shown_for: set[str] = set()
        self.devices: list[dict] = []
        self.npu: dict = {"present": False, "reason": "not detected yet"}

        connect(
            worker,
            loading_changed=self._on_progress,
            model_changed=self._on_model,
            load_failed=self._on_load_failed,
            devices_changed=self._on_devices,
            worker_died=self._on_worker_died,
        )
        window.load_cancel.clicked.connect(self.cancel_load)
        connect_actions(
            window,
            reload_action=lambda: self.request_load(),
            model_info_action=self._show_info,
            open_file_action=self._open_file,
            open_folder_action=self._open_folder,
            embedded_action=lambda: self.settings.set("model_path", None),
        )
        choice_sets(window.quant_group, settings, "quant")
        choice_sets(window.npu_group, settings, "npu")
        choice_sets(window.context_group, settings, "context_length", lambda n: n or None)
        choice_sets(window.backend_group, settings, "backend")
        settings.subscribe(self._on_setting)
        self._sync_menus()
        self._refresh_recent()
        self._set_model_label()

    # -- loading --------------------------------------------------------------------------
    def request_load(self) -> asyncio.Future:
        """Start loading the model the settings describe; the future resolves True/False."""
        s = self.settings.values
        if self.load_id is not None:
            self.worker.cancel_load(self.load_id)
        if self._load_future is not None and not self._load_future.done():
            self._load_future.set_result(False)
        self.info = None
        backend, device = _split_backend(s.backend)
        self._load_future = asyncio.get_event_loop().create_future()
        self.load_id = self.worker.request_load(
            path=s.model_path,
            backend=backend,
            device=device,
            quant=None if s.quant == "file" else s.quant,
            context_length=s.context_length,
            npu=s.npu if s.npu != "off" else None,
        )
        self.window.show_loading(0.0, "Starting engine")
        self._set_model_label(loading=True)
        return self._load_future

    async def ensure_loaded(self) -> bool:
        """True once a model is ready in the worker, (re)loading it if needed."""
        if self.info is not None and self.worker.alive:
            return True
        future = self._load_future
        if future is None or future.done():
            future = self.request_load()
        while True:
            if await asyncio.shield(future):
                return True
            latest = self._load_future
            if latest is None or latest is future or latest.done() and not latest.result():
                return False
            # A newer load replaced the one we waited for (a menu choice): wait for that one.
            future = latest

    def cancel_load(self) -> None:
        if self.load_id is not None:
            self.worker.cancel_load(self.load_id)

    def _on_progress(self, load_id: str, fraction: float, message: str) -> None:
        if load_id == self.load_id:
            self.window.show_loading(fraction, message)

    def _on_model(self, load_id: str, info: dict) -> None:
        if load_id != self.load_id:
            return
        self.load_id = None
        self.info = info
        self.window.show_loading(None)
        self._set_model_label()
        path = info.get("path") or "<embedded>"
        if not info.get("is_instruction_tuned", True) and path not in self._base_notice_shown_for:
            self._base_notice_shown_for.add(path)
            self.window.chat.show_notice(BASE_MODEL_NOTICE, "info")
        elif info.get("is_instruction_tuned", True) or self.window.chat.notice_kind() in ("error", "warning"):
            self.window.chat.hide_notice()  # a model works now: earlier errors no longer apply
        if self._load_future is not None and not self._load_future.done():
            self._load_future.set_result(True)
        self.model_ready.emit(info)

    def _on_load_failed(self, load_id: str, message: str, cancelled: bool) -> None:
        if load_id != self.load_id:
            return
        self.load_id = None
        self.window.show_loading(None)
        self._set_model_label()
        text = "Model loading cancelled." if cancelled else f"Could not load the model: {message}"
        self.window.chat.show_notice(html.escape(text), "warning" if cancelled else "error")
        self.window.statusBar().showMessage(text, 8000)
        if self._load_future is not None and not self._load_future.done():
            self._load_future.set_result(False)
        self.model_unavailable.emit(text)

    def _on_worker_died(self, reason: str) -> None:
        self.info = None
        was_loading = self.load_id is not None
        self.load_id = None
        self.window.show_loading(None)
        self._set_model_label(dead=True)
        if was_loading and self._load_future is not None and not self._load_future.done():
            self._load_future.set_result(False)

    def _on_devices(self, devices: list, npu: dict) -> None:
        self.devices, self.npu = devices, npu
        choices = [("auto", "Auto")]
        choices += [(d["id"], d["name"]) for d in devices if d["kind"] != "cpu"]
        cpu = next((d for d in devices if d["kind"] == "cpu"), None)
        choices.append(("cpu", f"CPU — {cpu['name']}" if cpu and cpu["name"] != "CPU" else "CPU"))
        self.window.set_backend_choices(choices)
        self.window.set_npu_available(bool(npu.get("present")), npu.get("reason", ""))
        self._sync_menus()

    # -- settings ↔ menus ------------------------------------------------------------------
    def _on_setting(self, name: str, value) -> None:
        self._sync_menus()
        if name == "recent_models":
            self._refresh_recent()
        if name in RELOAD_KEYS:
            self.request_load()

    def _sync_menus(self) -> None:
        s, w = self.settings.values, self.window
        if s.quant in w.quant_actions:
            w.quant_actions[s.quant].setChecked(True)
        if s.npu in w.npu_actions:
            w.npu_actions[s.npu].setChecked(True)
        if s.context_length in w.context_actions:
            w.context_actions[s.context_length].setChecked(True)
        if s.backend in w.backend_actions:
            w.backend_actions[s.backend].setChecked(True)
        elif s.backend.startswith("vulkan") and s.backend not in w.backend_actions:
            # The device list has not arrived yet (or the GPU is gone): show the choice anyway.
            w.set_backend_choices([(k, a.text()) for k, a in w.backend_actions.items()] + [(s.backend, s.backend)])
            w.backend_actions[s.backend].setChecked(True)

    def _refresh_recent(self) -> None:
        for a in self.window.set_recent_models(self.settings.values.recent_models):
            a.triggered.connect(lambda _=False, p=a.data(): self.open_model(p))

    def open_model(self, path: str | None) -> None:
        if path is not None:
            self.settings.add_recent_model(path)
        if path == self.settings.values.model_path:
            self.request_load()
        else:
            self.settings.set("model_path", path)

    def _open_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self.window, "Open a GGUF model", str(Path.home()), "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.open_model(path)

    def _open_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self.window, "Open a Hugging Face model folder", str(Path.home()))
        if path:
            self.open_model(path)

    def _show_info(self) -> None:
        info = self.info
        if info is None:
            QMessageBox.information(self.window, "Model", "No model is loaded.")
            return
        lines = [f"{k}: {v}" for k, v in info.items() if k != "description"]
        QMessageBox.information(self.window, "Model", "\n".join(lines))

    def _set_model_label(self, loading: bool = False, dead: bool = False) -> None:
        s = self.settings.values
        name = Path(s.model_path).name if s.model_path else "Gemma 3 270M (embedded)"
        if self.info is not None:
            i = self.info
            name = i.get("name") or name
            ctx = i.get("context_length")
            quant = i.get("quant") or "file"
            quant = "weights as in file" if quant == "file" else quant
            if i.get("backend") == "cpu" and i.get("quant") not in (None, "file"):
                quant += " (the CPU reference computes in f32)"
            text = f"{name} · {quant} · {i.get('backend')} on {i.get('device')}"
            if ctx:
                text += f" · {ctx:,} ctx"
            if not i.get("is_instruction_tuned", True):
                text += " · base model"
        elif loading:
            text = f"Loading {name}…"
        elif dead:
            text = f"{name} · engine stopped (restarts on the next message)"
        else:
            text = f"{name} · not loaded"
        self.window.model_label.setText(text)
        self.window.setWindowTitle(f"{APP_TITLE} — {name}")


def _split_backend(choice: str) -> tuple[str, object]:
    """Settings' backend id → engine.load(backend=..., device=...)."""
    if choice in ("auto", "cpu"):
        return choice, None
    kind, _, dev = choice.partition(":")
    if dev.isdigit():
        return kind, int(dev)
    return kind, dev or None
