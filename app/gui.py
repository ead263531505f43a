"""Desktop app entry points for the CLI: `display_available()` and `run_gui()`."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import cast

EXIT_IN_USE = 2  # the CLI's exit code for a user error: here, the data folder is taken


def display_available() -> bool:
    """True when a window can be shown: a live X11/Wayland display, or an explicit Qt platform.

    A local display whose socket is gone (a stale $DISPLAY in an ssh or container shell)
    counts as absent, so the CLI falls back to the terminal chat instead of Qt aborting.
    """
    if os.environ.get("QT_QPA_PLATFORM"):
        return True
    if sys.platform in ("win32", "darwin"):
        return True
    wayland = os.environ.get("WAYLAND_DISPLAY")
    if wayland:
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        if os.path.isabs(wayland) or not runtime or os.path.exists(os.path.join(runtime, wayland)):
            return True
    return _x11_display_live(os.environ.get("DISPLAY", ""))


def _x11_display_live(display: str) -> bool:
    if not display:
        return False
    host, _, rest = display.rpartition(":")
    number = rest.split(".")[0]
    if host not in ("", "unix") or not number.isdigit():
        return True  # a remote or unusual display: let Qt try it
    return os.path.exists(f"/tmp/.X11-unix/X{number}")


def run_gui(model_path: str | None = None, home=None) -> int:
    """Open the main window (on `model_path`, else the last or embedded model); exit code."""
    started = time.perf_counter()
    from PySide6.QtWidgets import QApplication, QMessageBox

    from phoenix_chat.app.data_lock import DataFolderInUse, DataFolderLock
    from phoenix_chat.app.views.theme import app_icon

    app = cast(QApplication, QApplication.instance() or QApplication(sys.argv[:1]))
    app.setApplicationName("Phoenix Chat")
    app.setOrganizationName("Phoenix Chat")
    app.setDesktopFileName("phoenix-chat")
    app.setWindowIcon(app_icon())
    try:
        lock = DataFolderLock(home)
    except DataFolderInUse as exc:
        print(f"phoenix-chat: error: {exc}", file=sys.stderr)
        QMessageBox.critical(None, "Phoenix Chat is already running", str(exc))
        return EXIT_IN_USE
    try:
        return _run_window(app, started, model_path, home)
    finally:
        lock.release()


def _run_window(app, started: float, model_path: str | None, home) -> int:
    import qasync

    from phoenix_chat.app.controllers.app_controller import AppController
    from phoenix_chat.app.quit_signals import SignalQuitter

    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    controller = AppController(home, model_path=model_path)
    controller.show()
    if os.environ.get("PHOENIX_CHAT_TIMING"):
        _report_startup(started, controller)
    app.aboutToQuit.connect(controller.shutdown)
    # Ctrl+C / SIGTERM close the window cleanly (history saved, worker stopped).

    def close() -> None:
        controller.window.close()
        app.quit()

    quitter = SignalQuitter(close, app)
    with loop:
        code = loop.run_forever()
    del quitter
    return int(code or 0)


def _report_startup(started: float, controller) -> None:
    """PHOENIX_CHAT_TIMING=1: print when the window takes input and when the model is ready."""
    import psutil
    from PySide6.QtCore import QTimer

    launched = psutil.Process().create_time()  # wall clock: includes interpreter start-up

    def since_launch() -> float:
        return time.time() - launched

    def interactive():
        print(
            f"interactive window {since_launch():.2f} s after launch "
            f"({time.perf_counter() - started:.2f} s in run_gui)",
            file=sys.stderr,
        )

    QTimer.singleShot(0, interactive)  # runs on the first event-loop turn after show()
    controller.models.model_ready.connect(
        lambda info: print(
            f"model ready {since_launch():.2f} s after launch (load in the worker {info.get('load_s', 0):.2f} s)",
            file=sys.stderr,
        )
    )


if __name__ == "__main__":
    sys.exit(run_gui(sys.argv[1] if len(sys.argv) > 1 else None))
