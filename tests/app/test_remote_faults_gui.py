"""Remote faults in the app (issue 21): a stream cut mid-answer, an error event mid-stream, 429
with Retry-After, a server that refuses an extra sampling field — from the `remote` helper's named
test double (tests/remote/misbehaving_server.py) — and each fault of tests/remote/fault_cases.py
(TLS, a connect timeout, a read timeout, 5xx, 403, malformed SSE; real sockets and a real TLS
server where one can produce the fault) as one line. The real window, worker process and SQLite
are ours."""

from __future__ import annotations

import html
import json
import time

import pytest

from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded
from tests.app.test_remote_engine_gui import keyring_with, saved_answers
from tests.remote.fault_cases import Fault, cases, fault_url
from tests.remote.misbehaving_server import MODEL, WORDS, MisbehavingServer

pytestmark = [pytest.mark.gui, pytest.mark.slow]


@pytest.fixture(scope="module")
def double():
    with MisbehavingServer(delay_s=3.0) as server:
        yield server


def app_on(make_app, home, url: str):
    preset(
        home,
        max_tokens=16,
        temperature=0.7,
        top_k=40,
        min_p=0.05,
        remote_profiles=[{"name": "double", "url": url, "model": None}],
        remote_profile="double",
        engine="remote",
    )
    return make_app(secrets=keyring_with("double"))


def send(qtbot, app, text: str = "Say hello") -> str:
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        app.chat.send(text)
    app.store.flush()
    return done.args[1]


@pytest.mark.parametrize(
    ("behaviour", "why"),
    [("cut", "connection"), ("errorevent", "the engine ran out of memory")],
)
def test_a_stream_that_breaks_off_keeps_the_text_marked_as_cut(qtbot, make_app, home, double, behaviour, why):
    app = app_on(make_app, home, double.url(behaviour))
    assert wait_loaded(qtbot, app)["model"] == MODEL
    assert send(qtbot, app) == "cut"
    ((content, complete, stats, engine, _v),) = saved_answers(home)
    stats = json.loads(stats)
    assert content == "".join(WORDS[:2]) and complete == 1  # what came is kept
    assert stats["finish_reason"] == "cut" and stats["note"].startswith("Answer cut: ")
    assert why.lower() in stats["note"].lower() and "\n" not in stats["note"]
    assert engine == f"remote:127.0.0.1:{double.port}/{MODEL}"
    chat = app.window.chat
    assert "Answer cut: " in chat.transcript_text() and "".join(WORDS[:2]) in chat.transcript_text()
    assert chat.continue_button.isEnabled()  # Continue goes on from the cut text
    assert [m.content for m in app.chat.messages] == ["Say hello", "".join(WORDS[:2])]  # nothing lost


def test_busy_and_refused_field_notices_show_in_the_status_bar(qtbot, make_app, home, double):
    app = app_on(make_app, home, double.url("busy-1-1"))  # one 429 with Retry-After: 1, then the answer
    wait_loaded(qtbot, app)
    shown: list[str] = []
    app.window.statusBar().messageChanged.connect(lambda text: shown.append(text))
    assert send(qtbot, app) == "stop"
    assert f"127.0.0.1:{double.port} is busy (429): retrying in 1 s (retry 1 of 4)" in shown
    assert app.chat.messages[-1].content == "".join(WORDS)

    # a server that refuses the extra fields one by one: each told once, dropped, the answer still comes
    profile = {**app.settings.values.remote_profiles[0], "url": double.url("strict")}
    app.settings.save_remote_profile(profile)
    app.models.reload_engine()
    wait_loaded(qtbot, app)
    shown.clear()
    first = len(double.seen)
    assert send(qtbot, app) == "stop"
    second = len(double.seen)
    assert send(qtbot, app, "Again") == "stop"
    extras = ("top_k", "min_p", "repetition_penalty")
    for field in extras:
        assert len([s for s in shown if field in s]) == 1, (field, shown)
    bodies = [s.body for s in double.seen[first:second] if s.body]
    assert bodies[0]["top_k"] == 40 and bodies[0]["min_p"] == 0.05  # the chat's settings went out
    (again,) = [s.body for s in double.seen[second:] if s.body]
    assert not set(extras) & set(again)  # not sent again


