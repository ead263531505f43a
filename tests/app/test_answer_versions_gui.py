"""Per-answer figures and the versions of a regenerated answer, on the real window, worker
process and embedded model (CPU backend, seeded sampling so the versions differ and the test
repeats exactly). What the engine read is checked in the prompt the worker reports."""

from __future__ import annotations

import sqlite3

import pytest
from PySide6.QtCore import Qt

from phoenix_chat.app.store import db_path
from phoenix_chat.app.views.answer_figures import answer_figures
from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded
from tests.app.transcript_links import click_link

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def finish(qtbot, app, action):
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        action()
    return blocker.args


def prompts(app) -> list[str]:
    """The prompt text the worker says the engine read, one per generation from now on."""
    seen: list[str] = []
    app.worker.generation_started.connect(lambda _id, info: seen.append(info["prompt"]))
    return seen


def seed(app, n: int) -> None:
    app.chat.set_chat_settings("", {**app.settings.values.sampling_defaults(), "seed": n})


def test_each_answer_shows_its_figures_and_they_survive_a_restart(qtbot, make_app, home):
    preset(home, backend="cpu", max_tokens=6, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    finish(qtbot, app, lambda: app.chat.send("The capital of France is"))
    finish(qtbot, app, lambda: app.chat.send("And of Italy?"))
    answers = [m for m in app.chat.messages if m.role == "assistant"]
    lines = [answer_figures(m.stats) for m in answers]
    for m, line in zip(answers, lines, strict=True):
        assert m.stats["generation_tokens"] > 0 and m.stats["ttft_s"] > 0
        assert line.startswith(f"{m.stats['generation_tokens']} token") and "TTFT" in line and "tok/s" in line
    text = app.window.chat.transcript_text()
    assert all(line in text for line in lines)  # under each answer, not only the last
    assert text.index(lines[0]) < text.index("And of Italy?") < text.index(lines[1])
    app.shutdown()

    again = make_app(autoload=False)
    assert all(line in again.window.chat.transcript_text() for line in lines)


def test_regenerate_keeps_versions_and_the_chat_goes_on_from_the_one_shown(qtbot, make_app, home, tmp_path):
    preset(home, backend="cpu", max_tokens=8, temperature=1.0)
    app = make_app()
    wait_loaded(qtbot, app)
    view = app.window.chat
    read = prompts(app)
    seed(app, 1)
    first_id, _ = finish(qtbot, app, lambda: app.chat.send("Once upon a time"))
    v1 = app.chat.messages[1].content.strip()
    seed(app, 2)
    second_id, _ = finish(qtbot, app, lambda: qtbot.mouseClick(view.regenerate_button, Qt.LeftButton))
    v2 = app.chat.messages[1].content.strip()
    assert second_id == first_id  # a new version of the same answer, not a new message
    assert v1 and v2 and v1 not in v2 and v2 not in v1
    assert v1 not in read[1]  # Regenerate's prompt ends before the answer it replaces
    answer = app.chat.messages[1]
    assert [m.role for m in app.chat.messages] == ["user", "assistant"]
    assert (answer.version, answer.versions) == (2, 2)
    assert "2/2" in view.transcript_text() and v2 in view.transcript_text()

    click_link(qtbot, view, "‹")  # show version 1
    assert app.chat.messages[1].content.strip() == v1 and app.chat.messages[1].version == 1
    assert "1/2" in view.transcript_text() and v1 in view.transcript_text() and v2 not in view.transcript_text()
    finish(qtbot, app, lambda: app.chat.send("And then?"))
    assert v1 in read[2] and v2 not in read[2]  # the conversation goes on from the version shown

    click_link(qtbot, view, "›")  # back to version 2 of the first answer
    assert app.chat.messages[1].content.strip() == v2 and "2/2" in view.transcript_text()
    finish(qtbot, app, lambda: app.chat.send("What next?"))
    assert v2 in read[3] and v1 not in read[3]

    export = tmp_path / "chat.md"
    app.chat.export_current("markdown", export)
    assert v2 in export.read_text() and v1 not in export.read_text()
    conv_id = app.chat.conversation_id
    app.shutdown()

    again = make_app(autoload=False)  # versions are in the database, the shown one too
    answer = again.chat.messages[1]
    assert (answer.content.strip(), answer.version, answer.versions) == (v2, 2, 2)
    assert "2/2" in again.window.chat.transcript_text()
    again.chat.delete_conversation(conv_id)
    db = sqlite3.connect(db_path(home))
    assert db.execute("SELECT COUNT(*) FROM message_versions").fetchone()[0] == 0
