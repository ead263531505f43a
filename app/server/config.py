"""What the server binds and what it allows: checked before anything listens."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from phoenix_chat.engine.errors import PhoenixError

# No well-known local LLM server uses it (LM Studio 1234, Jan 1337, GPT4All 4891, Ollama 11434,
# llama.cpp 8080, vLLM 8000, SGLang 30000), so Phoenix can run beside any of them.
DEFAULT_PORT = 8377
DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_BODY_BYTES = 4 * 2**20  # a 128k-token chat is about 0.5 MiB of JSON: 4 MiB is generous
DEFAULT_RETRY_AFTER_S = 2  # what a 429 tells a client to wait when the queue is full
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class ServerConfigError(PhoenixError):
    """The server would be unsafe or cannot start with these settings."""


def is_loopback(host: str) -> bool:
    """True for names and addresses only this machine can reach."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """0.0.0.0 / :: bind every interface: no single name can be checked in the Host header."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerConfig:
    """host/port: where to listen (port 0: any free port, see RunningServer.port). api_key: the
    bearer key clients must send (required off loopback). cors_origins: web origins allowed to
    call the API from a browser (none by default). allowed_hosts: extra names the Host header may
    carry (a LAN name, a reverse proxy's). model_id: the name /v1/models lists (default: the
    model file's stem)."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    model_id: str | None = None

    def __repr__(self) -> str:  # the key never reaches a log line through this object
        key = "set" if self.api_key else "none"
        return f"ServerConfig(host={self.host!r}, port={self.port}, api_key={key}, cors_origins={self.cors_origins!r})"

    def check(self) -> None:
        """Refuse settings that would expose the model without a key, or cannot work."""
        if not 0 <= self.port <= 65535:
            raise ServerConfigError(f"port {self.port} is not a TCP port (0-65535)")
        if self.api_key is not None and not self.api_key.strip():
            raise ServerConfigError("the API key is empty")
        if not is_loopback(self.host) and not self.api_key:
            raise ServerConfigError(
                f"binding {self.host} lets other machines reach the model: set an API key (--api-key) or bind 127.0.0.1"
            )
        if self.max_body_bytes < 1024:
            raise ServerConfigError("the request body limit must be at least 1 KiB")

    def host_names(self) -> frozenset[str] | None:
        """Names the Host header may carry (lower case, no port); None: any (a wildcard bind,
        which always has a key)."""
        if is_wildcard(self.host) and not self.allowed_hosts:
            return None
        names = {self.host.lower().strip("[]"), *LOOPBACK_NAMES, *(h.lower() for h in self.allowed_hosts)}
        return frozenset(names)
