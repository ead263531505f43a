"""The servers the load bench compares, each started as the real subprocess a user would run on
127.0.0.1: Phoenix's `phoenix-chat serve`, and llama.cpp's server (llama-cpp-python[server],
tools/llama_cpp_server.py) on the same GGUF. Each yields a `Served`: the OpenAI base URL, the
model id it lists and the pid whose memory the bench reads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 300.0  # loading the model on a busy 2-core box


@dataclass(frozen=True)
class Served:
    name: str  # what the table calls it
    url: str  # the OpenAI base URL (…/v1)
    model: str  # the id /v1/models lists
    pid: int
    settings: str  # how it was started, in a few words


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(
    port: int, backend: str, ctx: int, parallel: int, max_queue: int | None, model: Path | None
) -> list[str]:
    """`phoenix-chat serve` as this interpreter runs it (the checkout on PYTHONPATH is the one served)."""
    cmd = [sys.executable, "-m", "phoenix_chat.app.cli", "serve", "--backend", backend, "--ctx", str(ctx)]
    cmd += ["--port", str(port), "--parallel", str(parallel)]
    if max_queue is not None:
        cmd += ["--max-queue", str(max_queue)]
    if model is not None:
        cmd += ["--model", str(model)]
    return cmd


@contextmanager
def phoenix(
    backend: str = "cpu", ctx: int = 1024, parallel: int = 1, max_queue: int | None = None, model: Path | None = None
) -> Iterator[Served]:
    """`phoenix-chat serve` in a subprocess; stopped with SIGTERM (as a service manager would)."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            serve_command(port, backend, ctx, parallel, max_queue, model), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            health = _wait_health(proc, port, log)
            queue = f", queue {health['max_queue']}"
            yield Served(
                "phoenix-chat serve",
                f"http://127.0.0.1:{port}/v1",
                str(health["model"]),
                proc.pid,
                f"{health['backend']} backend, --parallel {health['slots']}{queue}, context {health['context_length']}",
            )
        finally:
            _stop(proc)


@contextmanager
def llama_cpp(
    model: Path, ctx: int = 1024, threads: int | None = None, chat_format: str | None = "gemma"
) -> Iterator[Served]:
    """llama-cpp-python's OpenAI server on `model`. interrupt_requests is off: left at its default
    (on), each new request cuts the stream under way short, which no client load survives.
    chat_format "gemma" (its own Gemma template): the embedded GGUF carries no chat template, and
    without one llama-cpp-python falls back to Llama 2's `[INST]` format, to which the 270M
    answers nothing ("stop" at once). With "gemma" it sends the same 17 prompt tokens we do."""
    import psutil

    from tools import llama_cpp_server

    threads = threads or os.cpu_count() or 1
    port = free_port()
    alias = "gemma-3-270m-llama.cpp"
    extra = ["--interrupt_requests", "False"]
    if chat_format:
        extra += ["--chat_format", chat_format]
    with llama_cpp_server.running(
        model, n_ctx=ctx, threads=threads, model_alias=alias, port=port, extra_args=extra
    ) as base:
        mine = [
            p for p in psutil.Process().children() if "llama_cpp.server" in p.cmdline() and f"{port}" in p.cmdline()
        ]
        assert len(mine) == 1, f"expected one llama_cpp.server child on port {port}, found {len(mine)}"
        version = _llama_cpp_version()
        yield Served(
            f"llama.cpp server (llama-cpp-python {version})",
            base + "/v1",
            alias,
            mine[0].pid,
            f"CPU, {threads} threads, one request at a time, context {ctx}, interrupt_requests off, "
            f"chat_format {chat_format or 'its default'}",
        )


def _llama_cpp_version() -> str:
    from tools import llama_cpp_server

    exe = llama_cpp_server.python()
    out = subprocess.run(
        [str(exe), "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True, text=True, timeout=60
    )
    return out.stdout.strip() or "?"


def _wait_health(proc: subprocess.Popen, port: int, log) -> dict:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"phoenix-chat serve exited ({proc.returncode}):\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                return dict(json.loads(reply.read()))
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
    raise TimeoutError(f"phoenix-chat serve did not answer within {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(log, n: int = 4000) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-n:]
