"""Model → Draft model on the real worker: the menu offers a smaller model with the same
tokenizer from the recent files, picking it loads it in the worker, and the next answer is
decoded speculatively with it (the worker's SpeculativeStats reach the saved answer and the
status bar) — token for token the model's own greedy answer; a draft with another tokenizer,
opened with Open…, is refused with a clear message (issue 24, "Speculative decoding from the
app"). The draft is a real 12-layer cut of the embedded 270M (tests/conftest.py)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from phoenix_chat.app.store import db_path
from phoenix_chat.engine.weights import embedded_model_path
from tests.app.conftest import ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, preset, wait_loaded
from tests.tinymodels import tiny_gguf

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def answer(qtbot, app, home, text: str) -> tuple[str, dict]:
    view = app.window.chat
    view.input.setPlainText(text)
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS):
        qtbot.mouseClick(view.send_button, Qt.LeftButton)
    app.store.flush()
    db = sqlite3.connect(db_path(home))
    content, stats = db.execute(
        "SELECT content, stats FROM messages WHERE role='assistant' ORDER BY id DESC"
    ).fetchone()
    return content, json.loads(stats)


def test_draft_model_menu_loads_a_draft_that_speeds_decoding_and_refuses_another_tokenizer(
    qtbot, make_app, home, draft_path, monkeypatch, tmp_path
):
    preset(home, backend="cpu", context_length=2048, max_tokens=24, temperature=0.0, recent_models=[str(draft_path)])
    app = make_app()
    wait_loaded(qtbot, app)
    w = app.window
    # The worker found the 12-layer cut in Recent models (same tokenizer, fewer parameters);
    # the loaded model itself is not offered.
    qtbot.waitUntil(lambda: str(draft_path) in w.draft_actions, timeout=120_000)
    assert str(embedded_model_path()) not in w.draft_actions and w.draft_none_action.isChecked()

    with qtbot.waitSignal(app.drafts.draft_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        w.draft_actions[str(draft_path)].trigger()
    info = ready.args[0]
    assert info["path"] == str(draft_path) and info["layers"] == 12 and info["baseline_tps"] > 0
    assert app.settings.values.draft_model == str(draft_path) and w.draft_actions[str(draft_path)].isChecked()
    assert "prompt cache is off" in w.statusBar().currentMessage()

    drafted, stats = answer(qtbot, app, home, "The capital of France is")
    assert stats["draft_acceptance"] > 0 and stats["draft_speedup"] > 0
    print(f"draft: {stats['draft_acceptance']:.0%} accepted, {stats['draft_speedup']:.2f}x the model alone")
    assert "accepted" in w.draft_label.text() and "× speed" in w.draft_label.text()

    # Draft model → None: the same greedy answer without the draft (speculative decoding is exact).
    with qtbot.waitSignal(app.drafts.draft_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        w.draft_none_action.trigger()
    assert ready.args[0] is None and app.settings.values.draft_model is None
    w.new_chat_action.trigger()
    plain, stats = answer(qtbot, app, home, "The capital of France is")
    assert plain == drafted and stats["draft_acceptance"] is None and w.draft_label.text() == ""

    # Open… a model with another vocabulary: refused, said plainly, not kept.
    other = tiny_gguf(tmp_path / "other-vocabulary.gguf")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(other), ""))
    with qtbot.waitSignal(app.drafts.draft_refused, timeout=LOAD_TIMEOUT_MS) as refused:
        w.draft_open_action.trigger()
    assert "other-vocabulary.gguf" in refused.args[0] and "does not share the tokenizer" in refused.args[0]
    assert "does not share the tokenizer" in w.chat.notice.text() and w.chat.notice.isVisible()
    assert app.settings.values.draft_model is None and w.draft_none_action.isChecked()
    assert str(other) not in w.draft_actions

    # Open… a model that does share the tokenizer (the same 12-layer cut under another name, not in
    # Recent models): loaded, kept, and the next answer is drafted by it — still the greedy answer.
    chosen = tmp_path / "draft-opened.gguf"
    chosen.symlink_to(draft_path)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(chosen), ""))
    with qtbot.waitSignal(app.drafts.draft_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        w.draft_open_action.trigger()
    info = ready.args[0]
    assert info["path"] == str(chosen) and info["layers"] == 12
    assert app.settings.values.draft_model == str(chosen) and w.draft_actions[str(chosen)].isChecked()
    w.new_chat_action.trigger()
    opened, stats = answer(qtbot, app, home, "The capital of France is")
    assert opened == plain and stats["draft_acceptance"] > 0
