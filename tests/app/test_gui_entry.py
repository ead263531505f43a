"""`display_available()`: what the CLI asks before opening the window."""

from __future__ import annotations

from phoenix_chat.app import gui


def test_no_display_means_terminal(monkeypatch):
    for var in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(var, raising=False)
    assert gui.display_available() is False


def test_explicit_qt_platform_counts(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert gui.display_available() is True


def test_stale_local_x_display_is_absent_and_a_live_one_present(monkeypatch, tmp_path):
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("DISPLAY", ":987")
    assert gui.display_available() is False
    monkeypatch.setattr(gui.os.path, "exists", lambda p: p == "/tmp/.X11-unix/X987")
    assert gui.display_available() is True
    monkeypatch.setenv("DISPLAY", "otherhost:0")
    assert gui.display_available() is True


def test_wayland_socket(monkeypatch, tmp_path):
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    assert gui.display_available() is False
    (tmp_path / "wayland-0").touch()
    assert gui.display_available() is True
