"""The remote engine against llama.cpp's own OpenAI-compatible server (llama-cpp-python[server],
the same embedded GGUF, CPU): a real third-party server. Greedy text equals our engine's for
the same prompt (only because the engine sends repeat_penalty 1.0: llama.cpp's default 1.1
changes the 5th token); Stop (the server's log shows it saw the stream close); the same request
twice; the chat endpoint (greedy text equal to ours too); `run --remote`, Ctrl+C, and `chat
--remote`'s /retry; a model name llama.cpp would silently answer with its own model is refused at
connect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from phoenix_chat.engine.generate import stream_generate
from phoenix_chat.engine.remote.engine import RemoteEngine, RemoteError, RemoteTarget
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams
from tests.conftest import LLAMA_CPP_MODEL_ID, llama_cpp_disconnects

from .conftest import GREEDY, cli, cli_env, sigint_as_in_a_terminal
from .recording import retry_chat

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Write one sentence about the ocean."}]  # the 270M answers with text
SAMPLED = SamplingParams(temperature=0.9, top_k=20, min_p=0.05, repetition_penalty=1.3, seed=11)


@pytest.fixture(scope="module")
def engine(llama_cpp_server):
    e = RemoteEngine(RemoteTarget(llama_cpp_server), timeout_s=120)
    yield e
    e.close()


def ours(model, prompt: str, params: SamplingParams, n: int) -> str:
    return "".join(r.text for r in stream_generate(model, prompt, params, n, raw=True))


def answer(stream) -> tuple[str, object]:
    deltas = list(stream)
    assert all(d.finish_reason is None for d in deltas[:-1]) and not [d.notice for d in deltas if d.notice]
    return "".join(d.text for d in deltas), deltas[-1]


def test_check(engine, llama_cpp_server):
    port = llama_cpp_server.rsplit(":", 1)[1]
    assert engine.check() == f"OK: 127.0.0.1:{port} serves {LLAMA_CPP_MODEL_ID} (1 model)"


def test_greedy_completion_equals_our_engines(engine, remote_model):
    text, final = answer(engine.stream_completion(PROMPT, GREEDY, 8))
    assert text == ours(remote_model, PROMPT, GREEDY, 8) and text.strip()
    assert final.finish_reason == "length" and final.error is None
    u = final.usage  # llama.cpp sends no usage in a stream: counted here, one token a chunk
    assert u.completion_tokens == 8 and not u.counted_by_server and u.ttft_s > 0 and u.generation_tps > 0


def test_a_stop_string(engine, remote_model):
    text, final = answer(engine.stream_completion(PROMPT, GREEDY, 16, stop=["."]))
    assert final.finish_reason == "stop" and "." not in text
    assert ours(remote_model, PROMPT, GREEDY, 16).startswith(text + ".")


def test_regenerate_gives_the_same_text(engine):
    """The same request again (greedy, and seeded) gives the same answer. llama-cpp-python's
    logits depend a little on what its KV cache held before (after another prompt, a near-tie
    in this one flips), so the pair compared follows one identical request."""
    for params in (GREEDY, SAMPLED):
        answer(engine.stream_completion("Once upon a time", params, 8))
        first, _ = answer(engine.stream_completion("Once upon a time", params, 8))
        second, _ = answer(engine.stream_completion("Once upon a time", params, 8))
        assert first and first == second


def test_the_chat_endpoint_equals_our_engines(engine, scheduler):
    """The chat path end to end: llama.cpp applies Gemma's template (the fixture's `--chat_format
    gemma`) and its greedy answer is the one our engine gives through its own template."""
    text, final = answer(engine.stream_chat(CHAT, GREEDY, 8))
    ours_chat = "".join(d.text for d in scheduler.submit(Request(CHAT, GREEDY, 8, raw=False)))
    assert text.strip() and text == ours_chat
    assert final.finish_reason in ("stop", "length") and final.error is None


def wait_disconnects(log, count: int, seconds: float = 60.0) -> None:
    """Until llama.cpp's server has logged `count` closed streams (it notices at its next token)."""
    deadline = time.monotonic() + seconds
    while llama_cpp_disconnects(log) < count:
        assert time.monotonic() < deadline, f"llama.cpp's server never saw the stream close:\n{log.read_text()[-2000:]}"
        time.sleep(0.1)


