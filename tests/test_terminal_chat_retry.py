"""`/retry` in the terminal chat (app/terminal_chat.py) on the real embedded 270M: the last answer
is replaced by a fresh one to the same history. Checked at the engine: every Request the chat
submits is recorded with the prompt ids the scheduler makes of it."""

from __future__ import annotations

import copy
import io

import pytest

from phoenix_chat.app import terminal_chat as tc
from phoenix_chat.engine.generate import generate, prompt_ids_for
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0)
HOT = SamplingParams(temperature=1.5)  # no seed: each answer is a fresh draw


class Watched:
    """A RequestStream seen through: its text and final usage go into `record`."""

    def __init__(self, stream, record: dict) -> None:
        self.stream, self.record = stream, record

    def __iter__(self):
        parts = []
        for d in self.stream:
            parts.append(d.text)
            if d.finish_reason is not None:
                self.record["text"], self.record["usage"] = "".join(parts), d.usage
            yield d

    @property
    def final(self):
        return self.stream.final


class Recording(Scheduler):
    """The real scheduler; each submit's prompt, the prompt ids it makes of it and the answer
    are kept in `sent`."""

    sent: list[dict] = []

    def submit(self, request, loop=None):
        record = {
            "prompt": copy.deepcopy(request.prompt),
            "ids": prompt_ids_for(self.model, request.prompt, request.raw),
        }
        Recording.sent.append(record)
        return Watched(super().submit(request, loop), record)


@pytest.fixture
def recorded(monkeypatch):
    Recording.sent = []
    monkeypatch.setattr(tc, "Scheduler", Recording)
    return Recording.sent


def chat(model, params, script: str, **kw) -> str:
    out = io.StringIO()
    assert tc.terminal_chat(model, params, 12, stdin=io.StringIO(script), stdout=out, **kw) == 0
    return out.getvalue()


def test_retry_asks_the_same_history_again_and_replaces_the_answer(cpu_model, recorded):
    out = chat(cpu_model, HOT, "Name a colour.\n/retry\nAnother one.\n")
    first, retried, third = recorded
    question = [{"role": "user", "content": "Name a colour."}]
    # the retry's prompt is the first answer's, to the token: the first answer is not in it
    assert first["prompt"] == retried["prompt"] == question
    assert retried["ids"] == first["ids"] and retried["usage"].prompt_tokens == len(first["ids"])
    assert first["text"] != retried["text"]  # a fresh draw (temperature 1.5, 12 tokens)
    # the next turn's history holds the retried answer only
    assert third["prompt"] == [
        *question,
        {"role": "assistant", "content": retried["text"]},
        {"role": "user", "content": "Another one."},
    ]
    assert third["ids"] == prompt_ids_for(cpu_model, third["prompt"], False)
    assert f"> {first['text']}\n> {retried['text']}\n> {third['text']}\n" in out


def test_a_greedy_retry_is_the_models_answer_to_the_same_question(cpu_model, recorded):
    """Greedy: the retried answer is what the model gives the question afresh (the slot's K/V,
    which held the first answer after the question, is cut back to the question)."""
    out = chat(cpu_model, GREEDY, "Name a colour.\n/retry\n/retry\n")
    expected = generate(cpu_model, [{"role": "user", "content": "Name a colour."}], GREEDY, max_tokens=12)
    assert [r["text"] for r in recorded] == [expected] * 3
    assert len({tuple(r["ids"]) for r in recorded}) == 1
    assert all(r["usage"].prompt_reused > 0 for r in recorded[1:])  # the question's K/V is reused
    assert out.count(f"> {expected}\n") == 3


def test_nothing_to_retry(cpu_model, recorded):
    out = chat(cpu_model, GREEDY, "/retry\nHi\n/reset\n/retry\n", system="Be brief.")
    assert out.count("(nothing to retry: send a message first)") == 2 and len(recorded) == 1
    assert recorded[0]["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    banner = out.splitlines()[0]
    assert "/retry (a new answer to your last message)" in banner
