"""OpenAI request bodies → what to generate, validated field by field (each refusal names its
`param`, as OpenAI's do). Unknown fields are ignored (clients send many); fields we cannot honour
(n > 1, logprobs, tools, echo, suffix) are refused rather than silently dropped.

Sampling: a field left out is the engine's SamplingParams default (the model's recommended
top_k 64 / top_p 0.95 / temperature 1). Penalties: the engine has llama.cpp's multiplicative
`repetition_penalty` (accepted as an extra field); OpenAI's additive presence/frequency
penalties are mapped onto it as 1 + max(presence, frequency) / 2 when positive (2.0 → 2.0,
0.5 → 1.25); zero or negative ones mean no penalty. `max_tokens` (or
`max_completion_tokens`) is capped at what the context leaves after the prompt; left out, the
answer may fill the context.

Pictures: a user message's content may hold OpenAI `image_url` parts whose url is a base64
`data:` URL (`data:image/png;base64,...`); they become the engine's image parts (the bytes,
decoded and checked by engine/vision/images.py when the prompt is encoded). Remote http(s)
URLs are refused, never fetched. Gemma 3's pan-and-scan crops (engine/vision/images.py) are asked
for with the extension field `"pan_and_scan": true` at the request's top level (OpenAI has none):
every picture of the request is then also shown to the model as up to 4 crops (off by default).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from phoenix_chat.engine.generate import Prompt, PromptIds
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams

from .api_errors import bad_request

if TYPE_CHECKING:
    from phoenix_chat.engine.vision.spans import ImageSpan

MAX_STOP_STRINGS = 16
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
Kind = Literal["chat", "text"]


@dataclass(frozen=True)
class Generation:
    """One validated request: its prompt (messages, or raw text / ids), sampling and limits."""

    kind: Kind
    prompt: Prompt
    params: SamplingParams
    max_tokens: int | None  # None: up to the context
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    model: str | None

    def to_request(self, prompt_ids: list[int], context_length: int, images: Sequence[ImageSpan] = ()) -> Request:
        """The engine request for the tokenized prompt (with its pictures' spans), its answer
        capped by the context left."""
        room = max(context_length - len(prompt_ids), 1)  # a prompt that leaves none is refused at submit
        wanted = room if self.max_tokens is None else min(self.max_tokens, room)
        prompt = PromptIds(tuple(prompt_ids), tuple(images))
        return Request(prompt, self.params, max_tokens=wanted, stop=self.stop, raw=True)


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    return data


def parse_chat(body: Mapping[str, Any]) -> Generation:
    """POST /v1/chat/completions."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array of messages", param="messages")
    chat = [_message(m, i) for i, m in enumerate(messages)]
    if _bool(body.get("pan_and_scan"), "pan_and_scan", False):  # our extension: every picture of the request
        chat = [_with_pan_and_scan(m) for m in chat]
    for key in ("tools", "functions"):
        if body.get(key):
            raise bad_request(f"`{key}` is not supported by this server", param=key)
    if body.get("logprobs") or body.get("top_logprobs"):
        raise bad_request("`logprobs` is not supported by this server", param="logprobs")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise bad_request("only response_format {'type': 'text'} is supported", param="response_format")
    limit_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _common(body, "chat", chat, body.get(limit_field), limit_field)


