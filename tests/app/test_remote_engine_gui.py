"""Remote engines in the app (issue 21): the real window and worker process answer through a real
Phoenix Chat `serve` (start_server beside a Scheduler on the embedded 270M, CPU, in this process,
with an API key), chosen in Settings → Engine…, and through llama.cpp's own server
(tests/conftest.py: llama_cpp_server, the same GGUF) from a saved profile.

The keys are kept by `MemoryKeyring` (tests/app/test_remote_settings.py: keyring's plugin API, a
dict) since this machine has no OS keyring."""

from __future__ import annotations

import json
import socket
import sqlite3
import time

import pytest
from PySide6.QtWidgets import QDialogButtonBox

from phoenix_chat.app.secrets import SERVICE, SecretStore
from phoenix_chat.app.server.config import ServerConfig
from phoenix_chat.app.server.running import start_server
from phoenix_chat.app.store import db_path
from phoenix_chat.engine.loader import load
from phoenix_chat.engine.scheduler import Scheduler
from tests.app.conftest import ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, preset, wait_loaded
from tests.app.test_remote_settings import MemoryKeyring
from tests.conftest import LLAMA_CPP_MODEL_ID, llama_cpp_disconnects

pytestmark = [pytest.mark.gui, pytest.mark.slow]
pytest.importorskip("openai")

KEY = "sk-phoenix-remote-7d1e93ab"  # the server's key; it must reach it and go nowhere else
CONTEXT = 512
SERVER_MS = 30_000


@pytest.fixture(scope="module")
def served(model_path):
    """The embedded model behind a real `serve` on 127.0.0.1 (any free port), key required."""
    model = load(model_path, backend="cpu", context_length=CONTEXT)
    scheduler = Scheduler(model)
    with start_server(scheduler, ServerConfig(port=0, api_key=KEY)) as running:
        yield running, scheduler, model
    scheduler.close()
    model.close()


def keyring_with(name: str | None = None) -> SecretStore:
    backend = MemoryKeyring()
    if name is not None:
        backend.set_password(SERVICE, name, KEY)
    return SecretStore(backend)


def remote_app(make_app, home, url: str, *, max_tokens: int, secrets: SecretStore | None = None, **extra):
    """The app started on a saved remote profile "box" whose key is in the keyring."""
    preset(
        home,
        max_tokens=max_tokens,
        temperature=0.0,
        remote_profiles=[{"name": "box", "url": url, "model": None}],
        remote_profile="box",
        engine="remote",
        **extra,
    )
    return make_app(secrets=secrets or keyring_with("box"))


