"""The one error a remote engine raises: a line for the user and a kind for code to act on."""

from __future__ import annotations

from typing import Literal

from phoenix_chat.engine.errors import PhoenixError

RemoteErrorKind = Literal[
    "unreachable",  # no connection: refused, unknown host, no OpenAI API at that address
    "tls",  # the TLS handshake failed (certificate, or https:// to a plain-HTTP port)
    "auth",  # 401 / 403: the API key is missing or wrong
    "model",  # the server has no such model
    "busy",  # 429 after our retries
    "server",  # 5xx, or an error the server reported mid-answer
    "timeout",  # no connection, or no bytes, within the time allowed
    "cut",  # the stream ended before the answer did
    "malformed",  # not an event stream, or an event that is not the JSON it should be
    "refused",  # any other 4xx: the server would not take the request
]


class RemoteError(PhoenixError):
    """A remote server's fault as one line meant for the user (never containing the API key)."""

    def __init__(self, kind: RemoteErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: RemoteErrorKind = kind
