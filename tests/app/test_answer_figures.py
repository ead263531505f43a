"""The figures line under an answer: what was measured, and nothing that was not."""

from __future__ import annotations

import pytest

from phoenix_chat.app.views.answer_figures import answer_figures
from phoenix_chat.app.views.chat_view import ShownMessage
from phoenix_chat.app.worker.protocol import GenerationStats


def test_measured_figures_are_shown():
    stats = GenerationStats(prompt_tokens=120, generation_tokens=42, generation_tps=18.26, ttft_s=0.3104).to_dict()
    assert answer_figures(stats) == "42 tokens · 18.3 tok/s · TTFT 310 ms · prompt 120 tokens"
    assert answer_figures({**stats, "ttft_s": 12.34}).endswith("TTFT 12.3 s · prompt 120 tokens")
    assert answer_figures({**stats, "generation_tokens": 1, "generation_tps": 0.0}) == (
        "1 token · TTFT 310 ms · prompt 120 tokens"
    )


@pytest.mark.parametrize(
    "stats",
    [
        {},  # the engine died: nothing saved
        {"finish_reason": "interrupted", "note": "Interrupted"},
        GenerationStats(prompt_tokens=2043).to_dict(),  # stopped while the prompt was read
        {**GenerationStats(prompt_tokens=5).to_dict(), "generation_tokens": 0, "generation_tps": 1.8e9},
    ],
)
def test_nothing_is_shown_when_nothing_was_generated(stats):
    assert answer_figures(stats) == ""


def test_nonsense_rates_and_times_are_left_out():
    stats = {"generation_tokens": 3, "generation_tps": 1.8e9, "ttft_s": None, "prompt_tokens": 0}
    assert answer_figures(stats) == "3 tokens"
    assert answer_figures({**stats, "generation_tps": float("inf"), "ttft_s": float("nan")}) == "3 tokens"


@pytest.mark.gui
def test_the_view_shows_figures_under_finished_answers_only(qtbot, qloop, make_app):
    view = make_app(autoload=False).window.chat
    view.set_messages(
        [
            ShownMessage(1, "user", "Hi"),
            ShownMessage(2, "assistant", "Hello", figures="2 tokens · 9.0 tok/s"),
            ShownMessage(3, "user", "More"),
            ShownMessage(4, "assistant", "Still writ", complete=False, figures="1 token"),
        ]
    )
    text = view.transcript_text()
    assert "2 tokens · 9.0 tok/s" in text and "1 token" not in text
