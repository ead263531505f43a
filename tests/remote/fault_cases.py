"""The faults every client must report as one line (issue 21), as cases the engine, CLI and app
tests share: each gives a URL where the fault happens and what the user must be told.

Real where a real server or socket can produce it — a closed port, a listener that never accepts
(a connect timeout), a TLS server with a self-signed certificate — and the named test double
(misbehaving_server.py) for the rest: a proxy's 502, a 403 for a key without the scope, malformed
SSE, a stall mid-answer past the client's read timeout."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from .misbehaving_server import FORBIDDEN, WORDS, MisbehavingServer

CLIENT_TIMEOUT_S = 60  # RemoteEngine's default read timeout (--remote-timeout, a profile's timeout_s change it)
CONNECT_TIMEOUT_S = 10  # engine/remote/faults.py: CONNECT_TIMEOUT_S


def closed_port() -> int:
    """A port that was free a moment ago, nobody listening now: connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def unaccepting_listener() -> Iterator[int]:
    """A real listener whose accept queue is full (listen(0), never accepting): the kernel drops
    the next SYN, so a client's connect waits out its timeout. Yields the port."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        fillers = [socket.socket() for _ in range(4)]
        for f in fillers:
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
        time.sleep(0.2)
        try:
            yield port
        finally:
            for f in fillers:
                f.close()


@contextmanager
def self_signed_double(folder: Path) -> Iterator[MisbehavingServer]:
    """The double behind TLS with a certificate made on the spot: a real TLS server nobody trusts."""
    from .tls import self_signed_server_context

    with MisbehavingServer(tls=self_signed_server_context(folder)) as server:
        yield server


@dataclass(frozen=True)
class Fault:
    id: str
    line: str  # what the user is told, one line; {host} is 127.0.0.1:PORT
    kept: str = ""  # the answer's text that came before the fault (kept, the answer marked "cut")
    at_connect: bool = False  # fails the connection itself (the app's engine load fails with it)
    prefix: bool = False  # `line` is how the line starts (the rest quotes a parser)
    slow: bool = False  # waits out the client's 60 s read timeout

    @property
    def reason(self) -> str:
        return "cut" if self.kept else "error"

    def matches(self, line: str, host: str) -> bool:
        expected = self.line.format(host=host)
        return line.startswith(expected) if self.prefix else line == expected


FAULTS = [
    Fault("closed-port", "cannot reach {host}: connection refused (is the server running?)", at_connect=True),
    Fault(
        "tls-self-signed",
        "TLS failed with {host}: its certificate is not trusted (self-signed certificate)",
        at_connect=True,
    ),
    Fault("connect-timeout", f"cannot reach {{host}}: no connection within {CONNECT_TIMEOUT_S} s", at_connect=True),
    Fault("cut", "{host} closed the connection: ", kept="".join(WORDS[:2]), prefix=True),
    Fault("gateway", "{host} failed: server error 502: 502 Bad Gateway"),
    Fault("forbidden", f"{{host}} said 403 (the API key may not do this): {FORBIDDEN}"),
    Fault("malformed", "{host} sent a malformed event: ", kept=WORDS[0], prefix=True),
    Fault("notachunk", "{host} sent a malformed event: ", prefix=True),
    Fault(
        f"stall-{CLIENT_TIMEOUT_S + 30}",
        f"{{host}} sent nothing for {CLIENT_TIMEOUT_S} s (timeout)",
        kept="".join(WORDS[:2]),
        slow=True,
    ),
]


def cases(skip: tuple[str, ...] = ()) -> list:
    """FAULTS as pytest params (ids; the 60 s one marked slow), less those in `skip`."""
    return [pytest.param(f, id=f.id, marks=[pytest.mark.slow] if f.slow else []) for f in FAULTS if f.id not in skip]


@contextmanager
def fault_url(fault: Fault, double: MisbehavingServer, folder: Path) -> Iterator[tuple[str, str]]:
    """(the server URL where `fault` happens, its host as the line names it)."""
    if fault.id == "closed-port":
        port = closed_port()
        yield f"http://127.0.0.1:{port}", f"127.0.0.1:{port}"
    elif fault.id == "connect-timeout":
        with unaccepting_listener() as port:
            yield f"http://127.0.0.1:{port}", f"127.0.0.1:{port}"
    elif fault.id == "tls-self-signed":
        with self_signed_double(folder) as tls:
            yield tls.url("ok"), f"127.0.0.1:{tls.port}"
    else:
        yield double.url(fault.id), f"127.0.0.1:{double.port}"
