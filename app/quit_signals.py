"""Ctrl+C and SIGTERM close the app from the event loop, never from inside other code.

Python runs a signal handler between two bytecodes of whatever is running; in the GUI that
is some slot, often the gauge timer's tick. Closing the window from there shut the gauge
thread pool under that very tick (`RuntimeError: cannot schedule new futures after
shutdown`) and could close the store under a write. So the Python handler does nothing:
Python writes the signal number to a socket (`signal.set_wakeup_fd`), and a
QSocketNotifier reads it on the event loop, where closing is safe. It also wakes the loop
at once, with no polling timer.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable

from PySide6.QtCore import QObject, QSocketNotifier

QUIT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalQuitter(QObject):
    """Calls `close` once, on the event loop, when one of QUIT_SIGNALS arrives."""

    def __init__(self, close: Callable[[], None], parent: QObject | None = None):
        super().__init__(parent)
        self._close = close
        self._closed = False
        self._read, self._write = socket.socketpair()
        for s in (self._read, self._write):
            s.setblocking(False)
        signal.set_wakeup_fd(self._write.fileno())
        for sig in QUIT_SIGNALS:
            signal.signal(sig, lambda *_: None)  # the wakeup fd does the work
        self._notifier = QSocketNotifier(self._read.fileno(), QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._on_wakeup)

    def _on_wakeup(self) -> None:
        try:
            received = self._read.recv(64)
        except BlockingIOError:
            return
        if self._closed or not any(b in received for b in QUIT_SIGNALS):
            return
        self._closed = True
        self._close()