def host_of(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


def saved_answers(home) -> list[tuple]:
    db = sqlite3.connect(db_path(home))
    return db.execute(
        "SELECT content, complete, stats, engine, version FROM messages WHERE role='assistant' ORDER BY id"
    ).fetchall()


def answer(qtbot, app, text: str) -> tuple[str, str]:
    """Send `text`; (finish reason, the answer's text) once it is finished."""
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        app.chat.send(text)
    app.store.flush()
    return done.args[1], app.chat.messages[-1].content


def test_engine_dialog_tests_the_server_and_the_chat_streams_from_it(qtbot, make_app, home, served):
    running, _scheduler, _model = served
    secrets = keyring_with()
    preset(home, max_tokens=8, temperature=0.0, backend="cpu")
    app = make_app(autoload=False, secrets=secrets)
    w = app.window
    w.engine_action.trigger()  # Settings → Engine…
    dialog = app.engines.dialog
    assert dialog is not None and dialog.local_radio.isChecked() and not dialog.remote_box.isEnabled()
    dialog.remote_radio.click()
    assert dialog.remote_box.isEnabled()
    dialog.name.setText("box")
    dialog.url.setText(running.url)  # as a user types it: no /v1 (the engine adds it)

    # Test connection without the key: the server refuses, one line, and the key field stays empty
    with qtbot.waitSignal(app.engines.tested, timeout=SERVER_MS) as tested:
        dialog.test_button.click()
    ok, line = tested.args
    assert not ok and "\n" not in line and line == dialog.status.text()
    # with the key: the engine's check() line, and the model list from the server's /v1/models
    dialog.api_key.setText(KEY)
    with qtbot.waitSignal(app.engines.tested, timeout=SERVER_MS) as tested:
        dialog.test_button.click()
    ok, line = tested.args
    import openai

    direct = openai.OpenAI(base_url=running.url + "/v1", api_key=KEY, max_retries=0)
    name = direct.models.list().data[0].id  # what the server calls its model
    assert ok and line.startswith("OK") and host_of(running.url) in line, line
    assert [dialog.model.itemText(i) for i in range(dialog.model.count())] == [name]
    assert dialog.model.currentText() == name and KEY not in line

    # OK: the profile is saved (no key in it), the key goes to the keyring, the worker connects
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    info = ready.args[0]
    assert info["remote"] and info["model"] == name and info["host"] == host_of(running.url)
    assert "quant" not in info and "weight_types" not in info  # nothing about local devices
    s = app.settings.values
    assert s.engine == "remote" and s.remote_profile == "box"
    assert s.remote_profiles == [{"name": "box", "url": running.url, "model": name, "timeout_s": 60.0}]
    assert secrets.get("box") == KEY and secrets.persistent
    assert w.model_label.text() == f"remote: {host_of(running.url)}, {name}"
    assert w.devices.engine_label.text().startswith(f"Engine — remote: {host_of(running.url)}, {name}")
    assert not w.quant_group.isEnabled() and not w.backend_group.isEnabled()  # local-only menus

    reason, text = answer(qtbot, app, "Write one sentence about a phoenix.")
    assert reason == "length" and text.strip()
    # the answer came from the server's model, the same greedy text its own client gets
    reply = direct.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Write one sentence about a phoenix."}],
        max_tokens=8,
        temperature=0.0,
    )
    assert text == reply.choices[0].message.content
    ((content, complete, stats, engine, _version),) = saved_answers(home)
    stats = json.loads(stats)
    assert content == text and complete == 1 and engine == f"remote:{host_of(running.url)}/{name}"
    # client-side figures: TTFT and tok/s measured here; no GPU/NPU busy figures for the server
    assert stats["ttft_s"] > 0 and stats["generation_tokens"] == 8 and stats["generation_tps"] > 0
    assert stats["gpu_busy"] is None and stats["npu_busy"] is None and stats["context_limit"] is None
    assert w.tps_label.text().endswith("tok/s") and w.ttft_label.text().startswith("TTFT")
    assert f"via {host_of(running.url)}/{name}" in w.chat.transcript_text()

    # back to this computer: the engine setting persists and the worker loads the local model
    w.engine_action.trigger()
    app.engines.dialog.local_radio.click()
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        app.engines.dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert not ready.args[0].get("remote") and ready.args[0]["backend"] in ("cpu", "vulkan")
    assert app.settings.values.engine == "local" and w.quant_group.isEnabled()


