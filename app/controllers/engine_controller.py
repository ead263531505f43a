"""Settings → Engine…: this computer or a remote server ↔ settings, keyring ↔ worker.

The profiles ({name, url, model}) are settings; their API keys are in the keyring
(app/secrets.py) and reach the worker only inside a load request. "Test connection" asks the
server from a pool thread (never the GUI thread: a dead host takes seconds to time out) with the
engine's own `RemoteEngine.check()`, and fills the model list from its /v1/models. The choice is
applied through the settings, so ModelController loads it and keeps it only once it worked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import html
from urllib.parse import urlsplit

from PySide6.QtCore import QObject, Signal

from phoenix_chat.app.controllers.model_controller import ModelController
from phoenix_chat.app.secrets import SecretStore
from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.views.engine_dialog import NEW_PROFILE, EngineDialog
from phoenix_chat.app.views.main_window import MainWindow
from phoenix_chat.app.worker.client import WorkerClient

PROBE_TIMEOUT_S = 20.0
CREDENTIALS_IN_URL = "The URL holds a user name or password: put the key in the API key field (kept in the keyring)."


def has_credentials(url: str) -> bool:
    """user:password@ in the URL would be saved in settings.json with it: refused."""
    try:
        parts = urlsplit(url if "://" in url else "http://" + url)
    except ValueError:
        return False
    return "@" in parts.netloc


def probe(url: str, model: str | None, api_key: str | None) -> tuple[str, list[str]]:
    """(check()'s line, the server's model ids); RemoteError (one line, no key) when it fails."""
    from phoenix_chat.engine.remote.engine import RemoteEngine, RemoteTarget

    engine = RemoteEngine(RemoteTarget(url=url, model=model, api_key=api_key), timeout_s=PROBE_TIMEOUT_S)
    try:
        models = engine.models()
        return engine.check(), models
    finally:
        engine.close()


def insecure_warning(url: str) -> str | None:
    """The engine's own warning for plain http:// to another machine (None: none needed)."""
    from phoenix_chat.engine.remote.engine import RemoteTarget

    return RemoteTarget(url=url).insecure_warning()


