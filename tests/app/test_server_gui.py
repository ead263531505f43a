"""Server menu: the local OpenAI-compatible server runs inside the worker beside its scheduler
(real worker, embedded model, CPU backend, the real `openai` client over a real socket)."""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest
from PySide6.QtWidgets import QApplication

from phoenix_chat.engine.generate import generate
from phoenix_chat.engine.sampling import SamplingParams
from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded

pytestmark = [pytest.mark.gui, pytest.mark.slow]
openai = pytest.importorskip("openai")

START_MS = 30_000
STORY = [{"role": "user", "content": "Tell me a story about a phoenix."}]


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_server_menu_serves_the_openai_client_and_shows_it_active(qtbot, make_app, home, cpu_model):
    preset(home, backend="cpu", server_port=0)
    app = make_app()
    wait_loaded(qtbot, app)
    w = app.window
    assert not w.server_action.isChecked() and not w.copy_url_action.isEnabled()
    w.server_action.trigger()  # Server → Run local server (OpenAI API)
    qtbot.waitUntil(lambda: app.server.url is not None, timeout=START_MS)
    url = app.server.url
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    assert url in w.server_label.text() and w.server_action.isChecked()
    assert app.settings.values.server_enabled

    # a streaming request from the openai client shows as active in the GUI while it runs
    result: dict = {}

    def ask() -> None:
        client = openai.OpenAI(base_url=url, api_key="unused-on-loopback")
        stream = client.chat.completions.create(
            model=client.models.list().data[0].id,  # the loaded model's name
            messages=STORY,
            max_tokens=40,
            temperature=0.0,
            stream=True,
        )
        parts, reasons = [], []
        for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                reasons.append(chunk.choices[0].finish_reason)
        result["text"], result["reason"] = "".join(parts), [r for r in reasons if r]

    asker = threading.Thread(target=ask)
    asker.start()
    qtbot.waitUntil(lambda: app.server.active >= 1 and "1 active" in w.server_label.text(), timeout=ANSWER_TIMEOUT_MS)
    qtbot.waitUntil(lambda: not asker.is_alive(), timeout=ANSWER_TIMEOUT_MS)
    asker.join()
    assert result["text"].strip() and result["reason"] in (["length"], ["stop"])
    # what the worker's engine answered is the engine's greedy answer (this process's CPU model)
    assert result["text"] == generate(cpu_model, STORY, SamplingParams(temperature=0.0), max_tokens=40)
    qtbot.waitUntil(lambda: "0 active" in w.server_label.text(), timeout=START_MS)

    w.copy_url_action.trigger()  # Server → Copy URL
    assert QApplication.clipboard().text() == url

    w.server_action.trigger()  # unchecked: the worker closes the port
    qtbot.waitUntil(lambda: app.server.url is None, timeout=START_MS)
    assert not w.server_action.isChecked() and not app.settings.values.server_enabled
    assert _refused(_port(url))


def test_server_setting_persists_starts_at_launch_and_a_port_in_use_is_one_line(qtbot, make_app, home):
    preset(home, backend="cpu", server_port=0)
    first = make_app()
    wait_loaded(qtbot, first)
    first.window.server_action.trigger()
    qtbot.waitUntil(lambda: first.server.url is not None, timeout=START_MS)
    old = first.server.url
    first.shutdown()
    qtbot.waitUntil(lambda: _refused(_port(old)), timeout=START_MS)  # the worker's exit took the server with it

    again = make_app()  # the server starts at launch, once the model is loaded
    assert again.settings.values.server_enabled and again.window.server_action.isChecked()
    wait_loaded(qtbot, again)
    qtbot.waitUntil(lambda: again.server.url is not None, timeout=START_MS)
    with urllib.request.urlopen(again.server.url.removesuffix("/v1") + "/health", timeout=10) as reply:
        assert reply.status == 200

    # a port in use: one line in the status bar, the action unchecked, the setting off
    again.window.server_action.trigger()
    qtbot.waitUntil(lambda: again.server.url is None, timeout=START_MS)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        again.settings.set("server_port", taken.getsockname()[1])
        again.window.server_action.trigger()
        qtbot.waitUntil(lambda: "cannot listen" in again.window.server_label.text(), timeout=START_MS)
        assert not again.window.server_action.isChecked()
        assert not again.settings.values.server_enabled and again.server.url is None
    finally:
        taken.close()
