"""llama.cpp's OpenAI-compatible server (`llama-cpp-python[server]`) as a real peer for tests and
benches: the remote-engine tests stream from it, the server load bench compares against it.

It lives in a virtual environment of its own (`make peer-server` builds it into
build/llama-cpp-server from the PyPI sdist, compiling llama.cpp for this CPU): its FastAPI and
pydantic pins must not move the product's own dependencies. `PHOENIX_LLAMA_CPP_PYTHON` names
another interpreter that has it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / "build" / "llama-cpp-server"
STAMP = VENV / ".installed"  # the Makefile's PEER_STAMP: touched only once pip has installed the server
START_TIMEOUT_S = 120.0


def python() -> Path | None:
    """The interpreter that has llama_cpp.server, or None when it is not built here. The venv's
    own python exists from `make peer-server`'s first step, long before pip has built and installed
    llama-cpp-python (and stays after a failed build): only the build's stamp says it is done."""
    named = os.environ.get("PHOENIX_LLAMA_CPP_PYTHON")
    if named:
        return Path(named) if Path(named).exists() else None
    candidate = VENV / "bin" / "python"
    return candidate if candidate.exists() and STAMP.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(
    model: Path | str,
    *,
    n_ctx: int = 2048,
    threads: int | None = None,
    api_key: str | None = None,
    model_alias: str | None = None,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    log: Path | None = None,
) -> Iterator[str]:
    """Start `python -m llama_cpp.server` on 127.0.0.1 and yield its base URL (http://127.0.0.1:PORT,
    the OpenAI API under /v1) once /v1/models answers; stop it afterwards. `model_alias` is the
    model id it reports (default: the file's path); `extra_args` go to its command line as they are;
    `log`: a file that gets the server's output as it comes (e.g. its "Disconnected from client"
    line when a stream is closed; default: a temporary file, shown only if it fails to start)."""
    exe = python()
    if exe is None:
        raise FileNotFoundError(f"llama-cpp-python's server is not built: run `make peer-server` (no {STAMP})")
    port = port or free_port()
    cmd = [str(exe), "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--n_ctx", str(n_ctx), "--n_threads", str(threads or os.cpu_count() or 1)]
    if api_key:
        cmd += ["--api_key", api_key]
    if model_alias:
        cmd += ["--model_alias", model_alias]
    cmd += list(extra_args)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its print()s reach the log as they happen
    with open(log, "w+b") if log else tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_ready(proc, port, api_key, out)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(proc: subprocess.Popen, port: int, api_key: str | None, log) -> None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama.cpp's server exited ({proc.returncode}):\n{_tail(log)}")
        try:
            with urllib.request.urlopen(
                urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers=headers), timeout=2
            ) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise TimeoutError(f"llama.cpp's server did not answer within {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")


def _tail(log, n: int = 4000) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-n:]
