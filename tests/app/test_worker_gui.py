"""The worker process boundary: menu choices reach it and persist, loading can be cancelled,
and a killed worker loses nothing but the answer in flight (real worker, real model)."""

from __future__ import annotations

import sqlite3

import pytest
from PySide6.QtCore import Qt

from phoenix_chat.app.store import db_path
from tests.app.conftest import ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, preset, wait_loaded

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def test_menu_choice_reaches_the_worker_and_survives_a_restart(qtbot, make_app, home):
    preset(home, context_length=4096)
    app = make_app()
    assert wait_loaded(qtbot, app)["context_length"] == 4096
    # Devices → Context length → 2,048 tokens: the worker reloads the model with it.
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as loaded:
        app.window.context_actions[2048].trigger()
        assert app.window.load_progress.isVisible()
    assert loaded.args[0]["context_length"] == 2048
    # Devices → Backend → CPU, Model → Quantization → Q8_0: persisted and sent to the worker.
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as loaded:
        app.window.backend_actions["cpu"].trigger()
    assert loaded.args[0]["backend"] == "cpu"
    app.shutdown()

    again = make_app()
    assert again.settings.values.context_length == 2048
    assert again.settings.values.backend == "cpu"
    assert again.window.context_actions[2048].isChecked()
    assert again.window.backend_actions["cpu"].isChecked()
    info = wait_loaded(qtbot, again)
    assert info["context_length"] == 2048 and info["backend"] == "cpu"


@pytest.mark.cold_cache  # a first start's load (it builds the tokenizer too): long enough to cancel
def test_model_loading_shows_progress_and_can_be_cancelled(qtbot, make_app, home):
    app = make_app()
    w = app.window
    qtbot.waitUntil(lambda: w.load_progress.isVisible(), timeout=5_000)
    with qtbot.waitSignal(app.models.model_unavailable, timeout=LOAD_TIMEOUT_MS) as failed:
        qtbot.mouseClick(w.load_cancel, Qt.LeftButton)
    assert "cancelled" in failed.args[0]
    assert not w.load_progress.isVisible()
    assert "cancelled" in w.chat.notice.text()
    # The next message loads the model again and gets an answer.
    app.chat.set_chat_settings("", {**app.settings.values.sampling_defaults(), "max_tokens": 2})
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS):
        app.chat.send("Hello")


def test_killing_the_worker_mid_answer_keeps_history_and_recovers(qtbot, make_app, home):
    preset(home, max_tokens=400, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    old_pid = app.worker.process.pid
    text = []
    app.worker.tokens_changed.connect(lambda _id, t: text.append(t))
    with qtbot.waitSignal(app.worker.tokens_changed, timeout=ANSWER_TIMEOUT_MS):
        app.chat.set_chat_mode("chat")  # completion mode (the base model's default) would end at a blank line
        app.chat.send("Tell me a long story about a phoenix.")
    # The growing answer reaches the database while it streams (saved every 0.5 s).
    db = sqlite3.connect(db_path(home))
    qtbot.waitUntil(
        lambda: (
            (db.execute("SELECT content, complete FROM messages WHERE role='assistant'").fetchone() or ("", 1))[0] != ""
        ),
        timeout=ANSWER_TIMEOUT_MS,
    )
    assert db.execute("SELECT complete FROM messages WHERE role='assistant'").fetchone()[0] == 0

    with qtbot.waitSignal(app.worker.worker_died, timeout=10_000):
        app.worker.process.kill()
    notice = app.window.chat.notice
    assert notice.isVisible() and "engine stopped" in notice.text()
    assert "restarts" in app.window.model_label.text()
    transcript = app.window.chat.transcript_text()
    assert "Tell me a long story about a phoenix." in transcript
    assert "Interrupted" in transcript
    app.store.flush()
    rows = db.execute("SELECT role, content, complete FROM messages ORDER BY position").fetchall()
    assert rows[0] == ("user", "Tell me a long story about a phoenix.", 1)
    assert rows[1][0] == "assistant" and rows[1][1] == "".join(text) and rows[1][2] == 1
    assert app.window.chat.send_button.isEnabled()

    # The next message starts a fresh worker, reloads the model and answers.
    app.chat.set_chat_settings("", {**app.settings.values.sampling_defaults(), "max_tokens": 3})
    with qtbot.waitSignal(app.chat.answer_finished, timeout=LOAD_TIMEOUT_MS + ANSWER_TIMEOUT_MS) as done:
        app.chat.send("And then?")
    assert done.args[1] in ("length", "stop")
    assert app.worker.process.pid != old_pid
    app.store.flush()
    roles = [r[0] for r in db.execute("SELECT role FROM messages ORDER BY position")]
    assert roles == ["user", "assistant", "user", "assistant"]


def test_devices_menu_lists_the_workers_devices_and_greys_out_an_absent_npu(qtbot, make_app):
    from phoenix_chat.engine.devices import list_devices

    app = make_app(autoload=False)
    qtbot.waitUntil(lambda: bool(app.models.devices), timeout=120_000)
    labels = [a.text() for a in app.window.backend_actions.values()]
    assert labels[0] == "Auto" and labels[-1].startswith("CPU")
    for entry in list_devices():
        if entry.kind == "vulkan" and entry.available:
            assert any(label.startswith(entry.name) for label in labels)
    npu = next(e for e in list_devices() if e.kind == "npu")
    prefill = app.window.npu_actions["prefill"]
    assert prefill.isEnabled() == npu.available
    if not npu.available:
        assert app.window.npu_reason_action.isVisible()
        assert npu.status in app.window.npu_reason_action.text()
        assert app.window.devices.npu.text == "not present"


def test_a_message_sent_while_loading_waits_for_the_model_even_across_a_reload(qtbot, make_app, home):
    preset(home, max_tokens=2, temperature=0.0)
    app = make_app()
    app.chat.send("Hello")  # the model is still loading: the answer waits
    assert app.window.chat.stop_button.isEnabled()
    with qtbot.waitSignal(app.chat.answer_finished, timeout=2 * LOAD_TIMEOUT_MS) as done:
        app.window.context_actions[2048].trigger()  # a reload replaces the load in flight
    assert done.args[1] in ("length", "stop")
    assert app.models.info["context_length"] == 2048
    assert app.window.context_label.text().endswith("/2,048")
