"""Where the app keeps its files: `$PHOENIX_CHAT_HOME`, else the platform data folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def data_dir(home: str | os.PathLike | None = None) -> Path:
    """The app's data folder (created on first use).

    `home` wins, then `$PHOENIX_CHAT_HOME`, then `engine.paths.data_dir()` when the engine
    provides it, then the platform convention (XDG on Linux).
    """
    if home is not None:
        path = Path(home)
    elif os.environ.get("PHOENIX_CHAT_HOME"):
        path = Path(os.environ["PHOENIX_CHAT_HOME"])
    else:
        try:
            from phoenix_chat.engine.paths import data_dir as engine_data_dir

            path = Path(engine_data_dir())
        except ImportError:
            path = _platform_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _platform_data_dir() -> Path:
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "phoenix-chat"
