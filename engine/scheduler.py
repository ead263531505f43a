"""The scheduler: owns one loaded model and serves `Request`s (engine/requests.py) from a queue.

Every client — the GUI worker, the CLI, the bench, the local server — submits here and reads a
`RequestStream`. A bounded queue holds what waits: a full queue refuses at once (`EngineBusy`),
and a prompt that cannot fit the context is refused before it waits (`PromptTooLong`).

This version serves one request at a time on its own thread through the model's `PromptCache`
(so a conversation's next turn prefills only its new tokens); many slots and batched decode
steps come with the backends' `n_slots` (engine/backends/base.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import TYPE_CHECKING

from phoenix_chat.engine.generate import PromptIds, prompt_ids_for, stream_generate
from phoenix_chat.engine.prompt_cache import PromptCache
from phoenix_chat.engine.requests import Delta, EngineBusy, PromptTooLong, Request, RequestStream, Usage
from phoenix_chat.engine.stop_strings import StopMatcher

if TYPE_CHECKING:
    from phoenix_chat.engine.loader import LoadedModel

log = logging.getLogger("phoenix.engine")

DEFAULT_MAX_QUEUE = 64


class Scheduler:
    """Serves requests for one model on a thread of its own; `close()` ends it (pending requests
    end "cancelled")."""

    def __init__(self, model: LoadedModel, max_queue: int = DEFAULT_MAX_QUEUE) -> None:
        self.model = model
        self.max_queue = max_queue
        self.cache = PromptCache(model.backend)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: collections.deque[tuple[RequestStream, list[int], float]] = collections.deque()
        self._cancelled: set[str] = set()
        self._running: RequestStream | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="phoenix-scheduler", daemon=True)
        self._thread.start()

    # ---- clients ----------------------------------------------------------------------------

    def submit(self, request: Request, loop: asyncio.AbstractEventLoop | None = None) -> RequestStream:
        """Queue `request`; its deltas arrive on the returned stream (async when `loop` is given).
        Raises PromptTooLong before queueing a prompt that leaves no room for an answer, and
        EngineBusy when `max_queue` requests already wait."""
        ids = prompt_ids_for(self.model, request.prompt, request.raw)
        limit = self.model.backend.context_length
        if len(ids) >= limit:
            raise PromptTooLong(len(ids), limit)
        stream = RequestStream(request, loop, self.cancel)
        with self._lock:
            if self._closed:
                raise EngineBusy("the engine is shutting down")
            if len(self._pending) >= self.max_queue:
                raise EngineBusy(f"{len(self._pending)} requests are waiting (the limit): try again shortly")
            self._pending.append((stream, ids, time.perf_counter()))
            self._wake.notify()
        return stream

    def cancel(self, request_id: str) -> None:
        """Stop a waiting or running request (it ends with finish_reason "cancelled")."""
        with self._lock:
            self._cancelled.add(request_id)
            self._wake.notify()

    @property
    def active(self) -> int:
        """Requests running now."""
        return 1 if self._running is not None else 0

    @property
    def waiting(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    # ---- the serving thread -------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    pending, self._pending = list(self._pending), collections.deque()
                    break
                stream, ids, queued_at = self._pending.popleft()
                self._running = stream
            try:
                self._run(stream, ids, queued_at)
            except Exception as err:  # a bug or a device failure: this request ends, the engine goes on
                log.exception("request %s failed", stream.id)
                stream.put(Delta(stream.id, "", finish_reason="error", error=f"{type(err).__name__}: {err}"))
                self.cache.forget()
            finally:
                with self._lock:
                    self._running = None
                    self._cancelled.discard(stream.id)
        for stream, _, _ in pending:
            stream.put(Delta(stream.id, "", finish_reason="cancelled", usage=Usage(0, 0)))

    def _is_cancelled(self, request_id: str) -> bool:
        return request_id in self._cancelled or self._closed

    def _run(self, stream: RequestStream, ids: list[int], queued_at: float) -> None:
        req = stream.request
        stops = StopMatcher(req.stop)
        count = 0
        first_at: float | None = None
        last = None
        for rec in stream_generate(
            self.model,
            PromptIds(tuple(ids)),
            req.params,
            req.max_tokens,
            cancel=lambda: self._is_cancelled(stream.id),
            cache=self.cache,
        ):
            last = rec
            if rec.token is not None:
                count += 1
                if first_at is None:
                    first_at = time.perf_counter()
            text = stops.feed(rec.text)
            if text and rec.finish_reason is None:
                stream.put(Delta(stream.id, text, (rec.token,) if rec.token is not None else ()))
            elif text:
                stream.put(Delta(stream.id, text))
            if stops.stopped:
                break
        reason = "stop" if stops.stopped else (last.finish_reason if last is not None else "error")
        tail = stops.flush()
        usage = Usage(
            prompt_tokens=len(ids),
            completion_tokens=last.generation_tokens if last is not None else 0,
            prompt_reused=last.prompt_reused if last is not None else 0,
            ttft_s=None if first_at is None else first_at - queued_at,
            generation_tps=last.generation_tps if last is not None else 0.0,
        )
        stream.put(Delta(stream.id, tail, finish_reason=reason, usage=usage))  # type: ignore[arg-type]
