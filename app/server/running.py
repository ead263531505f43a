"""Hosting the app beside a loaded model: uvicorn on a background thread, stopped cleanly.

The CLI's `serve` and (later) the GUI's engine worker both call `start_server(scheduler,
config)` in the process that holds the model; the socket is bound before the thread starts, so a
port in use fails here, at once, and `port=0` learns its port.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import TYPE_CHECKING

import uvicorn

from .asgi import build_app
from .config import ServerConfig, ServerConfigError, is_loopback
from .state import ServerState

if TYPE_CHECKING:
    from phoenix_chat.engine.scheduler import Scheduler

log = logging.getLogger("phoenix.server")

STARTUP_TIMEOUT_S = 30.0
GRACEFUL_SHUTDOWN_S = 3  # open streams get this long before they are cut (their requests cancelled)


class RunningServer:
    """A server listening on a thread of its own; `stop()` ends it (idempotent)."""

    def __init__(self, state: ServerState, server: uvicorn.Server, sock: socket.socket) -> None:
        self.state = state
        self._server = server
        self._socket = sock
        self.host, self.port = sock.getsockname()[:2]
        self._thread = threading.Thread(target=self._run, name="phoenix-server", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """The base URL clients use (…/v1 is the OpenAI base)."""
        host = self.state.config.host
        host = f"[{host}]" if ":" in host else host
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._socket])
        except BaseException as exc:  # reported by start()/stop(); a thread has no caller to raise to
            self._error = exc

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerConfigError(f"the server did not start: {self._error or 'timed out'}")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(GRACEFUL_SHUTDOWN_S + 10)
        self._socket.close()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket, or a one-line ServerConfigError (port in use, no such address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ServerConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def start_server(scheduler: Scheduler, config: ServerConfig, access_log: bool = False) -> RunningServer:
    """Check `config` (a non-loopback bind without a key is refused), bind, serve on a thread."""
    config.check()
    state = ServerState(scheduler, config)
    sock = bind_socket(config.host, config.port)
    uv_config = uvicorn.Config(
        build_app(state),
        log_level="info" if access_log else "warning",
        access_log=access_log,  # method, path and status only: headers (the key) are never logged
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        server_header=False,
        lifespan="off",
    )
    running = RunningServer(state, uvicorn.Server(uv_config), sock)
    running.start()
    where = "this machine only" if is_loopback(config.host) else "the network (API key required)"
    log.info("serving %s at %s/v1 for %s", state.model_id, running.url, where)
    return running
