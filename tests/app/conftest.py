"""Fixtures for the desktop app tests: offscreen Qt, one qasync loop, a fresh home per test.

The app tests run the real worker process on the real embedded model, with short answers
(a few tokens) so they stay quick on a small CPU.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from phoenix_chat.app.qt_compat import guard_singleton_refcounts  # noqa: E402

guard_singleton_refcounts()  # PySide6 6.12 on Python 3.11: see app/qt_compat.py

qasync = pytest.importorskip("qasync")

LOAD_TIMEOUT_MS = 240_000  # the embedded model on the numpy CPU backend of a busy 2-core box
ANSWER_TIMEOUT_MS = 240_000


@pytest.fixture(scope="session")
def qloop(qapp):
    """A qasync loop marked as running, so pytest-qt's waits also run asyncio callbacks."""
    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    yield loop


@pytest.fixture
def home(request, tmp_path, monkeypatch):
    """A fresh data and cache folder for the test's app, with the embedded model's tokenizer
    already built, as after a first start: building it costs every app process ~2-4 s on a busy
    2-core box. A test marked `cold_cache` gets it empty (a first start: the load builds it)."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("PHOENIX_CHAT_HOME", str(path))
    if request.node.get_closest_marker("cold_cache") is None:
        folder = path / "cache" / "tokenizers"
        folder.mkdir(parents=True)
        shutil.copy(request.getfixturevalue("embedded_tokenizer_file"), folder)
    return path


@pytest.fixture(scope="session")
def embedded_tokenizer_file(tmp_path_factory, gguf) -> Path:
    """The embedded model's tokenizer as the engine caches it (built once a session, ~2 s)."""
    from phoenix_chat.engine.paths import cache_dir
    from phoenix_chat.engine.tokenizer import gguf_cache_key

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PHOENIX_CHAT_HOME", str(tmp_path_factory.mktemp("tokenizer-home")))
        gguf.tokenizer()
        return cache_dir() / "tokenizers" / f"{gguf_cache_key(gguf.path)}.json"


def preset(home, **values):
    """Write settings before the app starts (e.g. a short max_tokens, greedy sampling)."""
    from phoenix_chat.app.settings import SettingsModel

    model = SettingsModel(home)
    for k, v in values.items():
        model.set(k, v)


@pytest.fixture
def make_app(qtbot, qloop, home):
    """Build AppControllers on `home`; all are shut down (worker stopped) at the end."""
    from phoenix_chat.app.controllers.app_controller import AppController

    made = []

    def make(**kwargs):
        kwargs.setdefault("sysfs_root", str(home / "no-sysfs"))
        controller = AppController(home, **kwargs)
        made.append(controller)
        controller.show()
        return controller

    yield make
    for c in made:
        c.shutdown()
        c.window.deleteLater()


def wait_loaded(qtbot, controller):
    """Wait until the worker has the model (returns the model info)."""
    if controller.models.info is None:
        with qtbot.waitSignal(controller.models.model_ready, timeout=LOAD_TIMEOUT_MS) as blocker:
            pass
        return blocker.args[0]
    return controller.models.info