def parse_completion(body: Mapping[str, Any]) -> Generation:
    """POST /v1/completions: a raw prompt (text, or token ids), continued as it is — no chat
    template; special-token text in it is parsed (the caller writes the whole prompt)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # clients often wrap one prompt in a list
    parsed: Prompt
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("`prompt` is empty", param="prompt")
        parsed = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        parsed = PromptIds(tuple(prompt))
    else:
        raise bad_request("`prompt` must be a non-empty string or an array of token ids", param="prompt")
    if body.get("echo"):
        raise bad_request("`echo` is not supported by this server", param="echo")
    if body.get("suffix"):
        raise bad_request("`suffix` is not supported by this server", param="suffix")
    if body.get("logprobs") is not None:
        raise bad_request("`logprobs` is not supported by this server", param="logprobs")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad_request("`best_of` must be 1", param="best_of")
    return _common(body, "text", parsed, body.get("max_tokens"), "max_tokens")


def _common(body: Mapping[str, Any], kind: Kind, prompt: Prompt, max_tokens: Any, limit_field: str) -> Generation:
    """What both endpoints share; `limit_field` is the field `max_tokens` came in (named in a refusal)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("`model` must be a string", param="model")
    n = body.get("n")
    if n is not None and (_int(n, "n") != 1):
        raise bad_request("`n` must be 1: this server returns one choice per request", param="n")
    stream = _bool(body.get("stream"), "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("`stream_options` must be an object", param="stream_options")
    include_usage = _bool((options or {}).get("include_usage"), "stream_options.include_usage", False)
    limit = None if max_tokens is None else _int(max_tokens, limit_field)
    if limit is not None and limit < 1:
        raise bad_request(f"`{limit_field}` must be at least 1", param=limit_field)
    return Generation(
        kind=kind,
        prompt=prompt,
        params=_sampling(body),
        max_tokens=limit,
        stop=_stop(body.get("stop")),
        stream=stream,
        include_usage=include_usage,
        model=model,
    )


def _sampling(body: Mapping[str, Any]) -> SamplingParams:
    p = SamplingParams()
    given: dict[str, Any] = {}
    if (t := body.get("temperature")) is not None:
        given["temperature"] = _number(t, "temperature", 0.0, 2.0)
    if (v := body.get("top_p")) is not None:
        given["top_p"] = _number(v, "top_p", 0.0, 1.0)
    if (v := body.get("min_p")) is not None:
        given["min_p"] = _number(v, "min_p", 0.0, 1.0)
    if (v := body.get("top_k")) is not None:
        given["top_k"] = _int(v, "top_k")
        if given["top_k"] < 0:
            raise bad_request("`top_k` must be 0 (off) or more", param="top_k")
    if (v := body.get("seed")) is not None:
        given["seed"] = _int(v, "seed")
        if given["seed"] < 0:
            raise bad_request("`seed` must be 0 or more", param="seed")
    penalty = body.get("repetition_penalty")
    if penalty is not None:
        given["repetition_penalty"] = _number(penalty, "repetition_penalty", 0.01, 10.0)
    else:
        presence = _number(body.get("presence_penalty", 0.0), "presence_penalty", -2.0, 2.0)
        frequency = _number(body.get("frequency_penalty", 0.0), "frequency_penalty", -2.0, 2.0)
        strongest = max(presence, frequency)
        if strongest > 0:
            given["repetition_penalty"] = 1.0 + strongest / 2.0
    return replace(p, **given)


def _message(m: Any, i: int) -> dict[str, Any]:
    param = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"{param} must be an object with `role` and `content`", param=param)
    role = m.get("role")
    if role not in CHAT_ROLES:
        raise bad_request(
            f"{param}.role must be one of {', '.join(sorted(CHAT_ROLES))} (got {role!r})", param=f"{param}.role"
        )
    return {"role": CHAT_ROLES[role], "content": _content(m.get("content"), f"{param}.content")}


def _with_pan_and_scan(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, str):
        return message
    parts = [{**p, "pan_and_scan": True} if p["type"] == "image" else p for p in content]
    return {**message, "content": parts}


def _content(content: Any, param: str) -> str | list[dict[str, Any]]:
    """A string, or OpenAI's array of parts: text parts alone are joined into one string; with
    `image_url` parts the engine's parts, in order (text, and images as their bytes)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            where = f"{param}[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                parts.append({"type": "image", "image": _image_bytes(part.get("image_url"), f"{where}.image_url")})
            else:
                raise bad_request(f"{where}: only text and image_url parts are supported", param=where)
        if all(p["type"] == "text" for p in parts):
            return "".join(p["text"] for p in parts)
        return parts
    raise bad_request(f"{param} must be a string or an array of text and image_url parts", param=param)


def _image_bytes(image_url: Any, param: str) -> bytes:
    """The picture of an `image_url` part: only base64 `data:` URLs (nothing is fetched)."""
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str) or not url:
        raise bad_request(f"{param}.url must be a data: URL string", param=f"{param}.url", code="invalid_image_url")
    scheme = url.split(":", 1)[0].lower()
    if scheme in ("http", "https"):
        raise bad_request(
            f"{param}.url: remote image URLs are not fetched by this server; send the picture inline "
            "as a data: URL (data:image/png;base64,...)",
            param=f"{param}.url",
            code="invalid_image_url",
        )
    header, comma, payload = url.partition(",")
    if scheme != "data" or not comma or not header.lower().endswith(";base64"):
        raise bad_request(
            f"{param}.url must be a base64 data: URL (data:image/png;base64,...)",
            param=f"{param}.url",
            code="invalid_image_url",
        )
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"{param}.url: bad base64 ({exc})", param=f"{param}.url", code="invalid_image") from None
    if not data:
        raise bad_request(f"{param}.url: the picture is empty", param=f"{param}.url", code="invalid_image")
    return data


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("`stop` must be a string or an array of strings", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"`stop` takes at most {MAX_STOP_STRINGS} strings", param="stop")
    return tuple(s for s in stop if s)


def _bool(v: Any, param: str, default: bool) -> bool:
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"`{param}` must be true or false", param=param)
    return v


def _int(v: Any, param: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"`{param}` must be an integer", param=param)
    return v


def _number(v: Any, param: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_request(f"`{param}` must be a number", param=param)
    if not lo <= v <= hi:
        raise bad_request(f"`{param}` must be between {lo:g} and {hi:g}", param=param)
    return float(v)
