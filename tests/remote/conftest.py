"""Real servers for the remote engine: Phoenix Chat's own (`serve`'s start_server beside a
Scheduler on the embedded 270M, CPU) and llama.cpp's (tests/conftest.py: llama_cpp_server);
the `phoenix-chat` CLI in a subprocess; waiting for a server to go idle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from phoenix_chat.app.server.config import ServerConfig
from phoenix_chat.app.server.running import start_server
from phoenix_chat.engine.loader import load
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0)
CONTEXT = 256
KEY = "sk-phoenix-remote-test-5f3a9c1e7b"  # distinctive: any leak of it is found by a plain search


@pytest.fixture(scope="package")  # freed when the package's tests end (the suite's memory)
def remote_model(model_path):
    m = load(model_path, backend="cpu", context_length=CONTEXT)
    yield m
    m.close()


@pytest.fixture(scope="module")
def scheduler(remote_model):
    s = Scheduler(remote_model)
    yield s
    s.close()


@pytest.fixture(scope="module")
def phoenix_server(scheduler):
    """Our `serve` on loopback, no key."""
    with start_server(scheduler, ServerConfig(port=0)) as running:
        yield running


@pytest.fixture(scope="module")
def keyed_phoenix_server(scheduler):
    """Our `serve --api-key KEY`."""
    with start_server(scheduler, ServerConfig(port=0, api_key=KEY)) as running:
        yield running


def wait_idle(scheduler: Scheduler, seconds: float = 60.0) -> None:
    start = time.monotonic()
    while scheduler.active or scheduler.waiting:
        assert time.monotonic() - start < seconds, f"still busy: {scheduler.active} active, {scheduler.waiting} waiting"
        time.sleep(0.05)


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, input_text: str | None = None
) -> subprocess.CompletedProcess:
    """`phoenix-chat ARGS` in a subprocess (this checkout's code: PYTHONPATH is inherited)."""
    return subprocess.run(
        [sys.executable, "-m", "phoenix_chat.app.cli", *args],
        stdin=subprocess.DEVNULL if input_text is None else None,
        input=input_text,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env),
    )


def sigint_as_in_a_terminal() -> None:
    """Popen's preexec_fn for a CLI that a test interrupts: SIGINT at its default, as a shell
    starts a command. A process started with SIGINT ignored (pytest run as a background job, whose
    shell ignores it, or after a test that ignored it) would pass that on, and Python installs no
    KeyboardInterrupt handler for an ignored SIGINT: the CLI would run to its end and exit 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test's environment without a key of the user's, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "PHOENIX_CHAT_API_KEY"}
    return {**env, **(extra or {})}
