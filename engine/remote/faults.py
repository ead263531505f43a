"""The openai client's exceptions → one line for the user (RemoteError), the API key never in it.

The client wraps what went wrong (httpx's errors, `ssl`, `socket`) as the exception's cause; the
cause chain tells a refused connection from an unknown host, a TLS failure or a timeout. HTTP
library classes are recognised by name, not imported: openai 1.x sits on httpx, later ones on
httpx2, and this module works with both.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
from collections.abc import Iterator, Mapping

import openai

from .errors import RemoteError, RemoteErrorKind
from .target import RemoteTarget

MAX_DETAIL = 200  # characters of a server's own message kept in ours


def redact(text: str, secret: str | None) -> str:
    """`text` with the API key replaced (servers do echo keys: "Incorrect API key provided: …")."""
    return text.replace(secret, "[API key]") if secret else text


def one_line(text: str, secret: str | None, limit: int = MAX_DETAIL) -> str:
    text = " ".join(redact(text, secret).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def server_message(exc: openai.APIStatusError) -> str:
    """The server's own words: OpenAI's error.message, FastAPI's detail, or the body's text."""
    body = exc.body
    if isinstance(body, Mapping):
        for key in ("message", "detail", "error"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
            if value:
                return json.dumps(value)[:MAX_DETAIL]
    try:
        text = exc.response.text
    except Exception:  # a streamed body not read: no words to add
        text = ""
    if re.search(r"<html|<!doctype", text[:200], re.IGNORECASE):  # a proxy's error page: its title
        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        return title.group(1) if title else ""
    return text


def mentions_model(exc: openai.APIStatusError) -> bool:
    body = exc.body
    if isinstance(body, Mapping) and (body.get("param") == "model" or body.get("code") == "model_not_found"):
        return True
    return bool(re.search(r"\bmodel\b", server_message(exc), re.IGNORECASE))


def describe(exc: BaseException, target: RemoteTarget, model: str | None = None, timeout_s: float = 0.0) -> RemoteError:
    """The RemoteError for an exception the client raised while asking `target`."""
    host, key = target.host, target.api_key
    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc, target, model)
    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError is one too
        return _connection_error(exc, host, key, timeout_s)
    if isinstance(exc, openai.APIError):  # an error event inside the stream
        return RemoteError("server", f"{host} reported an error: {one_line(exc.message, key)}")
    if isinstance(exc, ValueError):  # json.JSONDecodeError and pydantic's: an event that is not JSON
        return RemoteError("malformed", f"{host} sent a malformed event: {one_line(str(exc), key)}")
    return RemoteError("server", f"{host}: {type(exc).__name__}: {one_line(str(exc), key)}")


def _status_error(exc: openai.APIStatusError, target: RemoteTarget, model: str | None) -> RemoteError:
    host, key, status = target.host, target.api_key, exc.status_code
    said = one_line(server_message(exc), key)
    detail = f": {said}" if said else ""
    kind: RemoteErrorKind
    if status in (401, 403):
        if not key:
            what = "no API key was sent"
        elif status == 401:
            what = "it refused the API key"
        else:  # 403: the key is known but may not do this (a scope, a model it may not use)
            what = "the API key may not do this"
        kind, text = "auth", f"{host} said {status} ({what}){detail}"
    elif status == 404 and mentions_model(exc):
        kind, text = "model", f"{host} has no model {model!r} (404){detail}"
    elif status == 404:
        kind, text = "unreachable", f"no OpenAI API at {target.public_url} (404 on {exc.response.url.path}){detail}"
    elif status == 429:
        kind, text = "busy", f"{host} is busy (429){detail}"
    elif status >= 500:
        kind, text = "server", f"{host} failed: server error {status}{detail}"
    elif status in (400, 422) and mentions_model(exc) and model and model in said:
        kind, text = "model", f"{host} has no model {model!r} ({status}){detail}"
    else:
        kind, text = "refused", f"{host} refused the request ({status}){detail}"
    return RemoteError(kind, text)


def _connection_error(exc: openai.APIConnectionError, host: str, key: str | None, timeout_s: float) -> RemoteError:
    for cause in _chain(exc):
        name = type(cause).__name__
        if isinstance(cause, ssl.SSLCertVerificationError):
            why = one_line(cause.verify_message or str(cause), None)
            return RemoteError("tls", f"TLS failed with {host}: its certificate is not trusted ({why})")
        if isinstance(cause, ssl.SSLError):
            why = one_line(cause.reason or str(cause), None)
            hint = " (is it a plain http:// server?)" if "WRONG_VERSION_NUMBER" in str(cause) else ""
            return RemoteError("tls", f"TLS failed with {host}: {why}{hint}")
        if isinstance(cause, ConnectionRefusedError):
            return RemoteError("unreachable", f"cannot reach {host}: connection refused (is the server running?)")
        if isinstance(cause, socket.gaierror):
            return RemoteError("unreachable", f"cannot reach {host}: host name not found")
        if name in ("ConnectTimeout", "PoolTimeout"):
            return RemoteError("timeout", f"cannot reach {host}: no connection within {_seconds(timeout_s, True)}")
        if name == "ReadTimeout":
            return RemoteError("timeout", f"{host} sent nothing for {_seconds(timeout_s, False)} (timeout)")
        if name == "WriteTimeout":
            return RemoteError("timeout", f"{host} did not take the request within {_seconds(timeout_s, False)}")
        if name in ("RemoteProtocolError", "ReadError") or isinstance(cause, ConnectionResetError):
            return RemoteError("cut", f"{host} closed the connection: {one_line(str(cause), key)}")
    if isinstance(exc, openai.APITimeoutError):
        return RemoteError("timeout", f"{host} did not answer in time")
    first = next((c for c in _chain(exc) if c is not exc), exc)
    return RemoteError("unreachable", f"cannot reach {host}: {one_line(str(first), key)}")


def _seconds(timeout_s: float, connect: bool) -> str:
    if not timeout_s:
        return "the time allowed"
    return f"{min(timeout_s, CONNECT_TIMEOUT_S) if connect else timeout_s:g} s"


CONNECT_TIMEOUT_S = 10.0  # a server that exists accepts within this; reading may take longer (prefill)