def test_stop_mid_answer(engine, llama_cpp_log):
    before = llama_cpp_disconnects(llama_cpp_log)
    seen = []
    for d in engine.stream_completion("Once upon a time", GREEDY, 200, cancel=lambda: len(seen) >= 2):
        seen.append(d)
    assert seen[-1].finish_reason == "cancelled" and seen[-1].usage.completion_tokens == 2
    assert [bool(d.text) for d in seen] == [True, True, False]
    wait_disconnects(llama_cpp_log, before + 1)  # the server saw the close and stopped generating
    start = time.monotonic()  # the server is free again: the next answer comes
    text, final = answer(engine.stream_completion(PROMPT, GREEDY, 2))
    assert final.finish_reason == "length" and text and time.monotonic() - start < 60


def test_a_model_llama_cpp_does_not_have(llama_cpp_server):
    e = RemoteEngine(RemoteTarget(llama_cpp_server, model="gpt-9"), timeout_s=60)
    with pytest.raises(RemoteError) as err:
        e.check()
    assert err.value.kind == "model" and f"has no model 'gpt-9' (it serves: {LLAMA_CPP_MODEL_ID})" in str(err.value)


def test_cli_run_remote(llama_cpp_server, remote_model):
    proc = cli("run", "--remote", llama_cpp_server, "--raw", PROMPT, "--max-tokens", "8", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ours(remote_model, PROMPT, GREEDY, 8) + "\n"
    port = llama_cpp_server.rsplit(":", 1)[1]
    assert f"[remote 127.0.0.1:{port} {LLAMA_CPP_MODEL_ID}: prompt 0 tok, generated 8 tok at " in proc.stderr


def test_cli_ctrl_c_closes_the_stream(llama_cpp_server, llama_cpp_log, engine):
    """Ctrl+C in `run --remote`: exit 130, and llama.cpp's server sees the stream close (its log
    says so) and is free for the next answer at once — not after the 1500 tokens asked for."""
    before = llama_cpp_disconnects(llama_cpp_log)
    command = [sys.executable, "-m", "phoenix_chat.app.cli", "run", "--remote", llama_cpp_server, "--raw"]
    command += ["Once upon a time", "--max-tokens", "1500", "--temperature", "0"]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), preexec_fn=sigint_as_in_a_terminal
    )
    try:
        first = os.read(proc.stdout.fileno(), 64)  # blocks until the answer's first text arrives
        assert first
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        proc.kill()
        proc.communicate()
    wait_disconnects(llama_cpp_log, before + 1)
    text, final = answer(engine.stream_completion(PROMPT, GREEDY, 2))  # the server's lock is free again
    assert final.finish_reason == "length" and text


def test_cli_chat_remote_retry(engine, monkeypatch):
    """/retry in `chat --remote` (in process, scripted stdin): the same messages go to llama.cpp's
    server again, and the next turn's history holds the retried answer in place of the first."""
    retry_chat(engine, GREEDY, 8, monkeypatch, CHAT[0]["content"], "And one about the sky.")


def test_cli_chat_remote_retry_in_the_cli(llama_cpp_server):
    proc = cli(
        "chat", "--remote", llama_cpp_server, "--max-tokens", "8", "--temperature", "0",
        input_text=CHAT[0]["content"] + "\n/retry\n", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    banner, answers = proc.stdout.split("\n", 1)
    assert "/retry (a new answer" in banner and LLAMA_CPP_MODEL_ID in banner
    first, retried, end = answers.split("> ")[1:]  # each answer follows the prompt it answers
    assert first.strip() and retried.strip() and end == "\n"
