"""The guards every request passes before a route sees it (pure ASGI, so they also cover
streaming bodies): body size, Host header (DNS rebinding), browser Origin, bearer key.

Why each: a web page the user visits can reach 127.0.0.1 — directly (a cross-origin POST needs
no preflight when sent as text/plain) or through a DNS name rebound to 127.0.0.1. The Origin
check stops the first, the Host check the second; the key stops everyone else off loopback.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .api_errors import APIError
from .config import ServerConfig

PUBLIC_PATHS = ("/health",)  # reveals nothing about the model or the conversations


class BodyTooLarge(APIError):
    """Raised while a route reads a body past the limit (the app answers it like any APIError)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes", code="request_too_large")


def host_without_port(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8377
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def key_matches(header: str | None, key: str) -> bool:
    """`Authorization: Bearer KEY`, compared in constant time (no timing hint of the key)."""
    if not header:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8"), key.encode("utf-8"))


class SecurityGuard:
    """ASGI middleware in front of the app; refusals are OpenAI error objects."""

    def __init__(self, app: ASGIApp, config: ServerConfig) -> None:
        self.app = app
        self.config = config
        self.hosts = config.host_names()
        self.origins = frozenset(o.rstrip("/").lower() for o in config.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _send_error(send, refusal)
            return
        limit = self.config.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_error(send, BodyTooLarge(limit))
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge as err:  # read outside a route (the routes answer it themselves)
            if not started:
                await _send_error(send, err)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> APIError | None:
        host = host_without_port(headers.get("host", ""))
        if self.hosts is not None and host not in self.hosts:
            return APIError(403, f"Host {host!r} is not a name this server is bound to", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/").lower() not in self.origins:
            return APIError(
                403, "requests from web pages are not allowed (no CORS origins configured)", code="origin_not_allowed"
            )
        path = scope.get("path", "")
        key = self.config.api_key
        if key and path not in PUBLIC_PATHS and scope.get("method") != "OPTIONS":
            if not key_matches(headers.get("authorization"), key):
                return APIError(
                    401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key"
                )
        return None


async def _send_error(send: Send, err: APIError) -> None:
    body = json.dumps(err.body()).encode("utf-8")
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
