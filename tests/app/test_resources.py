"""resources/ is package data: the helper finds every file (tests/test_wheel.py checks that a
wheel carries every one)."""

from __future__ import annotations

from pathlib import Path

from phoenix_chat import resources
from phoenix_chat.app.views import theme

ROOT = Path(__file__).resolve().parents[2]


def _files_in_folder() -> set[str]:
    folder = ROOT / "resources"
    return {
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
    }


def test_helper_resolves_every_resource_the_app_uses():
    assert set(resources.FILES) == _files_in_folder()  # a new file must be listed (and so tested)
    for name in resources.FILES:
        assert resources.path(name).is_file(), name
    for name in theme._COLORS:  # apply_theme() loads themes/<name>.qss
        assert f"themes/{name}.qss" in resources.FILES
