"""The remote engine against Phoenix Chat's own server (`serve`, in-process on the embedded 270M):
answers stream and match what the engine gives locally for the same request (greedy, and
sampled with seed/top_k/min_p/repetition_penalty — so those fields arrive and act); Stop
closes the stream and the server's request ends; the same request twice gives the same text;
an unknown model; the CLI's `run --remote` and `chat --remote`, Ctrl+C and /retry included."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import urllib.request

import openai
import pytest

from phoenix_chat.app.terminal_chat import remote_terminal_chat
from phoenix_chat.engine.generate import prompt_ids_for
from phoenix_chat.engine.remote.engine import RemoteEngine, RemoteError, RemoteTarget
from phoenix_chat.engine.remote.faults import describe
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams

from .conftest import GREEDY, cli, cli_env, sigint_as_in_a_terminal, wait_idle
from .recording import retry_chat

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Write one sentence about the ocean."}]  # the 270M echoes it: text
SAMPLED = SamplingParams(temperature=0.9, top_k=20, min_p=0.05, repetition_penalty=1.3, seed=11)
HOT = SamplingParams(temperature=1.5)  # no seed: each answer a fresh draw


@pytest.fixture(scope="module")
def engine(phoenix_server):
    e = RemoteEngine(RemoteTarget(phoenix_server.url), timeout_s=120)
    yield e
    e.close()


def local(scheduler, prompt, params, max_tokens, raw) -> str:
    """The same request through the server's own scheduler, no HTTP."""
    stream = scheduler.submit(Request(prompt, params, max_tokens, raw=raw))
    return "".join(d.text for d in stream)


def remote(stream) -> tuple[str, object]:
    deltas = list(stream)
    return "".join(d.text for d in deltas), deltas[-1]


def health(server) -> dict:
    with urllib.request.urlopen(server.url + "/health", timeout=30) as r:
        return json.loads(r.read())


def test_check_names_the_server_and_its_model(engine, phoenix_server):
    model_id = health(phoenix_server)["model"]
    assert engine.models() == [model_id]
    assert engine.check() == f"OK: 127.0.0.1:{phoenix_server.port} serves {model_id} (1 model)"


def test_completion_streams_what_the_engine_gives_locally(engine, scheduler):
    text, final = remote(engine.stream_completion(PROMPT, GREEDY, 8))
    assert text and text == local(scheduler, PROMPT, GREEDY, 8, raw=True)
    assert final.finish_reason == "length" and final.error is None
    u = final.usage
    assert u.counted_by_server and u.completion_tokens == 8 and u.prompt_tokens == 6  # <bos> + 5
    assert u.ttft_s > 0 and u.generation_tps > 0


def test_chat_streams_what_the_engine_gives_locally(engine, scheduler):
    text, final = remote(engine.stream_chat(CHAT, GREEDY, 8))
    assert text.startswith("Write one sentence") and text == local(scheduler, CHAT, GREEDY, 8, raw=False)
    assert final.finish_reason in ("stop", "length") and final.usage.counted_by_server


def test_sampling_fields_arrive_and_act(engine, scheduler):
    """seed, top_k, min_p, repetition_penalty (extra fields) reach the sampler: the server's
    sampled answer is the one the engine samples locally with the same SamplingParams."""
    text, final = remote(engine.stream_completion(PROMPT, SAMPLED, 10))
    assert final.finish_reason == "length" and not engine.unsupported_fields
    assert text == local(scheduler, PROMPT, SAMPLED, 10, raw=True)


def test_regenerate_gives_the_same_text(engine):
    """Regenerate: the same request twice, greedy and seeded, gives the same answer."""
    for params in (GREEDY, SAMPLED):
        first, _ = remote(engine.stream_completion("Once upon a time", params, 8))
        second, _ = remote(engine.stream_completion("Once upon a time", params, 8))
        assert first and first == second


