"""OpenAI bodies → engine requests (no model needed): sampling fields reach SamplingParams,
penalties map onto the engine's repetition penalty, max_tokens is capped by the context."""

from __future__ import annotations

import pytest

from phoenix_chat.app.server.api_errors import APIError
from phoenix_chat.app.server.parsing import parse_chat, parse_completion
from phoenix_chat.engine.generate import PromptIds
from phoenix_chat.engine.sampling import SamplingParams

HELLO = [{"role": "user", "content": "Hello"}]


def test_sampling_fields_reach_the_engine():
    g = parse_chat(
        {"messages": HELLO, "temperature": 0.3, "top_p": 0.8, "top_k": 20, "min_p": 0.05, "seed": 11, "stop": "END"}
    )
    assert g.params == SamplingParams(temperature=0.3, top_p=0.8, top_k=20, min_p=0.05, seed=11)
    assert g.stop == ("END",)


def test_left_out_fields_are_the_engines_defaults():
    g = parse_chat({"messages": HELLO})
    assert g.params == SamplingParams() and g.max_tokens is None and not g.stream and g.stop == ()


@pytest.mark.parametrize(
    "body, penalty",
    [
        ({"presence_penalty": 0.5}, 1.25),
        ({"frequency_penalty": 2.0, "presence_penalty": 1.0}, 2.0),
        ({"presence_penalty": -1.0}, 1.0),
        ({"repetition_penalty": 1.1, "presence_penalty": 2.0}, 1.1),
    ],
)
def test_penalties_map_onto_the_repetition_penalty(body, penalty):
    assert parse_chat({"messages": HELLO, **body}).params.repetition_penalty == pytest.approx(penalty)


def test_max_completion_tokens_wins_and_the_context_caps_it():
    g = parse_chat({"messages": HELLO, "max_tokens": 50, "max_completion_tokens": 7})
    assert g.max_tokens == 7
    assert g.to_request(list(range(10)), 100).max_tokens == 7
    assert parse_chat({"messages": HELLO, "max_tokens": 10**9}).to_request(list(range(90)), 100).max_tokens == 10
    assert parse_chat({"messages": HELLO}).to_request(list(range(90)), 100).max_tokens == 10


def test_the_request_carries_the_tokenized_prompt():
    req = parse_chat({"messages": HELLO}).to_request([2, 5, 6], 100)
    assert req.prompt == PromptIds((2, 5, 6)) and req.raw


def test_text_parts_are_joined_and_developer_is_system():
    g = parse_chat(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]},
            ]
        }
    )
    assert g.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


def test_completion_prompts_text_ids_or_one_in_a_list():
    assert parse_completion({"prompt": "Hi"}).prompt == "Hi"
    assert parse_completion({"prompt": ["Hi"]}).prompt == "Hi"
    assert parse_completion({"prompt": [2, 9]}).prompt == PromptIds((2, 9))


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "logprobs": 2}, "logprobs"),
        ({"prompt": "x", "stream_options": []}, "stream_options"),
    ],
)
def test_completion_refusals_name_the_field(body, param):
    with pytest.raises(APIError) as exc:
        parse_completion(body)
    assert exc.value.status == 400 and exc.value.param == param


@pytest.mark.parametrize(
    "extra, param",
    [({"tools": [{"type": "function"}]}, "tools"), ({"logprobs": True}, "logprobs"),
     ({"response_format": {"type": "json_object"}}, "response_format"), ({"n": 3}, "n")],
)  # fmt: skip
def test_chat_features_we_cannot_honour_are_refused_not_dropped(extra, param):
    with pytest.raises(APIError) as exc:
        parse_chat({"messages": HELLO, **extra})
    assert exc.value.param == param


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [0, 2.5, "10"])
def test_a_bad_token_limit_names_the_field_it_came_in(field, value):
    with pytest.raises(APIError) as exc:
        parse_chat({"messages": HELLO, field: value})
    assert exc.value.status == 400 and exc.value.param == field
