"""Continue for an answer cut by the length limit (finish_reason "length"), on the real worker
and model: the Continue button extends the same answer, and the worker reads the conversation
with the partial answer left open (chat mode: no end of turn after it; completion mode: the
text so far), as the prompt ids it reports show."""

from __future__ import annotations

import json
import sqlite3

import pytest
from PySide6.QtCore import Qt

from phoenix_chat.app.store import db_path
from phoenix_chat.engine.chat import ChatFormat
from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded

pytestmark = [pytest.mark.gui, pytest.mark.slow]
MAX_TOKENS = 6


def last_answer(home) -> tuple[int, str, dict]:
    db = sqlite3.connect(db_path(home))
    rows = db.execute("SELECT id, content, stats FROM messages WHERE role='assistant' ORDER BY id").fetchall()
    answer_id, content, stats = rows[-1]
    return answer_id, content, json.loads(stats)


def finish(qtbot, app, button) -> None:
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS):
        qtbot.mouseClick(button, Qt.LeftButton)
    app.store.flush()


def test_continue_extends_an_answer_cut_at_the_length_limit(qtbot, make_app, home, gguf):
    tok = gguf.tokenizer()
    end_of_turn = tok.token_to_id("<end_of_turn>")
    preset(home, backend="cpu", context_length=2048, max_tokens=MAX_TOKENS, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    view = app.window.chat
    prompts: list = []
    app.worker.prompt_ready.connect(lambda _id, mode, ids: prompts.append((mode, ids)))

    # Chat mode: the partial answer stays open after the template's model turn.
    qtbot.mouseClick(view.completion_switch, Qt.LeftButton)
    assert app.chat.chat_mode() == "chat"
    view.input.setPlainText("Tell me about Paris.")
    finish(qtbot, app, view.send_button)
    answer_id, partial, stats = last_answer(home)
    assert stats["finish_reason"] == "length" and stats["generation_tokens"] == MAX_TOKENS and partial
    assert view.continue_button.isEnabled() and "Continue goes on" in view.transcript_text()
    finish(qtbot, app, view.continue_button)
    mode, ids = prompts[-1]
    question = [{"role": "user", "content": "Tell me about Paris."}]
    opened = ChatFormat.for_tokenizer(tok).encode(question, tok)
    assert mode == "chat" and ids == opened + tok.encode(partial, add_bos=False, parse_special=False)
    assert end_of_turn not in ids[len(opened) - 2 :]  # nothing closes the model's turn
    same_id, content, stats = last_answer(home)
    assert same_id == answer_id and content.startswith(partial) and len(content) > len(partial)
    assert len([m for m in app.store.messages(app.chat.conversation_id) if m.role == "assistant"]) == 1
    assert stats["finish_reason"] == "length" and view.continue_button.isEnabled()  # and again if wanted

    # Completion mode (the base model's default): the text so far, continued.
    app.window.new_chat_action.trigger()
    assert app.chat.chat_mode() == "completion"
    view.input.setPlainText("The capital of France is")
    finish(qtbot, app, view.send_button)
    answer_id, partial, stats = last_answer(home)
    assert stats["finish_reason"] == "length" and view.continue_button.isEnabled()
    finish(qtbot, app, view.continue_button)
    mode, ids = prompts[-1]
    text = "The capital of France is" + partial
    assert mode == "completion" and ids == tok.encode(text, add_bos=True, parse_special=False)
    same_id, content, _ = last_answer(home)
    assert same_id == answer_id and content.startswith(partial) and len(content) > len(partial)
    assert content.startswith(" the capital of the country")  # the greedy continuation, unbroken
