"""`phoenix-chat serve` in a subprocess, each flag checked for its effect on the running server:
--model (the id it lists), --backend and --ctx (what /health reports, and a prompt past the
context refused), --host/--port (where it listens; a non-loopback address or 0.0.0.0 with
--api-key), --api-key (required), --cors-origin, --allow-host, --parallel, --max-queue,
--backend vulkan --device --quant (the device and the weight types the engine reports), -v (the
access log, which never shows a key); an unsafe bind refused before the model loads; SIGTERM
stops it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import openai
import pytest

from phoenix_chat.app.cli import build_parser
from phoenix_chat.app.server.config import DEFAULT_PORT

from .conftest import KEY

WELL_KNOWN_PORTS = {1234, 1337, 4891, 11434, 8080, 8000, 30000}
WRONG_KEY = "wrong-key-5f3a9c1e"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(*args: str, verbose: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "phoenix_chat.app.cli", *(["-v"] if verbose else []), "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


def _wait_listening(proc: subprocess.Popen, port: int, seconds: float = 120, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("serve did not start listening")


def _get(
    port: int,
    path: str,
    headers: dict[str, str] | None = None,
    method: str = "GET",
    body: dict | None = None,
    host: str = "127.0.0.1",
):
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.putrequest(method, path, skip_host=bool(headers and "Host" in headers))
    data = json.dumps(body).encode() if body is not None else None
    for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
        conn.putheader(k, v)
    if data is not None:
        conn.putheader("Content-Length", str(len(data)))
    conn.endheaders(data)
    r = conn.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    conn.close()
    return out


def test_default_port_is_none_a_well_known_local_server_uses():
    args = build_parser().parse_args(["serve"])
    assert args.port == DEFAULT_PORT and DEFAULT_PORT not in WELL_KNOWN_PORTS
    assert args.host == "127.0.0.1" and args.api_key is None


def test_every_flag_takes_effect_on_the_running_server(tmp_path, model_path):
    named = tmp_path / "my-gemma.gguf"
    named.symlink_to(model_path)
    port = _free_port()
    origin = "http://localhost:5173"
    proc = _serve(
        "--model", str(named), "--backend", "cpu", "--ctx", "64", "--host", "127.0.0.1", "--port", str(port),
        "--api-key", KEY, "--cors-origin", origin, "--allow-host", "phoenix.lan", "--parallel", "1",
        "--max-queue", "5", verbose=True,
    )  # fmt: skip
    try:
        _wait_listening(proc, port)  # --port
        auth = {"Authorization": f"Bearer {KEY}"}
        status, _, body = _get(port, "/health")
        health = json.loads(body)
        assert health["backend"] == "cpu" and health["context_length"] == 64 and health["slots"] == 1
        assert health["max_queue"] == 5  # --max-queue
        assert _get(port, "/v1/models")[0] == 401  # --api-key
        assert _get(port, "/v1/models", {"Authorization": f"Bearer {WRONG_KEY}"})[0] == 401
        status, _, body = _get(port, "/v1/models", auth)
        assert status == 200 and json.loads(body)["data"][0]["id"] == "my-gemma"  # --model
        over = {"model": "my-gemma", "prompt": "word " * 80, "max_tokens": 1}
        status, _, body = _get(port, "/v1/completions", auth, "POST", over)  # --ctx
        assert status == 400 and json.loads(body)["error"]["code"] == "context_length_exceeded"
        ok = {"model": "my-gemma", "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        status, _, body = _get(port, "/v1/completions", auth, "POST", ok)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 1
        assert _get(port, "/v1/models", {**auth, "Host": f"phoenix.lan:{port}"})[0] == 200  # --allow-host
        assert _get(port, "/v1/models", {**auth, "Host": f"other.lan:{port}"})[0] == 403
        status, headers, _ = _get(port, "/v1/models", {**auth, "Origin": origin})  # --cors-origin
        assert status == 200 and headers["access-control-allow-origin"] == origin
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "server stopped" in err
        assert f"127.0.0.1:{port}/v1" in err  # the URL is shown
        logged = out + err
        assert '"GET /v1/models HTTP/1.1" 401' in logged  # -v: the access log is on (stdout) …
        assert KEY not in logged and WRONG_KEY not in logged  # … and shows neither the key nor a wrong one
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_non_loopback_host_without_a_key_exits_2_before_loading():
    started = time.monotonic()
    proc = _serve("--host", "0.0.0.0", "--port", str(_free_port()))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "set an API key" in err and "Traceback" not in err
    assert time.monotonic() - started < 30


def test_a_negative_max_queue_exits_2_before_loading():
    proc = _serve("--model", "/nonexistent/model.gguf", "--port", str(_free_port()), "--max-queue", "-1")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--max-queue must be 0 or more" in err and "Traceback" not in err


def test_a_port_in_use_exits_2_with_the_reason_before_loading():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        # a model path that does not exist: had it loaded first, that would be the error
        proc = _serve("--model", "/nonexistent/model.gguf", "--port", str(busy.getsockname()[1]))
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "cannot listen on 127.0.0.1" in err and "Traceback" not in err


def test_parallel_sets_the_engines_slots():
    port = _free_port()
    proc = _serve("--backend", "cpu", "--ctx", "64", "--port", str(port), "--parallel", "3")
    try:
        _wait_listening(proc, port)
        assert json.loads(_get(port, "/health")[2])["slots"] == 3
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _non_loopback_address() -> str | None:
    """This machine's IPv4 address on its default route (a UDP connect sends nothing), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # TEST-NET-3: only the route is looked up
        except OSError:
            return None
        addr = str(s.getsockname()[0])
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


