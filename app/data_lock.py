"""One app per data folder: a second instance is told, instead of sharing the history.

Two windows on one folder would each keep their own view of the conversations and
overwrite each other's settings. The lock is a QLockFile in the data folder: it holds the
owner's PID, so a lock left by a crashed or `kill -9`-ed app is seen as stale and taken
over, and it never expires by age while its owner runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QLockFile

from phoenix_chat.app.paths import data_dir

LOCK_NAME = "phoenix-chat.lock"


class DataFolderInUse(Exception):
    """Another running Phoenix Chat holds the data folder."""


class DataFolderLock:
    """Held while the app runs; `release()` (or the process ending) frees it."""

    def __init__(self, home: str | os.PathLike | None = None):
        self.folder = data_dir(home)
        self.path = Path(self.folder) / LOCK_NAME
        self._lock = QLockFile(str(self.path))
        self._lock.setStaleLockTime(0)  # stale only when its owner is gone, never by age
        if not self._lock.tryLock(0):
            raise DataFolderInUse(self._explain())

    def release(self) -> None:
        self._lock.unlock()

    def _explain(self) -> str:
        pid, host, _app = self._lock.getLockInfo()  # PySide6: (0, "", "") when unreadable
        owner = f"process {pid}" + (f" on {host}" if host else "") if pid else "another process"
        return (
            f"Phoenix Chat is already running on the data folder {self.folder} ({owner}). "
            "Switch to that window, or set PHOENIX_CHAT_HOME to use another folder."
        )
