"""Where a remote engine points: the server's base URL, the model, the API key (kept out of repr)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .errors import RemoteError

# How long a client waits for the server's next bytes, the first ones included: those come only
# after the server has read the prompt, which a CPU server or a very long chat can make minutes.
READ_TIMEOUT_S = 60.0  # the default (RemoteEngine, the CLI, a profile saved without one)
READ_TIMEOUT_RANGE_S = (5.0, 3600.0)  # what a profile's "timeout_s" and --remote-timeout take

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def normalise_url(url: str) -> str:
    """ "host:8080", "http://host:8080/", "http://host:8080/v1" → "http://host:8080/v1": the API's
    base as the OpenAI client wants it. A missing scheme means http:// (what local servers speak)."""
    url = url.strip()
    if url and "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    if url and not url.endswith("/v1"):
        url += "/v1"
    return url


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class RemoteTarget:
    """A server speaking the OpenAI protocol. `url` is normalised to end in /v1; `model` None
    means the server's first model from /v1/models."""

    url: str
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", normalise_url(self.url))

    @property
    def host(self) -> str:
        """ "host:port" as typed (no user name or password from the URL): what the UI shows."""
        parts = urlsplit(self.url)
        name = parts.hostname or ""
        if ":" in name:
            name = f"[{name}]"
        try:
            port = parts.port
        except ValueError:
            port = None
        return f"{name}:{port}" if port else name

    def insecure_warning(self) -> str | None:
        """One line when plain http:// goes to another machine (prompts, answers and the API key
        cross the network unencrypted); None for https:// or this computer."""
        parts = urlsplit(self.url)
        if parts.scheme != "http" or is_loopback(parts.hostname or ""):
            return None
        return (
            f"warning: plain http:// to {self.host}: prompts, answers and the API key travel unencrypted (use https://)"
        )

    @property
    def public_url(self) -> str:
        """The URL without a user name or password in it: what messages may show."""
        parts = urlsplit(self.url)
        if "@" not in parts.netloc:
            return self.url
        return parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()

    def validate(self) -> None:
        """RemoteError unless the URL is an http(s) address with a host."""
        parts = urlsplit(self.url)
        try:
            parts.port  # noqa: B018 (a bad port raises here)
        except ValueError:
            raise RemoteError("unreachable", f"not a server address: {self.public_url!r} (bad port)") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteError(
                "unreachable", f"not a server address: {self.public_url!r} (expected http://HOST:PORT or https://…)"
            )