@pytest.mark.parametrize("bind", ["address", "0.0.0.0"])
def test_a_non_loopback_host_with_a_key_serves_only_keyed_requests(bind):
    """--host off loopback starts when --api-key is given, and then every API request needs the
    key (401 without it or with a wrong one, 200 with it), reached at the machine's own
    non-loopback address; /health stays open. Bound to that address alone, loopback is not served."""
    addr = _non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address on a default route")
    host = addr if bind == "address" else bind
    port = _free_port()
    proc = _serve("--backend", "cpu", "--ctx", "64", "--host", host, "--port", str(port), "--api-key", KEY)
    try:
        _wait_listening(proc, port, host=addr)
        assert _get(port, "/health", host=addr)[0] == 200
        assert _get(port, "/v1/models", host=addr)[0] == 401
        assert _get(port, "/v1/models", {"Authorization": f"Bearer {WRONG_KEY}"}, host=addr)[0] == 401
        ask = {"model": "unused", "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        assert _get(port, "/v1/completions", {}, "POST", ask, host=addr)[0] == 401
        url = f"http://{addr}:{port}/v1"
        keyed = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=60)
        mid = keyed.models.list().data[0].id  # 200 with the key
        r = keyed.completions.create(model=mid, prompt="Hello", max_tokens=1, temperature=0)
        assert r.usage is not None and r.usage.completion_tokens == 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key=WRONG_KEY, max_retries=0, timeout=60).models.list()
        if bind == "address":  # that address only: nothing listens on loopback
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        else:  # every interface, loopback included, the key still required
            assert _get(port, "/v1/models")[0] == 401
            assert _get(port, "/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    shown = addr if bind == "address" else "127.0.0.1"  # a wildcard bind shows the loopback URL
    assert f"http://{shown}:{port}/v1" in err and KEY not in err


def test_vulkan_backend_device_and_quant_are_what_the_engine_reports(gguf):
    """--backend vulkan --device 0 --quant q4_0: /health names Vulkan device 0 (lavapipe in CI)
    and the engine's matrices are Q4_0 as loaded (the file's are Q5_0/Q4_K/Q6_K/Q8_0), and the
    server answers on it."""
    from phoenix_chat.engine.backends.vulkan.device import list_devices
    from phoenix_chat.engine.errors import DeviceUnavailableError

    try:
        device0 = list_devices()[0].name
    except DeviceUnavailableError as exc:
        pytest.skip(f"no Vulkan loader/device ({exc}); CI installs lavapipe (mesa-vulkan-drivers)")
    assert set(gguf.tensor_types()) - {"F32", "Q4_0"}  # the file's own types differ: --quant's effect shows
    port = _free_port()
    proc = _serve("--backend", "vulkan", "--device", "0", "--quant", "q4_0", "--ctx", "64", "--port", str(port))
    try:
        _wait_listening(proc, port, seconds=300)
        health = json.loads(_get(port, "/health")[2])
        assert health["backend"] == "vulkan" and health["device"] == device0
        assert health["quant"] == "q4_0"
        matrices = sum(n for t, n in gguf.tensor_types().items() if t != "F32")
        types = health["weight_types"]
        # every matrix but the embedding table re-quantized on the device; the table becomes the
        # quant's embedding type, Q8_0 where the embedding shader lacks it (vulkan/plan.py)
        assert types["Q4_0"] >= matrices - 1
        assert sum(n for t, n in types.items() if t not in ("F32", "Q4_0")) == matrices - types["Q4_0"] <= 1
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="local", max_retries=0, timeout=300)
        r = client.completions.create(model=health["model"], prompt="Hello", max_tokens=1, temperature=0)
        assert r.usage is not None and r.usage.completion_tokens == 1
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "(vulkan, context 64)" in err
