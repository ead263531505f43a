"""The one engine API every client uses (GUI worker, CLI, bench, the local server).

A client builds a `Request`, hands it to `Scheduler.submit` (engine/scheduler.py) and reads a
`RequestStream` of `Delta`s: text as it is produced, then one final delta with the finish reason
and the usage. The stream is a plain iterator for threads and an async iterator for asyncio
clients (pass the loop to `submit`); `RequestStream.cancel()` stops the request within one step.
"""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from phoenix_chat.engine.errors import PhoenixError
from phoenix_chat.engine.generate import Prompt
from phoenix_chat.engine.sampling import SamplingParams

FinishReason = Literal["stop", "length", "context", "cancelled", "error"]


class EngineBusy(PhoenixError):
    """The request queue is full: try again later (the server answers 429 with Retry-After)."""


class PromptTooLong(PhoenixError):
    """The prompt (plus at least one answer token) does not fit the context: refused before it
    takes a slot (the server answers 400 `context_length_exceeded`)."""

    def __init__(self, prompt_tokens: int, context_length: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        super().__init__(
            f"the prompt has {prompt_tokens} tokens; this model's context holds {context_length} "
            "(prompt and answer together)"
        )


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Request:
    """What to generate. `prompt`: a chat (list of {"role", "content"} through the model's chat
    template), a string (one user message, or raw text to continue when `raw`), or PromptIds.
    `stop`: strings that end the answer (not included in it)."""

    prompt: Prompt
    params: SamplingParams = SamplingParams()
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    raw: bool = False
    id: str = field(default_factory=new_request_id)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:  # the scheduler would still have written one token
            raise PhoenixError(f"max_tokens must be at least 1, not {self.max_tokens}")


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    prompt_reused: int = 0  # prompt tokens whose K/V came from a cached prefix (not recomputed)
    ttft_s: float | None = None  # submit to first token, queueing and prefill included
    generation_tps: float = 0.0  # answer tokens per second after the first


@dataclass(frozen=True)
class Delta:
    """A piece of one request's answer; the last one has `finish_reason` and `usage`."""

    request_id: str
    text: str
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: str | None = None  # finish_reason "error": what went wrong, one line


_END = object()

# `Scheduler.cancel` as a stream sees it (keeps this module free of the scheduler)
_CancelFn = Callable[[str], None]


class RequestStream:
    """The deltas of one request, in order. Iterate it (blocking) from a thread, or `async for`
    it when it was submitted with an event loop. Fed by the scheduler's thread."""

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop | None, cancel_fn: _CancelFn) -> None:
        self.request = request
        self.id = request.id
        self._loop = loop
        self._sync: queue.SimpleQueue[Delta | object] = queue.SimpleQueue()
        self._async: asyncio.Queue[Delta | object] | None = asyncio.Queue() if loop is not None else None
        self._cancel_fn = cancel_fn
        self.final: Delta | None = None

    # ---- the scheduler's side -----------------------------------------------------------------

    def put(self, delta: Delta) -> None:
        """Hand a delta to the reader (from the scheduler thread); the one with a finish reason ends it."""
        items: list[Delta | object] = [delta]
        if delta.finish_reason is not None:
            self.final = delta
            items.append(_END)
        for item in items:
            if self._loop is not None and self._async is not None:
                if self._loop.is_closed():
                    return
                self._loop.call_soon_threadsafe(self._async.put_nowait, item)
            else:
                self._sync.put(item)

    # ---- the client's side --------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop generating: the stream ends with finish_reason "cancelled" within one step."""
        self._cancel_fn(self.id)

    def __iter__(self) -> Iterator[Delta]:
        if self._loop is not None:
            raise TypeError("this stream was submitted with an event loop: use `async for`")
        while True:
            item = self._sync.get()
            if item is _END:
                return
            assert isinstance(item, Delta)
            yield item

    async def __aiter__(self) -> AsyncIterator[Delta]:
        if self._async is None:
            raise TypeError("this stream was submitted without an event loop: iterate it from a thread")
        while True:
            item = await self._async.get()
            if item is _END:
                return
            assert isinstance(item, Delta)
            yield item

    def text(self) -> str:
        """Block until the request ends; the whole answer (threads only)."""
        return "".join(d.text for d in self)
