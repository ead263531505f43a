"""Reading one opened SSE stream into RemoteDeltas: text pieces, then one final delta with the
finish reason and the usage (TTFT and tok/s measured here, on the client's clock).

Never raises: a fault while reading ends the answer with a final delta — "cut" when text had
come (it is kept), "error" when none had. Stop is prompt even while the server sends nothing (a
long prefill, a stall): a watcher thread polls `cancel` and shuts the socket down, which wakes
the blocked read at once (closing the response from another thread would not).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from .deltas import RemoteDelta, RemoteFinish, RemoteUsage
from .errors import RemoteError

Kind = Literal["chat", "text"]


CANCEL_POLL_S = 0.05  # how often the watcher looks at `cancel`


class CancelWatcher:
    """While a stream is read: polls `cancel` on a thread of its own and, when it says stop,
    shuts the stream's socket down (where the HTTP library exposes it, as httpx and httpx2 do)."""

    def __init__(self, stream: Any, cancel: Callable[[], bool]) -> None:
        self.stream, self.cancel = stream, cancel
        self.fired = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="remote-cancel-watcher", daemon=True)

    def __enter__(self) -> CancelWatcher:
        self._thread.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(CANCEL_POLL_S):
            if self.cancel():
                self.fired.set()
                shut_down(self.stream)
                return


def shut_down(stream: Any) -> None:
    """Wake a read blocked on the stream's socket (it then fails, and the stream is closed)."""
    try:
        network = stream.response.extensions.get("network_stream")
        sock = network.get_extra_info("socket") if network is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: nothing is blocked on it


class MalformedChunk(ValueError):
    """An event that parsed as JSON but is not a completion chunk."""


@dataclass
class Clock:
    """When the request went out, and when text came: TTFT and generation tok/s."""

    sent: float = field(default_factory=time.perf_counter)
    first: float | None = None
    last: float | None = None
    chunks: int = 0

    def text_came(self) -> None:
        now = time.perf_counter()
        self.first = now if self.first is None else self.first
        self.last = now
        self.chunks += 1

    def usage(self, server: Any) -> RemoteUsage:
        prompt = _int(getattr(server, "prompt_tokens", None))
        completion = _int(getattr(server, "completion_tokens", None))
        tokens = completion if completion is not None else self.chunks
        span = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        return RemoteUsage(
            prompt_tokens=prompt or 0,
            completion_tokens=tokens,
            ttft_s=None if self.first is None else self.first - self.sent,
            generation_tps=(tokens - 1) / span if tokens > 1 and span > 0 else 0.0,
            counted_by_server=completion is not None,
        )


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def pieces(chunk: Any, kind: Kind) -> tuple[str, str | None]:
    """(text, finish reason) of one chunk; MalformedChunk when it has no `choices` list."""
    choices = getattr(chunk, "choices", None)
    if not isinstance(choices, list):
        raise MalformedChunk(f"a chunk without `choices`: {str(chunk)[:120]}")
    text, finish = "", None
    for choice in choices:
        if kind == "chat":
            piece = getattr(getattr(choice, "delta", None), "content", None)
        else:
            piece = getattr(choice, "text", None)
        if piece is not None and not isinstance(piece, str):
            raise MalformedChunk(f"a chunk whose text is not a string: {str(piece)[:120]}")
        text += piece or ""
        finish = getattr(choice, "finish_reason", None) or finish
    return text, finish


def final_reason(server_reason: str) -> RemoteFinish:
    return "length" if server_reason == "length" else "stop"


def read_stream(
    stream: Any,
    kind: Kind,
    clock: Clock,
    cancel: Callable[[], bool],
    describe: Callable[[BaseException], RemoteError],
    host: str,
) -> Iterator[RemoteDelta]:
    """The deltas of an opened openai Stream; it is closed on every way out (a cancel, a fault,
    the consumer closing this generator)."""
    server_usage: Any = None
    finish: str | None = None
    failure: RemoteError | None = None
    cancelled = False
    try:
        content_type = stream.response.headers.get("content-type", "")
        if "text/event-stream" not in content_type:
            failure = RemoteError(
                "malformed", f"{host} answered with {content_type or 'no content type'}, not an event stream"
            )
        else:
            with CancelWatcher(stream, cancel) as watcher:
                try:
                    for chunk in stream:
                        text, reason = pieces(chunk, kind)
                        server_usage = getattr(chunk, "usage", None) or server_usage
                        finish = reason or finish
                        if text:
                            clock.text_came()
                            yield RemoteDelta(text=text, tokens=1)
                        if cancel():
                            cancelled = True
                            break
                except Exception:
                    if not watcher.fired.is_set():
                        raise
                    cancelled = True  # the watcher shut the socket: the read failed on purpose
                cancelled = cancelled or (watcher.fired.is_set() and finish is None)
    except Exception as exc:  # the client's errors, JSON's, ours: each one line (faults.describe)
        failure = describe(exc)
    finally:
        stream.close()  # also when the consumer closes this generator (GeneratorExit passes through)
    if finish is not None:
        failure = None  # a fault after the finish chunk (a usage chunk lost, no [DONE]) cost no answer
    elif failure is None and not cancelled:
        failure = RemoteError("cut", f"{host}'s stream ended before the answer did (no finish reason)")
    usage = clock.usage(server_usage)
    if cancelled:
        yield RemoteDelta(finish_reason="cancelled", usage=usage)
    elif failure is not None:
        yield RemoteDelta(finish_reason="cut" if clock.first is not None else "error", error=str(failure), usage=usage)
    else:
        assert finish is not None
        yield RemoteDelta(finish_reason=final_reason(finish), usage=usage)
