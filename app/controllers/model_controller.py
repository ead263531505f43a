"""Which model runs where: File/Model/Devices menus ↔ settings ↔ worker loads.

Owns the model's lifetime in the worker: loads on start, reloads when a setting that
shapes the model changes (file, quantization, backend, NPU, context length), shows
progress with a Cancel button, and reloads after the worker died when the next request
needs a model (`ensure_loaded`).

The settings only ever keep a choice that loaded: each load remembers what it asked for,
and when it fails the reload settings go back to the last ones that loaded (`loaded`) and
the user is told. The worker checks a new file before it drops the model it has, so a file
that cannot be opened leaves the working model in place; a later failure (memory, device)
reloads the previous model. A choice made while an answer is being written asks first:
stop the answer and reload now, reload after it, or keep the current model.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QMessageBox

from phoenix_chat.app.controllers.wiring import choice_sets, connect, connect_actions
from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.views.dialogs import ModelInfoDialog, ReloadQuestion
from phoenix_chat.app.views.main_window import APP_TITLE, QUANT_LABELS, MainWindow
from phoenix_chat.app.worker.client import WorkerClient

LOCAL_KEYS = ("model_path", "quant", "backend", "npu", "context_length", "parallel_answers")  # shape a local model only
RELOAD_KEYS = ("engine", "remote_profile", *LOCAL_KEYS)
EMBEDDED_NAME = "Gemma 3 270M (embedded)"
CHANGE_NAMES = {  # what the reload question says about the change
    "reload": "Reload model loads the model again.",
    "model_path": "The model you opened loads in place of the current one.",
    "quant": "The new quantization needs the model loaded again.",
    "backend": "The new backend needs the model loaded again.",
    "npu": "The new NPU setting needs the model loaded again.",
    "context_length": "The new context length needs the model loaded again.",
    "parallel_answers": "A new number of parallel answers needs the model loaded again (its KV slots).",
    "engine": "The engine you chose (Settings → Engine) takes over from the current one.",
    "remote_profile": "The remote server you chose takes over from the current one.",
}


class ModelController(QObject):
    model_ready = Signal(dict)  # info from the worker
    model_unavailable = Signal(str)  # a load failed or was cancelled: what the user was told

    def __init__(self, window: MainWindow, worker: WorkerClient, settings: SettingsModel):
        super().__init__(window)
        self.window, self.worker, self.settings = window, worker, settings
        self.info: dict | None = None
        self.load_id: str | None = None
        self._load_future: asyncio.Future | None = None
        self.devices: list[dict] = []
        self.npu: dict = {"present": False, "reason": "not detected yet"}
        self.loaded: dict | None = None  # the RELOAD_KEYS values of the last model that loaded
        self._requested: dict | None = None  # ... of the load in flight
        self._rolling_back = False  # settings being restored: no reload, no question
        self._after_rollback: str | None = None  # what the user is told once the previous model is back
        self.reload_waiting = False  # a reload deferred until the answer in flight finishes
        self.reload_question: ReloadQuestion | None = None
        self.info_dialog: ModelInfoDialog | None = None
        # Stops the answer being written (AppController points it at the chat's Stop).
        self.stop_answer: Callable[[], None] = self._cancel_generations
        # A remote profile's API key by profile name (EngineController points it at the keyring).
        self.api_key_for: Callable[[str], str | None] = lambda _name: None

        connect(
            worker,
            loading_changed=self._on_progress,
            model_changed=self._on_model,
            load_failed=self._on_load_failed,
            devices_changed=self._on_devices,
            worker_died=self._on_worker_died,
            generation_finished=self._on_generation_finished,
        )
        window.load_cancel.clicked.connect(self.cancel_load)
        connect_actions(
            window,
            reload_action=lambda: self._reload_for("reload"),
            model_info_action=self._show_info,
            open_file_action=self._open_file,
            open_folder_action=self._open_folder,
            embedded_action=lambda: self.open_model(None),
        )
        choice_sets(window.quant_group, settings, "quant")
        choice_sets(window.npu_group, settings, "npu")
        choice_sets(window.context_group, settings, "context_length", lambda n: n or None)
        choice_sets(window.backend_group, settings, "backend")
        choice_sets(window.parallel_group, settings, "parallel_answers")
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
        self.reload_waiting = False
        self._requested = self._reload_values()
        backend, device = _split_backend(s.backend)
        self._load_future = asyncio.get_event_loop().create_future()
        if s.engine == "remote":
            return self._request_remote()
        self.load_id = self.worker.request_load(
            path=s.model_path,
            backend=backend,
            device=device,
            quant=s.quant,  # the engine's own spelling ("file" or a WeightQuant value)
            context_length=s.context_length,
            npu=s.npu if s.npu != "off" else None,
            slots=s.parallel_answers,
        )
        self.window.show_loading(0.0, "Starting engine")
        self._set_model_label(loading=True)
        return self._load_future

    def _request_remote(self) -> asyncio.Future:
        """request_load for the remote engine: the chosen profile's server, with its key."""
        assert self._load_future is not None
        remote = self.settings.values.remote()
        if remote is None:  # a hand-edited settings file: say so, load nothing else in its place
            text = f"No remote server named “{self.settings.values.remote_profile}” is saved: see Settings → Engine."
            self.window.chat.show_notice(html.escape(text), "error")
            self._set_model_label()
            self._load_future.set_result(False)
            return self._load_future
        self.load_id = self.worker.request_remote(
            remote["url"], remote["model"], self.api_key_for(remote["name"]), remote["timeout_s"]
        )
        self.window.show_loading(0.0, "Connecting to the server")
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
        self.loaded = self._requested
        path = self.loaded["model_path"] if self.loaded and self.loaded["engine"] == "local" else None
        if path is not None:
            self.settings.add_recent_model(path)  # only files that loaded are offered again
        self.window.show_loading(None)
        self._set_model_label()
        if self._after_rollback is not None:
            self.window.chat.show_notice(html.escape(self._after_rollback), "error")
            self._after_rollback = None
        else:  # a model works now: earlier errors no longer apply (a base model's line is the chat's mode line)
            self.window.chat.hide_notice()
        if info.get("slots_note"):  # fewer answers at once than Devices → Parallel answers asked, or a shorter context
            self._say(f"Parallel answers: {info['slots_note']}.")
        if self._load_future is not None and not self._load_future.done():
            self._load_future.set_result(True)
        self.model_ready.emit(info)

    def _on_load_failed(self, load_id: str, message: str, cancelled: bool, kept: dict | None) -> None:
        """kept: the worker refused the request before dropping its model, which is this one."""
        if load_id != self.load_id:
            return
        self.load_id = None
        self.info = kept
        self.window.show_loading(None)
        failed, previous = self._requested, self.loaded
        changed = previous is not None and failed is not None and failed != previous
        reload_previous = changed and kept is None and not cancelled
        if cancelled:
            text = "Model loading cancelled."
            if changed:
                text += " The menus are back on the last model that loaded; it loads with your next message."
        else:
            text = f"Could not load {self._describe(failed)}: {message}"
            if kept is not None:
                text += f" Still using {self._describe(previous)}."
            elif reload_previous:
                text += f" Reloading the previous model, {self._describe(previous)}…"
        if changed:
            assert failed is not None and previous is not None
            if kept is not None and failed["model_path"] not in (None, previous["model_path"]):
                # The file itself was refused (missing, corrupt, unsupported): not offered again.
                self.settings.remove_recent_model(failed["model_path"])
            self._roll_back(previous)  # never keep a choice that did not load
        self.window.chat.show_notice(html.escape(text), "warning" if cancelled else "error")
        self.window.statusBar().showMessage(text, 8000)
        if reload_previous:
            self._after_rollback = f"Could not load {self._describe(failed)}: {message} The previous model is back."
            self.request_load()  # resolves the waiting future False; ensure_loaded follows the new one
        else:
            self._set_model_label()
            if self._load_future is not None and not self._load_future.done():
                self._load_future.set_result(kept is not None)
        self.model_unavailable.emit(text)

    def _on_worker_died(self, reason: str) -> None:
        self.info = None
        was_loading = self.load_id is not None
        self.load_id = None
        self.reload_waiting = False
        self._close_question()
        if was_loading and self._requested != self.loaded and self.loaded is not None:
            self._roll_back(self.loaded)  # the choice may be what killed it: never keep it
        self.window.show_loading(None)
        self._set_model_label(dead=True)
        if was_loading and self._load_future is not None and not self._load_future.done():
            self._load_future.set_result(False)

    def _roll_back(self, values: dict) -> None:
        """Put the reload settings back to `values` without starting a load or asking."""
        self._rolling_back = True
        try:
            for key, value in values.items():
                self.settings.set(key, value)
        finally:
            self._rolling_back = False

    def _on_devices(self, devices: list, npu: dict) -> None:
        self.devices, self.npu = devices, npu
        choices = [("auto", "Auto")]
        choices += [(d["id"], d["name"]) for d in devices if d["kind"] != "cpu"]
        cpu = next((d for d in devices if d["kind"] == "cpu"), None)
        choices.append(("cpu", f"CPU — {cpu['name']}" if cpu and cpu["name"] != "CPU" else "CPU"))
        self.window.set_backend_choices(choices)
        self.window.set_npu_available(bool(npu.get("present")), npu.get("reason", ""))
        self._sync_menus()

    # -- a reload while an answer is being written -------------------------------------------
    def _reload_for(self, key: str) -> None:
        """Reload now, or, while an answer is being written, ask first (`key`: what changed)."""
        if not self.worker.generations:
            self.request_load()
        elif self.reload_waiting:
            self._say(f"The model reloads with {self._describe(self._reload_values())} when the answer is finished.")
        elif self.reload_question is None:
            self._ask_reload(key)

    def _ask_reload(self, key: str) -> None:
        box = ReloadQuestion(CHANGE_NAMES.get(key, "This change needs the model loaded again."), self.window)
        box.finished.connect(lambda _result: self._on_reload_answer(box))
        self.reload_question = box
        box.open()

    def _on_reload_answer(self, box: ReloadQuestion) -> None:
        if box is not self.reload_question:
            return  # closed by us (the answer finished meanwhile, or the worker died)
        self.reload_question = None
        choice = box.choice()
        box.deleteLater()
        target = self._describe(self._reload_values())
        if choice == ReloadQuestion.KEEP or choice is None:
            if self.loaded is not None:
                self._roll_back(self.loaded)
            self._say("Kept the current model; the change was undone.")
        elif not self.worker.generations:
            self.request_load()  # the answer finished while the question was open
        elif choice == ReloadQuestion.STOP:
            self.reload_waiting = True
            self.stop_answer()
            self._say(f"Stopping the answer, then reloading with {target}.")
        else:
            self.reload_waiting = True
            self._say(f"The model reloads with {target} when the answer is finished.")
        self._set_model_label()

    def _on_generation_finished(self, *_args: object) -> None:
        if self.worker.generations:
            return
        if self.reload_question is not None:
            self._close_question()
            self.request_load()
            self._say("The answer finished; reloading the model.")
        elif self.reload_waiting:
            self.request_load()

    def _close_question(self) -> None:
        box, self.reload_question = self.reload_question, None
        if box is not None:
            box.close()
            box.deleteLater()

    def _cancel_generations(self) -> None:
        for gen_id in list(self.worker.generations):
            self.worker.cancel_generation(gen_id)

    def _say(self, text: str) -> None:
        self.window.statusBar().showMessage(text, 10000)

    # -- settings ↔ menus ------------------------------------------------------------------
    def _on_setting(self, name: str, value) -> None:
        self._sync_menus()
        if name == "recent_models":
            self._refresh_recent()
        local_only = name in LOCAL_KEYS and self.settings.values.engine == "remote"
        local_only |= name == "remote_profile" and self.settings.values.engine == "local"
        if name in RELOAD_KEYS and not self._rolling_back and not local_only:
            self._reload_for(name)

    def reload_engine(self) -> None:
        """The chosen remote profile changed (its URL, model or key): connect again."""
        self._reload_for("remote_profile")

    def engine_label(self) -> str | None:
        """Who writes answers now, as saved with each: "remote:host/model" or "local:<name>"."""
        info = self.info
        if info is None:
            return None
        if info.get("remote"):
            return f"remote:{info['host']}/{info['model']}"
        return f"local:{info.get('name') or EMBEDDED_NAME}"

    def _reload_values(self) -> dict:
        return {key: getattr(self.settings.values, key) for key in RELOAD_KEYS}

    def _describe(self, values: dict | None) -> str:
        """A load's settings in a few words: "model.gguf (Q8_0, cpu, 2,048-token context)"."""
        if values is None:
            return "the model"
        if values["engine"] == "remote":
            profile = next(
                (p for p in self.settings.values.remote_profiles if p["name"] == values["remote_profile"]), None
            )
            where = f" ({profile['url']})" if profile else ""
            return f"the remote server “{values['remote_profile']}”{where}"
        name = Path(values["model_path"]).name if values["model_path"] else EMBEDDED_NAME
        ctx = values["context_length"]
        parts = [
            QUANT_LABELS.get(values["quant"], values["quant"]).replace("As in file", "weights as in file"),
            f"{values['backend']} backend",
            f"{ctx:,}-token context" if ctx else "the model's full context",
        ]
        if values["npu"] != "off":
            parts.append("NPU prefill")
        if values.get("parallel_answers", 1) > 1:
            parts.append(f"{values['parallel_answers']} answers at once")
        return f"{name} ({', '.join(parts)})"

    def _sync_menus(self) -> None:
        s, w = self.settings.values, self.window
        for group in (w.quant_group, w.backend_group, w.npu_group, w.context_group):
            group.setEnabled(s.engine == "local")  # a remote server has its own devices and weights
        if s.quant in w.quant_actions:
            w.quant_actions[s.quant].setChecked(True)
        if s.npu in w.npu_actions:
            w.npu_actions[s.npu].setChecked(True)
        if s.context_length in w.context_actions:
            w.context_actions[s.context_length].setChecked(True)
        if s.parallel_answers in w.parallel_actions:
            w.parallel_actions[s.parallel_answers].setChecked(True)
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
        """Load `path` (None: the embedded model); it joins Recent models once it has loaded."""
        if path == self.settings.values.model_path:
            self._reload_for("model_path")
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
        if self.info_dialog is not None:
            self.info_dialog.close()
            self.info_dialog.deleteLater()
        self.info_dialog = ModelInfoDialog(info, self.window)
        self.info_dialog.open()

    def _set_model_label(self, loading: bool = False, dead: bool = False) -> None:
        s = self.settings.values
        remote = s.remote()
        name = Path(s.model_path).name if s.model_path else EMBEDDED_NAME
        if remote is not None:
            name = f"remote server “{remote['name']}”"
        if self.info is not None and self.info.get("remote"):
            i = self.info
            name = str(i["model"])
            text = f"remote: {i['host']}, {i['model']}"
            if self.reload_waiting:
                text += " · reloads after this answer"
        elif self.info is not None:
            i = self.info
            name = i.get("name") or name
            ctx = i.get("context_length")
            quant = i.get("quant") or "file"
            quant = "weights as in file" if quant == "file" else QUANT_LABELS.get(quant, quant)
            if i.get("backend") == "cpu" and i.get("quant") not in (None, "file"):
                quant += " values, computed in f32"
            text = f"{name} · {quant} · {i.get('backend')} on {i.get('device')}"
            if ctx:
                text += f" · {ctx:,} ctx"
            if i.get("slots", 1) > 1:
                text += f" · {i['slots']} answers at once"
            if not i.get("is_instruction_tuned", True):
                text += " · base model"
            if self.reload_waiting:
                text += " · reloads after this answer"
        elif loading and remote is not None:
            text = f"Connecting to {remote['url']}…"
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