@pytest.mark.parametrize(
    ("behaviour", "kept"),
    [
        ("stall", "".join(WORDS[:2])),  # two pieces, then nothing for 3 s
        ("slow", ""),  # the response headers come after 3 s
    ],
)
def test_stop_while_the_server_sends_nothing(qtbot, make_app, home, double, behaviour, kept):
    """A server gone quiet: Stop ends the answer at once, not when the server speaks again; what
    came is kept as stopped."""
    app = app_on(make_app, home, double.url(behaviour))
    wait_loaded(qtbot, app)
    hits = double.hits[behaviour]
    app.chat.send("Say hello")
    qtbot.waitUntil(lambda: double.hits[behaviour] == hits + 1, timeout=ANSWER_TIMEOUT_MS)  # the request is out
    if kept:  # shown while the server is quiet, not only once it speaks again (3 s later)
        qtbot.waitUntil(lambda: app.chat.answer_text == kept, timeout=2_000)
    pressed = time.monotonic()
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        app.chat.stop()
    assert done.args[1] == "cancelled" and time.monotonic() - pressed < 2.0
    app.store.flush()
    ((content, complete, stats, _engine, _v),) = saved_answers(home)
    assert content == kept and complete == 1 and json.loads(stats)["finish_reason"] == "cancelled"


# "cut", "closed-port": tests above and test_remote_engine_gui; the 60 s read timeout's stall: the
# CLI's case waits it out, and here the dialog's own timeout is set shorter (the test below)
@pytest.mark.parametrize("fault", cases(skip=("cut", "closed-port", "stall-90")))
def test_a_fault_is_one_line_and_nothing_is_lost(qtbot, make_app, home, double, tmp_path, fault: Fault):
    """Each fault is one line in the chat's notice. One on connecting fails the engine's load with
    it; one during an answer ends the answer with it: what came is kept and marked "cut", the
    question stays in the history."""
    with fault_url(fault, double, tmp_path) as (url, host):
        app = app_on(make_app, home, url)
        notice = app.window.chat.notice
        if fault.at_connect:
            with qtbot.waitSignal(app.models.model_unavailable, timeout=ANSWER_TIMEOUT_MS) as failed:
                pass
            told, named = failed.args[0], f"Could not load the remote server “double” ({url}): "
            assert "\n" not in told and told.startswith(named) and fault.matches(told.removeprefix(named), host), told
            assert notice.text() == html.escape(told) and app.window.chat.notice_kind() == "error"
            return
        assert wait_loaded(qtbot, app)["host"] == host
        errors: list[str] = []
        app.worker.error_raised.connect(lambda _id, message: errors.append(message))
        start = time.monotonic()
        assert send(qtbot, app) == fault.reason
    (line,) = errors
    assert "\n" not in line and fault.matches(line, host), line
    assert notice.text() == html.escape(f"The engine reported an error: {line}")
    assert app.window.chat.notice_kind() == "error"
    ((content, complete, stats, engine, _v),) = saved_answers(home)
    stats = json.loads(stats)
    assert content == fault.kept and complete == 1 and stats["finish_reason"] == fault.reason
    assert engine == f"remote:{host}/{MODEL}"
    if fault.kept:
        assert stats["note"] == f"Answer cut: {line}"
    assert [m.content for m in app.chat.messages] == ["Say hello", fault.kept]  # nothing lost
    if fault.slow:
        assert 59 < time.monotonic() - start < 80  # the client's 60 s read timeout, not the server's 90 s stall


def test_the_dialogs_reply_timeout_is_what_the_engine_waits(qtbot, make_app, home, double):
    """Settings → Engine…'s "Wait for replies up to", set from 60 to 5 s on the server in use: the
    engine is reconnected with it, a server that stalls mid-answer is cut after 5 s (not 60), the
    line says so, the text that came is kept, and the profile keeps the setting."""
    from PySide6.QtWidgets import QDialogButtonBox

    app = app_on(make_app, home, double.url("stall-90"))
    assert wait_loaded(qtbot, app)["timeout_s"] == 60.0  # a profile saved without one: the default
    dialog = app.engines.open_dialog()
    assert dialog.timeout.value() == 60
    dialog.timeout.setValue(5)
    with qtbot.waitSignal(app.models.model_ready, timeout=ANSWER_TIMEOUT_MS) as ready:
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert ready.args[0]["timeout_s"] == 5.0 and app.settings.values.remote()["timeout_s"] == 5.0
    errors: list[str] = []
    app.worker.error_raised.connect(lambda _id, message: errors.append(message))
    start = time.monotonic()
    assert send(qtbot, app) == "cut"
    assert 4.5 < time.monotonic() - start < 20
    assert errors == [f"127.0.0.1:{double.port} sent nothing for 5 s (timeout)"]
    ((content, complete, _stats, _engine, _v),) = saved_answers(home)
    assert content == "".join(WORDS[:2]) and complete == 1
    assert app.engines.open_dialog().timeout.value() == 5  # shown again as saved
