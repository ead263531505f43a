"""A chat longer than the context: what prompt ids the model actually reads under each overflow
policy, a single huge paste, continuing an answer, and the "auto" context (real embedded model)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from phoenix_chat import engine
from phoenix_chat.engine.generate import stream_generate
from phoenix_chat.engine.prompt_fit import CUT_MARK, answer_reserve, encode_chat, fit_chat
from phoenix_chat.engine.sampling import SamplingParams

CTX = 512
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def small_model(model_path):
    return engine.load(model_path, backend="cpu", context_length=CTX)


def chat(pairs: int) -> list[dict]:
    msgs = [{"role": "system", "content": "SYSTEM-PROMPT: answer briefly."}]
    for i in range(pairs):
        msgs.append({"role": "user", "content": f"QUESTION-{i} " + "tell me about rivers and hills " * 12})
        msgs.append({"role": "assistant", "content": f"ANSWER-{i} " + "rivers run down the hills " * 12})
    msgs.append({"role": "user", "content": "LAST-QUESTION what now?"})
    return msgs


def read(model, fitted) -> str:
    return model.tokenizer.decode(list(fitted.prompt.ids))


def test_a_chat_that_fits_is_sent_whole(small_model):
    msgs = chat(1)
    fitted = fit_chat(small_model, msgs, "drop_oldest", MAX_TOKENS)
    assert not fitted.changed and list(fitted.prompt.ids) == small_model.chat.encode(msgs, small_model.tokenizer)


def test_drop_oldest_keeps_the_system_prompt_and_the_newest_messages(small_model):
    msgs = chat(8)
    assert len(small_model.chat.encode(msgs, small_model.tokenizer)) > CTX
    fitted = fit_chat(small_model, msgs, "drop_oldest", MAX_TOKENS)
    text = read(small_model, fitted)
    assert len(fitted.prompt.ids) <= CTX - answer_reserve(CTX, MAX_TOKENS)
    assert fitted.dropped_messages % 2 == 0 and fitted.dropped_messages > 0 and fitted.cut_tokens == 0
    assert "SYSTEM-PROMPT" in text and "LAST-QUESTION" in text and "ANSWER-7" in text
    assert "QUESTION-0" not in text and "ANSWER-0" not in text
    final = list(stream_generate(small_model, fitted.prompt, SamplingParams(temperature=0), max_tokens=4))[-1]
    assert final.finish_reason in ("length", "stop") and final.prompt_tokens == len(fitted.prompt.ids)


def test_truncate_middle_keeps_the_first_exchange_and_drops_the_ones_after_it(small_model):
    fitted = fit_chat(small_model, chat(8), "truncate_middle", MAX_TOKENS)
    text = read(small_model, fitted)
    assert len(fitted.prompt.ids) <= CTX - answer_reserve(CTX, MAX_TOKENS)
    assert "SYSTEM-PROMPT" in text and "QUESTION-0" in text and "LAST-QUESTION" in text
    assert "ANSWER-0" not in text and "QUESTION-1 " not in text  # pairs after the first question go


def test_a_paste_longer_than_the_context_is_cut_in_the_middle(small_model):
    paste = "BEGINNING " + "a long pasted log line with numbers 12345 " * 1000 + " THE-END"
    assert len(paste) > 40_000
    msgs = chat(2)[:-1] + [{"role": "user", "content": paste}]
    for policy in ("drop_oldest", "truncate_middle"):
        fitted = fit_chat(small_model, msgs, policy, MAX_TOKENS)
        text = read(small_model, fitted)
        assert len(fitted.prompt.ids) <= CTX - answer_reserve(CTX, MAX_TOKENS)
        assert fitted.cut_tokens > 8000
        assert "BEGINNING" in text and "THE-END" in text and CUT_MARK.strip() in text and "SYSTEM-PROMPT" in text
    final = list(stream_generate(small_model, fitted.prompt, SamplingParams(temperature=0), max_tokens=4))[-1]
    assert final.finish_reason in ("length", "stop") and final.generation_tokens > 0


def test_continue_leaves_the_partial_answer_open(small_model):
    msgs = [{"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "One, two,"}]
    ids = encode_chat(small_model, msgs, continue_final=True)
    question = small_model.chat.encode(msgs[:1], small_model.tokenizer)
    assert ids[: len(question)] == question
    assert small_model.tokenizer.decode(ids[len(question) :]) == "One, two,"


def test_auto_context_is_the_largest_that_fits(model_path, monkeypatch):
    from phoenix_chat.engine.backends import cpu
    from phoenix_chat.engine.weights import open_weights

    full = engine.load(model_path, backend="cpu")  # context_length None: auto
    assert full.backend.context_length == full.config.context_length == 32768
    full.close()
    # A machine with memory for an 8,192-token cache but not a 16,384 one gets 8,192.
    weights = open_weights(model_path)
    room = cpu.f32_footprint(weights, 8192) / 0.9 + 1
    assert cpu.f32_footprint(weights, 16384) > room * 0.9
    monkeypatch.setattr(cpu.psutil, "virtual_memory", lambda: SimpleNamespace(available=room, total=room))
    assert engine.load(model_path, backend="cpu").backend.context_length == 8192