def test_stop_closes_the_stream_and_regenerate_asks_the_server_again(qtbot, make_app, home, served):
    running, scheduler, _model = served
    app = remote_app(make_app, home, running.url, max_tokens=200)
    assert wait_loaded(qtbot, app)["remote"]
    chat = app.chat
    chat.send("Tell me a long story about a phoenix and a dragon.")
    qtbot.waitUntil(lambda: len(chat.answer_text) > 20 and scheduler.active == 1, timeout=ANSWER_TIMEOUT_MS)
    pressed = time.monotonic()
    with qtbot.waitSignal(chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        chat.stop()
    assert done.args[1] == "cancelled"
    # the server saw the stream close: its request ended at once, long before 200 tokens
    qtbot.waitUntil(lambda: scheduler.active == 0 and scheduler.waiting == 0, timeout=SERVER_MS)
    assert time.monotonic() - pressed < 10.0
    app.store.flush()
    ((stopped, complete, stats, engine, _v),) = saved_answers(home)
    assert stopped and complete == 1 and json.loads(stats)["finish_reason"] == "cancelled"
    assert json.loads(stats)["generation_tokens"] < 200 and engine.startswith("remote:")

    # Regenerate (a shorter answer, from the chat's own settings): the stopped answer stays as
    # version 1, the server writes version 2 with the new length
    conv = app.store.conversation(chat.conversation_id)
    chat.set_chat_settings(conv.system_prompt, {**conv.sampling, "max_tokens": 12})
    with qtbot.waitSignal(chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        chat.regenerate()
    assert done.args[1] == "length"
    app.store.flush()
    ((second, complete, stats, engine, version),) = saved_answers(home)
    assert json.loads(stats)["generation_tokens"] == 12
    assert version == 2 and complete == 1 and second.strip() and second != stopped
    assert chat.messages[-1].versions == 2 and engine == f"remote:{host_of(running.url)}/{app.models.info['model']}"


def saved_versions(home) -> list[tuple]:
    """(version, content, stats) of the earlier versions of every answer."""
    db = sqlite3.connect(db_path(home))
    return db.execute("SELECT version, content, stats FROM message_versions ORDER BY message_id, version").fetchall()


def test_llama_cpp_server_streams_stops_and_regenerates(qtbot, make_app, home, llama_cpp_server, llama_cpp_log):
    """llama.cpp's server (no key) as the saved profile "box": an answer streams and is the one
    llama.cpp gives its own client; Stop closes the stream (the server logs the disconnect) and the
    next answer comes long before the stopped one could have finished; Regenerate saves a second
    version and keeps the stopped one as the first."""
    url, host = llama_cpp_server, host_of(llama_cpp_server)
    app = remote_app(make_app, home, url, max_tokens=8, secrets=keyring_with())
    info = wait_loaded(qtbot, app)
    assert info["remote"] and info["model"] == LLAMA_CPP_MODEL_ID and info["host"] == host
    assert app.window.model_label.text() == f"remote: {host}, {LLAMA_CPP_MODEL_ID}"
    chat = app.chat

    question = "Write one sentence about the ocean."
    reason, text = answer(qtbot, app, question)
    assert reason == "length" and text.strip()
    import openai

    direct = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": question}]
    reply = direct.chat.completions.create(model=LLAMA_CPP_MODEL_ID, messages=messages, max_tokens=8, temperature=0.0)
    assert text == reply.choices[0].message.content  # the same greedy text llama.cpp gives its own client
    ((_c, complete, stats, engine, _v),) = saved_answers(home)
    stats = json.loads(stats)
    assert complete == 1 and engine == f"remote:{host}/{LLAMA_CPP_MODEL_ID}"
    assert stats["generation_tokens"] == 8 and stats["ttft_s"] > 0 and stats["gpu_busy"] is None

    # Stop mid-answer: a long answer asked for, stopped once text has streamed in
    conv = app.store.conversation(chat.conversation_id)
    chat.set_chat_settings(conv.system_prompt, {**conv.sampling, "max_tokens": 1000})
    disconnects = llama_cpp_disconnects(llama_cpp_log)
    chat.send("Tell me a long story about a phoenix and a dragon.")
    qtbot.waitUntil(lambda: len(chat.answer_text) > 20, timeout=ANSWER_TIMEOUT_MS)  # streamed, not finished
    assert chat.busy
    pressed = time.monotonic()
    with qtbot.waitSignal(chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        chat.stop()
    assert done.args[1] == "cancelled" and time.monotonic() - pressed < 10.0
    qtbot.waitUntil(lambda: llama_cpp_disconnects(llama_cpp_log) == disconnects + 1, timeout=SERVER_MS)
    app.store.flush()
    stopped, complete, stats, _e, _v = saved_answers(home)[-1]
    stopped_stats = json.loads(stats)
    assert stopped.strip() and complete == 1 and stopped_stats["finish_reason"] == "cancelled"
    generated = stopped_stats["generation_tokens"]
    assert 0 < generated < 1000

    # Regenerate (12 tokens): it comes at once — long before llama.cpp, one request at a time, could
    # have finished the 1000 tokens of the stopped answer at the speed it was going
    chat.set_chat_settings(conv.system_prompt, {**conv.sampling, "max_tokens": 12})
    with qtbot.waitSignal(chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        chat.regenerate()
    assert done.args[1] == "length"
    app.store.flush()
    second, complete, stats, engine, version = saved_answers(home)[-1]
    stats = json.loads(stats)
    would_have_taken = (1000 - generated) / stopped_stats["generation_tps"]
    assert stats["ttft_s"] < would_have_taken / 2, (stats["ttft_s"], would_have_taken)
    assert version == 2 and complete == 1 and second.strip() and stats["generation_tokens"] == 12
    assert engine == f"remote:{host}/{LLAMA_CPP_MODEL_ID}" and chat.messages[-1].versions == 2
    ((first_version, first_content, first_stats),) = saved_versions(home)
    assert first_version == 1 and first_content == stopped and json.loads(first_stats)["finish_reason"] == "cancelled"


def test_edit_and_resend_and_the_system_prompt_reach_the_server(qtbot, make_app, home, served):
    """What the server reads is the edited conversation with the chat's system prompt: the answer
    is the one the server gives its own client for exactly those messages (greedy)."""
    running, _scheduler, _model = served
    app = remote_app(make_app, home, running.url, max_tokens=6, system_prompt="Answer like a pirate.")
    info = wait_loaded(qtbot, app)
    answer(qtbot, app, "Hello")
    user = app.chat.messages[0]
    app.chat.begin_edit(user.id)
    reason, text = answer(qtbot, app, "Good morning")
    assert reason == "length"
    assert [(m.role, m.content) for m in app.chat.messages] == [("user", "Good morning"), ("assistant", text)]
    import openai

    direct = openai.OpenAI(base_url=running.url + "/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "system", "content": "Answer like a pirate."}, {"role": "user", "content": "Good morning"}]
    reply = direct.chat.completions.create(model=info["model"], messages=messages, max_tokens=6, temperature=0.0)
    assert text == reply.choices[0].message.content
    without = direct.chat.completions.create(model=info["model"], messages=messages[1:], max_tokens=6, temperature=0.0)
    assert without.choices[0].message.content != text  # the system prompt made a difference


def test_a_closed_port_is_one_line_and_the_answer_row_is_kept(qtbot, make_app, home, model_path):
    """The server goes away after the app connected: the next answer fails with the engine's one
    line, the (empty) answer is saved with its note, and nothing earlier is lost."""
    model = load(model_path, backend="cpu", context_length=128)
    scheduler = Scheduler(model)
    running = start_server(scheduler, ServerConfig(port=0, api_key=KEY))
    try:
        app = remote_app(make_app, home, running.url, max_tokens=4)
        wait_loaded(qtbot, app)
        first_reason, first = answer(qtbot, app, "Hi")
        assert first_reason == "length" and first
    finally:
        running.stop()
        scheduler.close()
        model.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", running.port), timeout=2).close()
    errors = []
    app.worker.error_raised.connect(lambda _id, message: errors.append(message))
    reason, text = answer(qtbot, app, "Are you there?")
    assert reason == "error" and text == ""
    (line,) = errors
    assert line and "\n" not in line and KEY not in line
    assert line in app.window.chat.notice.text() and app.window.chat.notice_kind() == "error"
    rows = saved_answers(home)
    assert [r[0] for r in rows] == [first, ""] and all(r[1] == 1 for r in rows)
    assert json.loads(rows[1][2])["finish_reason"] == "error"
    assert [m.content for m in app.chat.messages if m.role == "user"] == ["Hi", "Are you there?"]

    # a closed port at connect time: the load fails with one line, the menus say so
    app.models.reload_engine()
    with qtbot.waitSignal(app.models.model_unavailable, timeout=LOAD_TIMEOUT_MS) as failed:
        pass
    assert "Could not load the remote server “box”" in failed.args[0] and "\n" not in failed.args[0]


def test_the_api_key_is_never_written_or_logged(qtbot, make_app, home, served, tmp_path, capfd):
    """The key travels to the server (it refuses without it) and nowhere else: not the settings
    file, the SQLite file (WAL included), exports, the worker's messages to the GUI, or any
    process's output."""
    running, _scheduler, _model = served
    secrets = keyring_with("box")
    app = remote_app(make_app, home, running.url, max_tokens=4, secrets=secrets)
    seen: list[dict] = []
    dispatch = app.worker._dispatch
    app.worker._dispatch = lambda msg: (seen.append(msg), dispatch(msg))[1]  # every message the worker sends
    wait_loaded(qtbot, app)
    reason, text = answer(qtbot, app, "Hello there")
    assert reason == "length" and text
    # a wrong key: refused by the server with a one-line error that does not echo it either
    secrets.set("box", KEY + "-wrong")
    app.models.reload_engine()
    with qtbot.waitSignal(app.models.model_unavailable, timeout=LOAD_TIMEOUT_MS) as failed:
        pass
    assert KEY not in failed.args[0]
    app.chat.export_current("json", tmp_path / "chat.json")
    app.chat.export_current("markdown", tmp_path / "chat.md")
    app.shutdown()
    files = [
        app.settings.path,
        tmp_path / "chat.json",
        tmp_path / "chat.md",
        *db_path(home).parent.glob(db_path(home).name + "*"),  # history.sqlite3, -wal, -shm
    ]
    assert app.settings.path.exists() and db_path(home).exists()
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path
    for path in home.rglob("*"):  # and no other file the app wrote
        assert path.is_dir() or KEY.encode() not in path.read_bytes(), path
    assert seen and not any(KEY in repr(msg) for msg in seen)
    out, err = capfd.readouterr()  # this process's and the worker's (it inherits the fds) output
    assert KEY not in out and KEY not in err


def choose_profile(dialog, name: str) -> None:
    """Pick a saved server in the dialog's list, as a click does."""
    index = dialog.profiles.findData(name)
    dialog.profiles.setCurrentIndex(index)
    dialog.profiles.activated.emit(index)


def test_saved_servers_switch_the_engine_and_delete_returns_to_this_computer(qtbot, make_app, home, served):
    """Two saved servers (the same one as 127.0.0.1 and as localhost, so the worker's host tells
    them apart), a model the server lacks refused with one line, and Delete."""
    running, _scheduler, _model = served
    port = running.port
    secrets = keyring_with("by-ip")
    secrets.set("by-name", KEY)
    preset(
        home,
        max_tokens=4,
        temperature=0.0,
        backend="cpu",
        remote_profiles=[
            {"name": "by-ip", "url": f"http://127.0.0.1:{port}", "model": None},
            {"name": "by-name", "url": f"http://localhost:{port}/v1", "model": None},
        ],
        remote_profile="by-ip",
        engine="remote",
    )
    app = make_app(secrets=secrets)
    assert wait_loaded(qtbot, app)["host"] == f"127.0.0.1:{port}"
    name = app.models.info["model"]

    dialog = app.engines.open_dialog()
    assert [dialog.profiles.itemText(i) for i in range(dialog.profiles.count())] == ["by-ip", "by-name", "New server…"]
    assert dialog.remote_radio.isChecked() and dialog.url.text() == f"http://127.0.0.1:{port}"
    choose_profile(dialog, "by-name")
    assert dialog.url.text() == f"http://localhost:{port}/v1" and dialog.api_key.text() == KEY  # from the keyring
    dialog.model.setEditText("no-such-model")  # a name the server does not serve
    with qtbot.waitSignal(app.models.model_unavailable, timeout=LOAD_TIMEOUT_MS) as failed:
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert "no model 'no-such-model'" in failed.args[0] and "\n" not in failed.args[0]
    # never kept: the engine goes back to the server that worked
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        pass
    assert ready.args[0]["host"] == f"127.0.0.1:{port}" and app.settings.values.remote_profile == "by-ip"

    dialog = app.engines.open_dialog()
    choose_profile(dialog, "by-name")
    assert dialog.model.currentText() == "no-such-model"  # saved as typed
    dialog.model.setEditText(name)
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert ready.args[0]["host"] == f"localhost:{port}" and ready.args[0]["model"] == name
    reason, text = answer(qtbot, app, "Hi")
    assert reason == "length" and text
    assert saved_answers(home)[-1][3] == f"remote:localhost:{port}/{name}"

    # Delete the server in use: its key leaves the keyring and the engine is this computer again
    dialog = app.engines.open_dialog()
    assert dialog.profiles.currentData() == "by-name"
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        dialog.delete_button.click()
    assert not ready.args[0].get("remote") and ready.args[0]["backend"] == "cpu"
    assert [p["name"] for p in app.settings.values.remote_profiles] == ["by-ip"]
    assert secrets.get("by-name") is None and secrets.get("by-ip") == KEY
    assert app.settings.values.engine == "local"
    assert [dialog.profiles.itemText(i) for i in range(dialog.profiles.count())] == ["by-ip", "New server…"]


def outward_address() -> str | None:
    """This machine's address on its network (not loopback), or None."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.254.254.254", 9))  # no packet is sent: this only picks the route
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_plain_http_to_another_machine_warns_once(qtbot, make_app, home, served):
    address = outward_address()
    if address is None:
        pytest.skip("no network address besides loopback")
    _running, scheduler, _model = served
    config = ServerConfig(host="0.0.0.0", port=0, api_key=KEY, allowed_hosts=(address,))
    with start_server(scheduler, config) as lan:
        url = f"http://{address}:{lan.port}"
        app = remote_app(make_app, home, url, max_tokens=4)
        dialog = app.engines.open_dialog()
        with qtbot.waitSignal(app.engines.tested, timeout=SERVER_MS) as tested:
            dialog.test_button.click()
        assert tested.args[0] and "plain http://" in tested.args[1] and f"{address}:{lan.port}" in tested.args[1]
        dialog.reject()
        wait_loaded(qtbot, app)
        chat = app.window.chat
        assert chat.notice_kind() == "warning" and "plain http://" in chat.notice.text()
        chat.hide_notice()
        app.models.reload_engine()  # connected again: not warned a second time this session
        with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS):
            pass
        assert chat.notice_kind() is None
        reason, text = answer(qtbot, app, "Hi")
        assert reason == "length" and text


def test_completion_mode_continues_the_text_through_the_completions_endpoint(qtbot, make_app, home, served):
    """A chat in completion mode sends the conversation as one text to /v1/completions (no
    template) and ends the answer at its first blank line, as it does locally."""
    running, _scheduler, _model = served
    app = remote_app(make_app, home, running.url, max_tokens=24)
    info = wait_loaded(qtbot, app)
    app.chat.set_chat_mode("completion")
    text = "The phoenix rose from the ashes and"
    reason, answer_text = answer(qtbot, app, text)
    import openai

    direct = openai.OpenAI(base_url=running.url + "/v1", api_key=KEY, max_retries=0)
    reply = direct.completions.create(model=info["model"], prompt=text, max_tokens=24, temperature=0.0)
    full = reply.choices[0].text
    body = full.lstrip()
    head = full[: len(full) - len(body)]
    expected = head + body.split("\n\n", 1)[0]  # ParagraphStop: up to the first blank line after the text
    assert answer_text == expected and answer_text.strip()
    assert reason == ("stop" if "\n\n" in body else "length")


def test_without_a_keyring_the_key_works_for_the_session_and_is_written_nowhere(qtbot, make_app, home, served):
    """keyring's fail backend (a headless box): the dialog says keys last the session only, the key
    typed there still reaches the server, and it is in no file afterwards."""
    from keyring.backends import fail

    running, _scheduler, _model = served
    preset(home, max_tokens=4, temperature=0.0)
    app = make_app(autoload=False, secrets=SecretStore(fail.Keyring()))
    dialog = app.engines.open_dialog()
    assert dialog.key_note.isVisibleTo(dialog) and "session only" in dialog.key_note.text()
    dialog.remote_radio.click()
    shown: list[str] = []
    app.window.statusBar().messageChanged.connect(lambda text: shown.append(text))
    # a key in the URL would be saved with it in settings.json: refused
    dialog.url.setText(running.url.replace("://", f"://user:{KEY}@"))
    with qtbot.waitSignal(app.engines.tested, timeout=SERVER_MS) as tested:
        dialog.test_button.click()
    assert not tested.args[0] and "user name or password" in tested.args[1]
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert any("user name or password" in s for s in shown) and app.settings.values.remote_profiles == []
    assert app.settings.values.engine == "local"
    dialog = app.engines.open_dialog()
    dialog.remote_radio.click()
    dialog.url.setText(running.url)
    dialog.api_key.setText(KEY)
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert ready.args[0]["remote"] and any("session only" in s for s in shown)
    # a profile saved without a name is called after its host
    assert app.settings.values.remote_profiles[0]["name"] == host_of(running.url)
    reason, text = answer(qtbot, app, "Hi")
    assert reason == "length" and text
    app.shutdown()
    for path in home.rglob("*"):
        assert path.is_dir() or KEY.encode() not in path.read_bytes(), path
