"""A deliberately misbehaving OpenAI-style server: a NAMED TEST DOUBLE for the faults a real server
cannot be made to produce on demand — a stream cut mid-answer, malformed SSE, 429 with
Retry-After and then success, slow headers, a stall mid-stream, a proxy's 5xx page, a server
that refuses an extra sampling field, one that echoes the API key back, one that lists its model
but forbids (403) answering with it. Everything else (a real
answer, 401, an unknown model, Stop) is tested against real servers (ours, llama.cpp's).

Plain asyncio on a thread of its own, one request per connection, raw bytes on the socket (so
a chunked stream can be cut without its last chunk). The first path segment picks the
behaviour: `server.url("cut")` → http://127.0.0.1:PORT/cut/v1. Every request is recorded
(`server.seen`: path, headers, JSON body) for the tests to check what the client sent.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

MODEL = "double-model"
WORDS = ["Hello", ",", " world", "!"]
FORBIDDEN = "You have insufficient permissions for this operation. Missing scopes: model.request."


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None


class MisbehavingServer:
    def __init__(self, tls: ssl.SSLContext | None = None, delay_s: float = 3.0, host: str = "127.0.0.1"):
        self.tls, self.host = tls, host
        self.delay_s = delay_s  # how long "slow" and "stall" keep the client waiting
        self.seen: list[Seen] = []
        self.hits: Counter[str] = Counter()  # answers asked for, per behaviour (the busy ones count them)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="misbehaving-server", daemon=True)
        self._server: asyncio.Server | None = None

    def url(self, behaviour: str, host: str = "127.0.0.1") -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host}:{self.port}/{behaviour}/v1"

    def __enter__(self) -> MisbehavingServer:
        self._thread.start()
        start = asyncio.start_server(self._handle, self.host, 0, ssl=self.tls)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        """Stop listening, end the connections still held (a stall, slow headers)."""
        assert self._server is not None
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one connection ------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen = await _read_request(reader)
            if seen is None:
                return
            self.seen.append(seen)
            parts = seen.path.strip("/").split("/")
            behaviour, endpoint = parts[0], "/".join(parts[1:])
            if endpoint != "v1/models":
                self.hits[behaviour] += 1
            await self._answer(behaviour, endpoint, seen, writer)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # the client went away (a test's cancel, a TLS refusal): nothing to answer
        except asyncio.CancelledError:
            pass  # the double is shutting down with this connection still held
        finally:
            writer.close()

    async def _answer(self, behaviour: str, endpoint: str, seen: Seen, w: asyncio.StreamWriter) -> None:
        name, _, arg = behaviour.partition("-")
        if endpoint == "v1/models":
            return _json(w, 200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "double"}]})
        kind = "chat" if endpoint == "v1/chat/completions" else "text"
        if name == "ok":
            return await _stream(w, kind, WORDS, finish="stop")
        if name == "cut":  # chunked, two pieces, then the connection dies without the last chunk
            await _stream(w, kind, WORDS[:2], finish=None, done=False, end=False)
            w.transport.abort()
            return
        if name == "eof":  # no framing (Connection: close), two pieces, a clean close: no finish, no [DONE]
            return await _stream(w, kind, WORDS[:2], finish=None, done=False, chunked=False)
        if name == "malformed":
            return await _stream(w, kind, WORDS[:1], finish=None, done=False, tail=b'data: {"choices": [{"delta"\n\n')
        if name == "notachunk":
            return await _stream(w, kind, [], finish=None, done=False, tail=b'data: {"hello": "there"}\n\n')
        if name == "errorevent":
            tail = b'data: {"error": {"message": "the engine ran out of memory", "type": "server_error"}}\n\n'
            return await _stream(w, kind, WORDS[:2], finish=None, done=False, tail=tail)
        if name == "html":
            return _raw(w, 200, "text/html", b"<html><body>Welcome to nginx!</body></html>")
        if name == "busy":  # busy-N-R: 429 (Retry-After: R) for the first N requests, then an answer
            count, _, after = arg.partition("-")
            if self.hits[behaviour] <= int(count):
                headers = {"Retry-After": after} if after else {}
                return _json(w, 429, _error("the server is busy", "server_busy"), headers)
            return await _stream(w, kind, WORDS, finish="stop")
        if name == "slow":  # the headers come after `delay_s` (slow-S: after S seconds)
            await asyncio.sleep(float(arg) if arg else self.delay_s)
            return await _stream(w, kind, WORDS, finish="stop")
        if name == "stall":  # two pieces, then nothing for `delay_s` (stall-S: for S seconds)
            await _stream(w, kind, WORDS[:2], finish=None, done=False, end=False)
            await asyncio.sleep(float(arg) if arg else self.delay_s)
            return
        if name == "gateway":  # a proxy in front of a dead server: 502 and an HTML page
            page = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"
            return _raw(w, 502, "text/html", page)
        if name == "strict":  # OpenAI's own refusal of a field it does not know
            extra = [
                f for f in ("top_k", "min_p", "repetition_penalty", "repeat_penalty") if seen.body and f in seen.body
            ]
            if extra:
                message = f"Unrecognized request argument supplied: {extra[0]}"
                return _json(w, 400, _error(message, None, extra[0]))
            return await _stream(w, kind, WORDS, finish="stop")
        if name == "forbidden":  # the key is good, but not for this (OpenAI's 403 for a key without the scope)
            return _json(w, 403, _error(FORBIDDEN, None))
        if name == "echokey":  # a server that quotes the key it refuses
            key = seen.headers.get("authorization", "").removeprefix("Bearer ")
            return _json(w, 401, _error(f"Incorrect API key provided: {key}", "invalid_api_key"))
        return _json(w, 404, _error(f"no behaviour {behaviour!r}", None))


async def _read_request(reader: asyncio.StreamReader) -> Seen | None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    length = int(headers.get("content-length", "0"))
    raw = await reader.readexactly(length) if length else b""
    return Seen(method, path, headers, json.loads(raw) if raw else None)


def _error(message: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def _raw(w: asyncio.StreamWriter, status: int, ctype: str, body: bytes, headers: dict[str, str] | None = None) -> None:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}"
    w.write(head.encode() + b"Connection: close\r\n\r\n" + body)


def _json(w: asyncio.StreamWriter, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
    _raw(w, status, "application/json", json.dumps(obj).encode(), headers)


def _chunk(kind: str, text: str | None, finish: str | None) -> dict[str, Any]:
    if kind == "chat":
        delta = {"content": text} if text is not None else {}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice, obj = {"index": 0, "text": text or "", "finish_reason": finish}, "text_completion"
    return {"id": "x-1", "object": obj, "created": 0, "model": MODEL, "choices": [choice]}


async def _stream(
    w: asyncio.StreamWriter,
    kind: str,
    words: list[str],
    finish: str | None,
    done: bool = True,
    chunked: bool = True,
    tail: bytes = b"",
    end: bool = True,
) -> None:
    """An SSE answer: the words (one event each, flushed one by one), the finish chunk and usage
    if `finish`, `tail` as it is, `[DONE]` if `done`, the closing chunk if `end`."""
    framing = "Transfer-Encoding: chunked\r\n" if chunked else ""
    w.write(f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{framing}Connection: close\r\n\r\n".encode())
    events = [json.dumps(_chunk(kind, word, None)).encode() for word in words]
    if finish:
        events.append(json.dumps(_chunk(kind, None, finish)).encode())
        usage = {"prompt_tokens": 3, "completion_tokens": len(words), "total_tokens": 3 + len(words)}
        events.append(json.dumps({**_chunk(kind, None, None), "choices": [], "usage": usage}).encode())
    payloads = [b"data: " + e + b"\n\n" for e in events] + ([tail] if tail else [])
    if done:
        payloads.append(b"data: [DONE]\n\n")
    for p in payloads:
        w.write(b"%x\r\n%s\r\n" % (len(p), p) if chunked else p)
        await w.drain()
        await asyncio.sleep(0.01)
    if chunked and end:
        w.write(b"0\r\n\r\n")
        await w.drain()
