"""Where Phoenix Chat keeps its files.

`$PHOENIX_CHAT_HOME` moves everything under one folder (tests and portable installs use it);
otherwise the platform's usual per-user folders are used. Nothing here creates folders: callers
`mkdir(parents=True, exist_ok=True)` what they write to.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_NAME = "phoenix-chat"
HOME_ENV = "PHOENIX_CHAT_HOME"


def _home_override() -> Path | None:
    value = os.environ.get(HOME_ENV, "").strip()
    return Path(value).expanduser() if value else None


def data_dir() -> Path:
    """Per-user data (chat history, settings, downloaded models)."""
    home = _home_override()
    if home is not None:
        return home
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / APP_NAME
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / APP_NAME
    base = os.environ.get("XDG_DATA_HOME", "").strip() or str(Path.home() / ".local" / "share")
    return Path(base) / APP_NAME


def cache_dir() -> Path:
    """Files that can be rebuilt at any time (built tokenizers, compiled pipelines)."""
    home = _home_override()
    if home is not None:
        return home / "cache"
    if sys.platform == "win32":
        return data_dir() / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / APP_NAME
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / APP_NAME
