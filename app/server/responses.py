"""OpenAI's response shapes: whole completions, stream chunks, usage, finish reasons."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from phoenix_chat.engine.requests import Usage

from .parsing import Kind

# the engine's reasons → OpenAI's: running out of context is "length" to a client
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}


def finish_reason(engine_reason: str | None) -> str:
    return FINISH_REASONS.get(engine_reason or "", "stop")


def usage_object(usage: Usage | None) -> dict[str, Any]:
    prompt = usage.prompt_tokens if usage else 0
    completion = usage.completion_tokens if usage else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": usage.prompt_reused if usage else 0},
    }


@dataclass(frozen=True)
class Shape:
    """The id, creation time and model name every object of one response carries."""

    kind: Kind
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.request_id

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, reason: str | None, usage: Usage | None) -> dict[str, Any]:
        """A non-streamed answer."""
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason(reason),
            }
            out = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(reason)}
            out = self._base("text_completion")
        return {**out, "choices": [choice], "usage": usage_object(usage)}

    def chunk(
        self, text: str | None, reason: str | None = None, first: bool = False, with_usage: bool = False
    ) -> dict[str, Any]:
        """A stream chunk: text, or (reason given) the last choice chunk. With include_usage every
        chunk carries `usage: null` and a last chunk (`usage_chunk`) the numbers, as OpenAI's do."""
        done = finish_reason(reason) if reason is not None else None
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": done}
            out = self._base("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": done}
            out = self._base("text_completion")
        out["choices"] = [choice]
        if with_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage_object(usage)}
