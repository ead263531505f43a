"""SamplingParams → the request's fields, and which of them a server refused.

`temperature`, `top_p`, `seed`, `max_tokens`, `stop` and `stream_options` are OpenAI's own
fields; `top_k`, `min_p` and `repetition_penalty` (vLLM's and our server's names) and
`repeat_penalty` (llama.cpp's name for the same penalty) are extras. All are sent with the
user's values, "off" included: a server's own defaults differ from ours (llama.cpp's server
applies top_k 40, min_p 0.05 and repeat_penalty 1.1 unless told otherwise), so leaving a field
out would change the answer. A server that answers 400/422 naming one of the optional fields
gets the request again without it; the field is then left out for the engine's life.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import openai

from phoenix_chat.engine.sampling import SamplingParams

# what may be left out when a server refuses it (the answer still comes, less tuned)
OPTIONAL = ("top_k", "min_p", "repetition_penalty", "repeat_penalty", "seed", "top_p", "stream_options")
EXTRA = ("top_k", "min_p", "repetition_penalty", "repeat_penalty")  # not OpenAI's: sent through extra_body


def request_fields(
    params: SamplingParams, max_tokens: int, stop: list[str] | None, dropped: set[str]
) -> dict[str, Any]:
    """The body's sampling fields (extras included, flat), less the `dropped` ones."""
    fields: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": max(params.temperature, 0.0),
        "top_p": params.top_p,
        "stream_options": {"include_usage": True},
        "top_k": params.top_k,  # 0: off (vLLM, llama.cpp and our server read it so)
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty,
        "repeat_penalty": params.repetition_penalty,
    }
    if params.seed is not None:
        fields["seed"] = params.seed
    if stop:
        fields["stop"] = list(stop)
    return {k: v for k, v in fields.items() if k not in dropped}


def split_extra(fields: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(OpenAI keyword arguments, extra_body) for the client."""
    own = {k: v for k, v in fields.items() if k not in EXTRA}
    return own, {k: v for k, v in fields.items() if k in EXTRA}


def refused_fields(exc: openai.APIStatusError, sent: Mapping[str, Any]) -> list[str]:
    """The optional fields a 400/422 names (its `param`, or its words: "Unrecognized request
    argument supplied: top_k", FastAPI's `loc`); [] when it names none of them."""
    if exc.status_code not in (400, 422):
        return []
    body = exc.body
    param = body.get("param") if isinstance(body, Mapping) else None
    words = json.dumps(body) if body is not None else ""
    named = []
    for field in OPTIONAL:
        if field not in sent:
            continue
        if param == field or param == f"stream_options.{field}" or re.search(rf"\b{field}\b", words):
            named.append(field)
    return named
