"""RemoteEngine: answers from a server that speaks the OpenAI protocol (vLLM, llama.cpp's server,
Ollama, LM Studio, another Phoenix Chat's `serve`), streamed as RemoteDeltas.

The openai client does the protocol (requests, SSE, error types); it is built with
`max_retries=0` because retrying is ours: each wait on a busy server is a notice the user sees.
`stream_chat` / `stream_completion` never raise: every fault, before the first byte or after,
is their final delta (finish "error", or "cut" when text had come) with a one-line `error`.
`models()`, `check()` and `resolved_model()` raise RemoteError. `cancel` is polled between
chunks, during retry waits, while the request waits for the response's headers (the request is
sent from a thread of its own; a Stop there ends the answer at once and that thread closes the
response when it comes, which the server sees as a disconnect) and by a watcher thread while the
stream waits for bytes (so it must be callable from another thread: an Event's is_set is).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import openai

from phoenix_chat.engine.sampling import SamplingParams

from . import faults, fields, retry
from .deltas import RemoteDelta, RemoteUsage
from .errors import RemoteError
from .reading import CANCEL_POLL_S, Clock, Kind, read_stream
from .target import READ_TIMEOUT_S, RemoteTarget

__all__ = ["RemoteDelta", "RemoteEngine", "RemoteError", "RemoteTarget", "RemoteUsage"]

log = logging.getLogger(__name__)

NO_KEY = "no-key"  # sent when the target has none: the client insists on one (and must not read OPENAI_API_KEY)


def _never() -> bool:
    return False


class _StoppedBeforeHeaders(Exception):
    """Stop came while the request still waited for the server's response headers."""