def test_stop_mid_answer_closes_the_stream_and_the_server_stops(engine, scheduler, phoenix_server):
    before = health(phoenix_server).get("cancelled_on_disconnect", 0)
    seen = []
    stream = engine.stream_completion("Once upon a time", GREEDY, 120, cancel=lambda: len(seen) >= 2)
    for d in stream:
        seen.append(d)
    final = seen[-1]
    assert final.finish_reason == "cancelled" and final.usage.completion_tokens == 2
    assert [bool(d.text) for d in seen] == [True, True, False]
    wait_idle(scheduler)  # the server saw the connection close and cancelled the request
    assert health(phoenix_server)["active"] == 0
    assert health(phoenix_server).get("cancelled_on_disconnect", 0) == before + 1


def test_an_unknown_model(phoenix_server, engine):
    named = RemoteEngine(RemoteTarget(phoenix_server.url, model="gpt-9"), timeout_s=60)
    with pytest.raises(RemoteError) as err:
        named.check()
    model_id = engine.resolved_model()
    assert err.value.kind == "model"
    assert str(err.value) == f"127.0.0.1:{phoenix_server.port} has no model 'gpt-9' (it serves: {model_id})"
    # the server's own refusal (a model that went away after the check) reads the same way
    client = openai.OpenAI(base_url=phoenix_server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as raw:
        client.completions.create(model="gpt-9", prompt="Hi", max_tokens=1)
    mapped = describe(raw.value, named.target, "gpt-9")
    assert mapped.kind == "model"
    assert str(mapped).startswith(f"127.0.0.1:{phoenix_server.port} has no model 'gpt-9' (404): the model 'gpt-9'")


def test_cli_run_remote_streams_the_answer(engine, scheduler, phoenix_server):
    proc = cli("run", "--remote", phoenix_server.url, "--raw", PROMPT, "--max-tokens", "8", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == local(scheduler, PROMPT, GREEDY, 8, raw=True) + "\n"
    figures = f"[remote 127.0.0.1:{phoenix_server.port} {engine.resolved_model()}: prompt 6 tok, generated 8 tok at "
    assert figures in proc.stderr and "ttft " in proc.stderr and "finish: length]" in proc.stderr
    assert "warning" not in proc.stderr  # loopback: no plain-http warning


def test_cli_run_remote_chat_mode_uses_the_chat_endpoint(scheduler, phoenix_server):
    proc = cli(
        "run", "--remote", phoenix_server.url + "/v1/", CHAT[0]["content"], "--max-tokens", "8", "--temperature", "0"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == local(scheduler, CHAT, GREEDY, 8, raw=False) + "\n"


def test_cli_remote_model_and_sampling_flags_reach_the_server(engine, scheduler, phoenix_server):
    """--remote-model names the model asked for (the server's own id is accepted and reported),
    and the sampling flags travel: a hot draw cut to its top token (--top-k 1) is the greedy one."""
    model = engine.resolved_model()
    flags = ("--raw", PROMPT, "--max-tokens", "8", "--temperature", "1.5", "--seed", "3")
    hot = cli("run", "--remote", phoenix_server.url, *flags)
    cut = cli("run", "--remote", phoenix_server.url, "--remote-model", model, *flags, "--top-k", "1")
    assert hot.returncode == 0 and cut.returncode == 0, hot.stderr + cut.stderr
    greedy = local(scheduler, PROMPT, GREEDY, 8, raw=True) + "\n"
    assert hot.stdout != greedy and cut.stdout == greedy
    assert f"[remote 127.0.0.1:{phoenix_server.port} {model}: " in cut.stderr


def test_cli_refuses_local_flags_and_an_unknown_model(phoenix_server):
    proc = cli("run", "--remote", phoenix_server.url, "hi", "--backend", "cpu", "--model", "x.gguf")
    assert proc.returncode == 2
    assert proc.stderr == "phoenix-chat: error: --model, --backend: for this computer's engine, not with --remote\n"
    proc = cli("run", "--remote", phoenix_server.url, "--remote-model", "gpt-9", "hi")
    assert proc.returncode == 2 and proc.stdout == "\n"
    assert proc.stderr.startswith("phoenix-chat: error: 127.0.0.1:") and "has no model 'gpt-9'" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_cli_ctrl_c_closes_the_stream(scheduler, phoenix_server):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "phoenix_chat.app.cli",
            "run",
            "--remote",
            phoenix_server.url,
            "--raw",
            "Once upon a time",
        ]
        + ["--max-tokens", "150", "--temperature", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        first = os.read(proc.stdout.fileno(), 64)  # blocks until the answer's first text arrives
        assert first and scheduler.active == 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        proc.kill()
        proc.communicate()
    wait_idle(scheduler)  # the server's request ended with the closed stream, not after 150 tokens


def test_cli_chat_remote(engine, scheduler, phoenix_server):
    """`chat --remote` in process (stdin scripted): the banner names the server and model, the
    answer is the server's, the second turn sends the whole history."""
    out = io.StringIO()
    turns = io.StringIO(CHAT[0]["content"] + "\n/quit\n")
    assert remote_terminal_chat(engine, GREEDY, 8, stdin=turns, stdout=out) == 0
    banner = out.getvalue().splitlines()[0]
    assert banner.startswith(f"Phoenix Chat — remote: 127.0.0.1:{phoenix_server.port}, {engine.resolved_model()}.")
    assert local(scheduler, CHAT, GREEDY, 8, raw=False) in out.getvalue()
    proc = cli("chat", "--remote", phoenix_server.url, "--max-tokens", "4", "--temperature", "0", timeout=300)
    assert proc.returncode == 0, proc.stderr  # stdin empty: the chat ends at once, cleanly
    assert proc.stdout.startswith(f"Phoenix Chat — remote: 127.0.0.1:{phoenix_server.port}")


def record_prompts(scheduler, monkeypatch) -> list[list[int]]:
    """The prompt ids of every request the server hands its scheduler (the engine's own view)."""
    ids: list[list[int]] = []
    real = scheduler.submit

    def submit(request, loop=None):
        ids.append(prompt_ids_for(scheduler.model, request.prompt, request.raw))
        return real(request, loop)

    monkeypatch.setattr(scheduler, "submit", submit)
    return ids


def test_cli_chat_remote_retry_asks_the_same_history_again(engine, scheduler, monkeypatch):
    """/retry in `chat --remote`: the server's engine gets the first answer's prompt again, token
    for token; the fresh answer (sampled, no seed) replaces the first in the next turn's history."""
    at_engine = record_prompts(scheduler, monkeypatch)
    sent, _ = retry_chat(engine, HOT, 12, monkeypatch, "Name a colour.", "Another one.")
    first, retried, third = sent
    assert first["text"] != retried["text"]  # a fresh draw: the first is gone from the history below
    assert first["text"] not in [m["content"] for m in third["messages"]]
    assert len(at_engine) == 3 and at_engine[0] == at_engine[1]
    assert at_engine[2] == prompt_ids_for(scheduler.model, third["messages"], False)


def test_cli_chat_remote_retry_in_the_cli(scheduler, phoenix_server, monkeypatch):
    """The real `phoenix-chat chat --remote` process: /retry answers again (greedy: the same text,
    the model's answer to the question) from the same prompt ids at the server's engine."""
    expected = local(scheduler, CHAT, GREEDY, 8, raw=False)
    at_engine = record_prompts(scheduler, monkeypatch)
    proc = cli(
        "chat", "--remote", phoenix_server.url, "--max-tokens", "8", "--temperature", "0",
        input_text=CHAT[0]["content"] + "\n/retry\n", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(f"> {expected}\n") == 2 and "/retry (a new answer" in proc.stdout
    assert len(at_engine) == 2 and at_engine[0] == at_engine[1]
    assert at_engine[0] == prompt_ids_for(scheduler.model, CHAT, False)
