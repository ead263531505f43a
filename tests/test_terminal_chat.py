"""The terminal chat (app/terminal_chat.py) on the real embedded 270M, through the scheduler:
each turn's answer is the model's answer to the whole conversation so far."""

from __future__ import annotations

import io

from phoenix_chat.app.terminal_chat import terminal_chat
from phoenix_chat.engine.generate import generate
from phoenix_chat.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)


def test_two_turns_answer_the_whole_conversation(cpu_model):
    out = io.StringIO()
    assert terminal_chat(cpu_model, GREEDY, 6, stdin=io.StringIO("Name a colour.\nAnother one.\n"), stdout=out) == 0
    first = generate(cpu_model, [{"role": "user", "content": "Name a colour."}], GREEDY, max_tokens=6)
    chat2 = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "Another one."},
    ]
    second = generate(cpu_model, chat2, GREEDY, max_tokens=6)
    assert f"> {first}\n> {second}\n" in out.getvalue()