class EngineController(QObject):
    tested = Signal(bool, str)  # a connection test ended: ok, the line shown (tests wait on it)

    def __init__(
        self,
        window: MainWindow,
        worker: WorkerClient,
        settings: SettingsModel,
        models: ModelController,
        secrets: SecretStore,
    ):
        super().__init__(window)
        self.window, self.worker, self.settings, self.models, self.secrets = window, worker, settings, models, secrets
        self.dialog: EngineDialog | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-probe")
        self._warned: set[str] = set()  # hosts whose plain-http warning was shown this session
        models.api_key_for = secrets.get
        window.engine_action.triggered.connect(self.open_dialog)
        worker.notice_raised.connect(self._on_notice)
        models.model_ready.connect(self._on_model_ready)

    # -- the dialog -----------------------------------------------------------------------
    def open_dialog(self) -> EngineDialog:
        if self.dialog is not None:
            self.dialog.close()
            self.dialog.deleteLater()
        s = self.settings.values
        dialog = EngineDialog([p["name"] for p in s.remote_profiles], self.window, key_note=self.secrets.problem or "")
        dialog.set_remote(s.engine == "remote")
        current = s.remote_profile or (s.remote_profiles[0]["name"] if s.remote_profiles else None)
        dialog.set_profiles([p["name"] for p in s.remote_profiles], current)
        self._show_profile(dialog, current)
        dialog.profile_chosen.connect(lambda name: self._show_profile(dialog, name or None))
        dialog.delete_requested.connect(lambda name: self._delete(dialog, name))
        dialog.test_requested.connect(lambda: self._test(dialog))
        dialog.accepted.connect(lambda: self.apply(dialog))
        self.dialog = dialog
        dialog.open()
        return dialog

    def _show_profile(self, dialog: EngineDialog, name: str | None) -> None:
        profile = self._profile(name)
        dialog.show_profile(profile, self.secrets.get(name) if profile and name else None)

    def _profile(self, name: str | None) -> dict | None:
        return next((p for p in self.settings.values.remote_profiles if p["name"] == name), None)

    def _delete(self, dialog: EngineDialog, name: str) -> None:
        if not name:
            return
        self.secrets.delete(name)
        self.settings.remove_remote_profile(name)  # the engine goes back to this computer if it was this one
        names = [p["name"] for p in self.settings.values.remote_profiles]
        dialog.set_profiles(names, names[0] if names else NEW_PROFILE)
        self._show_profile(dialog, names[0] if names else None)

    def _test(self, dialog: EngineDialog) -> None:
        profile = dialog.profile()
        if not profile["url"]:
            dialog.set_status("Type the server's URL first.", False)
            return
        if has_credentials(profile["url"]):
            dialog.set_status(CREDENTIALS_IN_URL, False)
            self.tested.emit(False, CREDENTIALS_IN_URL)
            return
        dialog.set_testing(True)
        key = dialog.api_key.text() or None
        future = asyncio.get_event_loop().run_in_executor(self._pool, probe, profile["url"], profile["model"], key)
        future.add_done_callback(lambda f: self._on_tested(dialog, profile, f))

    def _on_tested(self, dialog: EngineDialog, profile: dict, future: asyncio.Future) -> None:
        if future.cancelled() or dialog is not self.dialog:
            return  # the dialog it was for has been replaced (and deleted) meanwhile
        dialog.set_testing(False)
        exc = future.exception()
        if exc is not None:
            from phoenix_chat.engine.errors import PhoenixError

            line = str(exc) if isinstance(exc, PhoenixError) else f"{type(exc).__name__}: {exc}"
            dialog.set_status(line, False)
            self.tested.emit(False, line)
            return
        line, models = future.result()
        warning = insecure_warning(profile["url"])
        shown = f"{line}\n{warning}" if warning else line
        dialog.set_models(models, profile["model"])
        dialog.set_status(shown, True)
        self.tested.emit(True, shown)

    def apply(self, dialog: EngineDialog) -> None:
        """OK: save the profile (key to the keyring) and switch the engine; the load follows."""
        if not dialog.remote_chosen():
            self.settings.set("engine", "local")
            return
        profile = dialog.profile()
        if not profile["url"] or has_credentials(profile["url"]):
            why = CREDENTIALS_IN_URL if profile["url"] else "No server URL given."
            self.window.statusBar().showMessage(f"{why} The engine was not changed.", 10000)
            return
        editing = dialog.editing()
        old = self._profile(editing) if editing else None
        old_key = self.secrets.get(editing) if editing else None
        self.settings.save_remote_profile(profile, replacing=editing)
        if editing and editing != profile["name"]:
            self.secrets.delete(editing)
        key = dialog.api_key.text()
        self.secrets.set(profile["name"], key or None)
        if self.secrets.problem:
            self.window.statusBar().showMessage(self.secrets.problem, 10000)
        s = self.settings.values
        same = s.engine == "remote" and s.remote_profile == profile["name"] == editing
        self.settings.set("remote_profile", profile["name"])  # while local, this alone loads nothing
        self.settings.set("engine", "remote")
        if same and (old != profile or (old_key or "") != key):
            self.models.reload_engine()  # the server in use changed its URL, model or key

    # -- while it runs --------------------------------------------------------------------
    def _on_notice(self, _gen_id: str, message: str) -> None:
        self.window.statusBar().showMessage(message, 10000)

    def _on_model_ready(self, info: dict) -> None:
        warning = info.get("insecure_warning")
        if info.get("remote") and warning and info["host"] not in self._warned:
            self._warned.add(info["host"])  # once per host and session
            self.window.chat.show_notice(html.escape(warning), "warning")
            self.window.statusBar().showMessage(warning, 10000)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
