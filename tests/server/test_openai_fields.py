"""API fields the openai client sends that no other test followed to the engine: each one alone
changes (or, where it should, keeps) what the engine generates, over real HTTP."""

from __future__ import annotations

import pytest

from phoenix_chat.engine.generate import generate, prompt_ids_for
from phoenix_chat.engine.sampling import SamplingParams

from .conftest import GREEDY

PROMPT = "Once upon a time"
N = 8


def complete(client, server, **fields) -> str:
    extra = {k: fields.pop(k) for k in ("top_k", "min_p", "repetition_penalty") if k in fields}
    r = client.completions.create(
        model=server.state.model_id, prompt=fields.pop("prompt", PROMPT), max_tokens=N, extra_body=extra, **fields
    )
    return r.choices[0].text


def test_top_k_min_p_and_the_penalties_each_reach_the_sampler(client, server, model):
    greedy = generate(model, PROMPT, GREEDY, max_tokens=N, raw=True)
    hot = {"temperature": 1.5, "seed": 11}
    assert complete(client, server, **hot) != greedy  # the control: this seed leaves the greedy path
    assert complete(client, server, **hot, top_k=1) == greedy  # only the most likely token is left
    assert complete(client, server, **hot, top_k=0, top_p=1.0, min_p=1.0) == greedy  # min_p alone
    # penalties at temperature 0: the engine's own penalised greedy answer, not the plain one
    penalised = generate(model, PROMPT, SamplingParams(temperature=0.0, repetition_penalty=2.0), max_tokens=N, raw=True)
    assert penalised != greedy
    assert complete(client, server, temperature=0, repetition_penalty=2.0) == penalised
    assert complete(client, server, temperature=0, presence_penalty=2.0) == penalised  # 1 + 2 / 2
    assert complete(client, server, temperature=0, frequency_penalty=2.0) == penalised


def test_a_prompt_in_a_list_a_plain_stop_string_and_text_parts_reach_the_engine(client, server, model):
    greedy = generate(model, PROMPT, GREEDY, max_tokens=N, raw=True)
    assert complete(client, server, prompt=[PROMPT], temperature=0) == greedy
    cut = greedy.strip().split()[1]  # a word inside the answer: the answer ends before it
    stopped = complete(client, server, temperature=0, stop=cut)
    assert stopped == greedy[: greedy.index(cut)]
    # a user message as an array of text parts is the joined text, through the chat template
    parts = [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]
    whole = [{"role": "user", "content": "Name a colour."}]
    r = client.chat.completions.create(
        model=server.state.model_id, messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0
    )
    assert r.usage.prompt_tokens == len(prompt_ids_for(model, whole))
    assert r.choices[0].message.content == generate(model, whole, GREEDY, max_tokens=4)


@pytest.mark.parametrize("field", [{"n": 1}, {"response_format": {"type": "text"}}])
def test_the_accepted_forms_of_refused_fields_are_answered(client, server, model, field):
    r = client.chat.completions.create(
        model=server.state.model_id,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=4,
        temperature=0,
        **field,
    )
    assert r.choices[0].message.content == generate(
        model, [{"role": "user", "content": "Name a colour."}], GREEDY, max_tokens=4
    )
