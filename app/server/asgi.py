"""The Starlette app: routes, OpenAI error objects for every refusal, the security guard in
front, CORS only for configured origins."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from .api_errors import APIError
from .config import ServerConfig
from .routes import chat_completions, completions, health, models
from .security import SecurityGuard
from .state import ServerState


async def _api_error(request: HTTPRequest, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def _http_error(request: HTTPRequest, exc: Exception) -> Response:
    """404 and 405 from routing, in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code).response()


def build_app(state: ServerState) -> ASGIApp:
    config: ServerConfig = state.config
    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={APIError: _api_error, HTTPException: _http_error},
    )
    app.state.phoenix = state
    inner: ASGIApp = app
    if config.cors_origins:
        inner = CORSMiddleware(
            app,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
        )
    return SecurityGuard(inner, config)
