"""The desktop app's runtime files (icons/, themes/, the .desktop entry), shipped as package data.

Code finds them through `path()`, never through a path relative to the checkout: installed from a
wheel this folder is the package `resources` in site-packages, with no repository around it.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# Every file here that the app or an installer uses; tests check each one resolves and is packaged.
FILES = ("icons/phoenix.svg", "themes/light.qss", "themes/dark.qss", "phoenix-chat.desktop")


def path(name: str) -> Path:
    """Filesystem path of a resource, `name` relative to this folder ("themes/dark.qss").

    A real file: wheels install unpacked, and Qt (QIcon) wants a path, not a stream.
    """
    t = files(__name__)
    for part in name.split("/"):
        t = t / part
    return Path(str(t))
