"""The local OpenAI-compatible server inside the worker process, beside the scheduler.

The GUI is not an HTTP client: the model is loaded once, in the worker, and the app's chats and
every HTTP client submit to the same `Scheduler`. `ServerHost` keeps what the GUI asked for
(on, port) across model loads: a reload stops the server (it held the old scheduler) and starts it
again on the new one. It tells the GUI where it stands through `report(status)` whenever that
changes (a ticker looks twice a second while the server runs: the active request count moves).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phoenix_chat.engine.scheduler import Scheduler

TICK_S = 0.5
LOOPBACK = "127.0.0.1"  # the app binds this machine only, so no API key is needed


class ServerHost:
    def __init__(self, report: Callable[[dict], None]) -> None:
        self._report = report
        self.port: int | None = None  # wanted port; None: the server is off
        self.server: Any = None  # app.server.running.RunningServer while it listens
        self.scheduler: Scheduler | None = None
        self.error: str | None = None
        self._lock = threading.Lock()
        self._last: dict | None = None
        self._closed = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- the GUI's wishes and the model's lifetime -------------------------------------------
    def want(self, enabled: bool, port: int) -> None:
        """Start (on `port`; 0: any free one) or stop; without a model it starts at the next load."""
        if self._ticker is None:  # the first wish: from now on changes are reported
            self._ticker = threading.Thread(target=self._tick, name="server-status", daemon=True)
            self._ticker.start()
        self._stop_server()
        self.error = None
        self.port = port if enabled else None
        self._start_server()
        self.send_status(force=True)

    def attach(self, scheduler: Scheduler) -> None:
        """A model was loaded: serve it when the server is wanted."""
        self.scheduler = scheduler
        self._start_server()
        self.send_status(force=True)

    def detach(self) -> None:
        """The model is about to close: stop serving its scheduler."""
        self._stop_server()
        self.scheduler = None
        self.send_status()

    def close(self) -> None:
        self._closed.set()
        self._stop_server()

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> dict:
        server, scheduler = self.server, self.scheduler
        active = scheduler.active + scheduler.waiting if server is not None and scheduler is not None else 0
        return {
            "running": server is not None,
            "wanted": self.port is not None,
            "url": f"{server.url}/v1" if server is not None else None,
            "active": active,  # requests the engine is serving or holding in its queue (chats' too)
            "error": self.error,
        }

    def send_status(self, force: bool = False) -> None:
        status = self.status()
        with self._lock:
            if not force and status == self._last:
                return
            self._last = status
        self._report(status)

    # -- inside -----------------------------------------------------------------------------------
    def _start_server(self) -> None:
        if self.port is None or self.scheduler is None or self.server is not None:
            return
        from phoenix_chat.app.server.config import ServerConfig
        from phoenix_chat.app.server.running import start_server
        from phoenix_chat.engine.errors import PhoenixError

        try:
            self.server = start_server(self.scheduler, ServerConfig(host=LOOPBACK, port=self.port))
        except PhoenixError as exc:  # the port is in use, most likely: one line for the GUI
            self.error = str(exc)
            self.port = None

    def _stop_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    def _tick(self) -> None:
        while not self._closed.wait(TICK_S):
            self.send_status()
