"""Completion mode through the window, on the real worker and the real embedded 270M (a base
model): by default the chat is one text the model continues, with no chat template, ending at
a blank line or the length limit; the per-chat switch goes to chat mode (the template) and is
kept across a restart. What the model read is checked at the worker: the prompt ids it reports
(PROMPT_READY) for each answer (issue 24: "The embedded model must be useful out of the box")."""

from __future__ import annotations

import json
import sqlite3

import pytest
from PySide6.QtCore import Qt

from phoenix_chat.app.store import db_path
from phoenix_chat.engine.chat import ChatFormat
from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded

pytestmark = [pytest.mark.gui, pytest.mark.slow]
MAX_TOKENS = 40


def answers(home) -> list[tuple[str, dict]]:
    db = sqlite3.connect(db_path(home))
    rows = db.execute("SELECT content, stats FROM messages WHERE role='assistant' ORDER BY id").fetchall()
    return [(content, json.loads(stats)) for content, stats in rows]


def send(qtbot, app, text: str, prompts: list) -> tuple[str, list[int]]:
    """Type `text`, press Send, wait for the answer; (mode, prompt ids) the worker reported."""
    view = app.window.chat
    view.input.setPlainText(text)
    before = len(prompts)
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS):
        qtbot.mouseClick(view.send_button, Qt.LeftButton)
    assert len(prompts) == before + 1
    app.store.flush()
    return prompts[-1]


def test_completion_mode_continues_the_text_and_the_switch_goes_to_chat_mode(qtbot, make_app, home, gguf):
    tok = gguf.tokenizer()
    start_of_turn = tok.token_to_id("<start_of_turn>")
    preset(home, backend="cpu", context_length=2048, max_tokens=MAX_TOKENS, temperature=0.0)
    app = make_app()
    assert wait_loaded(qtbot, app)["is_instruction_tuned"] is False
    view = app.window.chat
    assert view.completion_switch.isChecked() and view.mode_line.text().startswith("Completion mode")
    prompts: list = []
    app.worker.prompt_ready.connect(lambda _id, mode, ids: prompts.append((mode, ids)))

    # The example: the plain text, continued (run --raw gives the same words).
    mode, ids = send(qtbot, app, "The capital of France is", prompts)
    assert mode == "completion"
    assert ids == tok.encode("The capital of France is", add_bos=True, parse_special=False)
    assert start_of_turn not in ids
    answer, stats = answers(home)[-1]
    assert answer.startswith(" the capital of the country of France.")
    assert not any(s in answer for s in ("<start_of_turn>", "<end_of_turn>", "model\n", "user\n"))
    # no blank line in those 40 greedy tokens: the length limit ended it
    assert stats["finish_reason"] == "length" and stats["generation_tokens"] == MAX_TOKENS

    # A text whose continuation ends its paragraph: the answer stops at the blank line.
    app.window.new_chat_action.trigger()
    listing = "1. Paris is the capital of France.\n\n2. Berlin is the capital of Germany.\n\n3."
    mode, ids = send(qtbot, app, listing, prompts)
    assert mode == "completion" and ids == tok.encode(listing, add_bos=True, parse_special=False)
    answer, stats = answers(home)[-1]
    assert answer == " London is the capital of England."
    assert stats["finish_reason"] == "stop" and stats["generation_tokens"] < MAX_TOKENS
    assert answer.strip() in view.transcript_text()

    # The switch: this chat goes to chat mode (saved with it); the next answer uses the template.
    conv_id = app.chat.conversation_id
    qtbot.mouseClick(view.completion_switch, Qt.LeftButton)
    assert not view.completion_switch.isChecked() and app.store.conversation(conv_id).mode == "chat"
    assert view.mode_line.text().startswith("Chat mode on a base model")
    mode, ids = send(qtbot, app, "What is the capital of France?", prompts)
    history = [{"role": m.role, "content": m.content} for m in app.store.messages(conv_id)][:-1]
    assert mode == "chat" and ids == ChatFormat.for_tokenizer(tok).encode(history, tok)
    assert ids.count(start_of_turn) == 4  # three messages and the model's turn

    # Kept across a restart: this chat opens in chat mode, the first one still in completion mode.
    app.shutdown()
    again = make_app()
    wait_loaded(qtbot, again)
    assert again.chat.conversation_id == conv_id and not again.window.chat.completion_switch.isChecked()
    first = again.store.list_conversations()[-1].id
    again.chat.open_conversation(first)
    assert again.window.chat.completion_switch.isChecked() and again.chat.chat_mode() == "completion"