class RemoteEngine:
    """One server and model. Not thread-safe: one answer at a time, as the worker asks."""

    def __init__(
        self, target: RemoteTarget, *, timeout_s: float = READ_TIMEOUT_S, retries: int = 4, backoff_s: float = 1.0
    ):
        target.validate()
        self.target = target
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.unsupported_fields: set[str] = set()  # refused by this server: reported once, then not sent
        self._models: list[str] | None = None
        self._model: str | None = None
        self._client = openai.OpenAI(
            base_url=target.url,
            api_key=target.api_key or NO_KEY,
            max_retries=0,
            timeout=openai.Timeout(timeout_s, connect=min(timeout_s, faults.CONNECT_TIMEOUT_S)),
        )

    def __repr__(self) -> str:
        return f"RemoteEngine({self.target!r})"

    # -- what the server has -------------------------------------------------------------
    def models(self) -> list[str]:
        """The model ids of GET /v1/models (RemoteError on faults)."""
        try:
            page = self._client.models.list()
            ids = [m.id for m in page.data]
        except Exception as exc:
            raise self._describe(exc) from None
        if not all(isinstance(i, str) for i in ids):
            raise RemoteError("malformed", f"{self.target.host}'s model list is not a list of ids")
        self._models = ids
        return ids

    def resolved_model(self) -> str:
        """The target's model, checked against the server's list (so a wrong name fails here,
        also on servers that would answer any name with their default), or the server's first."""
        if self._model is not None:
            return self._model
        ids = self._models if self._models is not None else self.models()
        wanted = self.target.model
        if wanted is None:
            if not ids:
                raise RemoteError("model", f"{self.target.host} serves no model (its /v1/models is empty)")
            self._model = ids[0]
        elif wanted in ids or f"{wanted}:latest" in ids:  # Ollama lists "name:latest" and answers to "name"
            self._model = wanted
        else:
            shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            raise RemoteError("model", f"{self.target.host} has no model {wanted!r} (it serves: {shown or 'none'})")
        return self._model

    def check(self) -> str:
        """The connection test: one line on success, RemoteError otherwise."""
        ids = self.models()
        model = self.resolved_model()
        return f"OK: {self.target.host} serves {model} ({len(ids)} model{'' if len(ids) == 1 else 's'})"

    # -- answers ----------------------------------------------------------------------------
    def stream_chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        max_tokens: int,
        cancel: Callable[[], bool] = _never,
        stop: list[str] | None = None,
    ) -> Iterator[RemoteDelta]:
        """POST /v1/chat/completions (the server applies the model's chat template)."""
        return self._answer("chat", {"messages": messages}, params, max_tokens, cancel, stop)

    def stream_completion(
        self,
        prompt: str,
        params: SamplingParams,
        max_tokens: int,
        cancel: Callable[[], bool] = _never,
        stop: list[str] | None = None,
    ) -> Iterator[RemoteDelta]:
        """POST /v1/completions: `prompt` continued as it is, no template."""
        return self._answer("text", {"prompt": prompt}, params, max_tokens, cancel, stop)

    def close(self) -> None:
        self._client.close()

    # -- inside ---------------------------------------------------------------------------
    def _answer(
        self,
        kind: Kind,
        payload: dict[str, Any],
        params: SamplingParams,
        max_tokens: int,
        cancel: Callable[[], bool],
        stop: list[str] | None,
    ) -> Iterator[RemoteDelta]:
        clock = Clock()
        try:
            model = self.resolved_model()
        except RemoteError as exc:
            yield RemoteDelta(finish_reason="error", error=str(exc), usage=clock.usage(None))
            return
        stream = yield from self._open(kind, model, payload, params, max_tokens, cancel, stop, clock)
        if stream is not None:
            yield from read_stream(stream, kind, clock, cancel, lambda e: self._describe(e, model), self.target.host)

    def _open(
        self,
        kind: Kind,
        model: str,
        payload: dict[str, Any],
        params: SamplingParams,
        max_tokens: int,
        cancel: Callable[[], bool],
        stop: list[str] | None,
        clock: Clock,
    ) -> Generator[RemoteDelta, None, Any]:
        """Send the request until the server takes it: refused optional fields are dropped (a
        notice each), a 429 is retried after a wait (a notice each). Yields those notices, or
        the final delta when it gives up; returns the opened stream (None after a final delta)."""
        busy = 0
        while True:
            if cancel():
                yield RemoteDelta(finish_reason="cancelled", usage=clock.usage(None))
                return None
            sent = fields.request_fields(params, max_tokens, stop, self.unsupported_fields)
            try:
                return self._create_until_cancelled(kind, model, payload, sent, cancel)
            except _StoppedBeforeHeaders:
                yield RemoteDelta(finish_reason="cancelled", usage=clock.usage(None))
                return None
            except openai.APIStatusError as exc:
                refused = fields.refused_fields(exc, sent)
                if refused:
                    yield from self._drop(refused, exc)
                    continue
                if exc.status_code == 429 and busy < self.retries:
                    busy += 1
                    wait = self._busy_wait(exc, busy)
                    if wait is None:
                        failure = self._describe(exc, model)
                        asked = retry.retry_after_s(exc.response.headers.get("retry-after"))
                        error = f"{failure} — it asks to wait {asked:.0f} s; not retrying"
                        yield RemoteDelta(finish_reason="error", error=error, usage=clock.usage(None))
                        return None
                    notice = (
                        f"{self.target.host} is busy (429): retrying in {wait:.3g} s (retry {busy} of {self.retries})"
                    )
                    log.info("%s", notice)
                    yield RemoteDelta(notice=notice)
                    if self._sleep(wait, cancel):
                        yield RemoteDelta(finish_reason="cancelled", usage=clock.usage(None))
                        return None
                    continue
                error = str(self._describe(exc, model))
                if exc.status_code == 429:
                    error += f" — gave up after {busy} retr{'y' if busy == 1 else 'ies'}"
                yield RemoteDelta(finish_reason="error", error=error, usage=clock.usage(None))
                return None
            except Exception as exc:
                yield RemoteDelta(finish_reason="error", error=str(self._describe(exc, model)), usage=clock.usage(None))
                return None

    def _create_until_cancelled(
        self, kind: Kind, model: str, payload: dict[str, Any], sent: dict[str, Any], cancel: Callable[[], bool]
    ) -> Any:
        """`_create` on a thread of its own, so that Stop is seen while the server has not answered
        yet (a long queue, a slow prefill before the first header): _StoppedBeforeHeaders then,
        and the thread closes the stream once it comes (the server sees the disconnect)."""
        outcome: dict[str, Any] = {}
        done, abandoned = threading.Event(), threading.Event()

        def send() -> None:
            try:
                outcome["stream"] = self._create(kind, model, payload, sent)
            except BaseException as exc:  # handed to the caller below
                outcome["error"] = exc
            finally:
                done.set()
                if abandoned.is_set() and "stream" in outcome:
                    outcome["stream"].close()

        threading.Thread(target=send, name="remote-request", daemon=True).start()
        while not done.wait(CANCEL_POLL_S):
            if cancel():
                abandoned.set()
                if done.is_set() and "stream" in outcome:  # it came just now: close it here
                    outcome["stream"].close()
                raise _StoppedBeforeHeaders
        if "error" in outcome:
            raise outcome["error"]
        return outcome["stream"]

    def _create(self, kind: Kind, model: str, payload: dict[str, Any], sent: dict[str, Any]) -> Any:
        own, extra = fields.split_extra(sent)
        args: dict[str, Any] = {"model": model, "stream": True, **payload, **own}
        if extra:
            args["extra_body"] = extra
        if kind == "chat":
            return self._client.chat.completions.create(**args)
        return self._client.completions.create(**args)

    def _drop(self, refused: list[str], exc: openai.APIStatusError) -> Iterator[RemoteDelta]:
        said = faults.one_line(faults.server_message(exc), self.target.api_key, 120)
        for name in refused:
            self.unsupported_fields.add(name)
        names = ", ".join(refused)
        notice = f"{self.target.host} does not take {names}: sent without it from now on (it said: {said})"
        log.info("%s", notice)
        yield RemoteDelta(notice=notice)

    def _busy_wait(self, exc: openai.APIStatusError, retry_no: int) -> float | None:
        """Seconds to wait before retry `retry_no`, or None when the server asks for too long."""
        asked = retry.retry_after_s(exc.response.headers.get("retry-after"))
        if asked is not None and asked > retry.MAX_WAIT_S:
            return None
        return retry.wait_s(asked, retry_no, self.backoff_s)

    @staticmethod
    def _sleep(seconds: float, cancel: Callable[[], bool]) -> bool:
        """Wait; True when `cancel` said stop first."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if cancel():
                return True
            time.sleep(min(left, CANCEL_POLL_S))
        return bool(cancel())

    def _describe(self, exc: BaseException, model: str | None = None) -> RemoteError:
        return faults.describe(exc, self.target, model or self.target.model, self.timeout_s)
