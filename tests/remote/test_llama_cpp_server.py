"""The remote engine against llama.cpp's own OpenAI-compatible server (llama-cpp-python[server],
the same embedded GGUF, CPU): a real third-party server. Greedy text equals our engine's for
the same prompt (only because the engine sends repeat_penalty 1.0: llama.cpp's default 1.1
changes the 5th token); Stop; the same request twice; the chat endpoint; `run --remote`; a model
name llama.cpp would silently answer with its own model is refused at connect."""

from __future__ import annotations

import time

import pytest

from phoenix_chat.engine.generate import stream_generate
from phoenix_chat.engine.remote.engine import RemoteEngine, RemoteError, RemoteTarget
from phoenix_chat.engine.sampling import SamplingParams
from tests.conftest import LLAMA_CPP_MODEL_ID

from .conftest import GREEDY, cli

PROMPT = "The capital of France is"
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


def test_the_chat_endpoint(engine):
    """The chat path end to end (template applied by llama.cpp). This base model, through
    llama-cpp-python's rendering (a second <bos>), ends its turn at once: an empty, whole answer."""
    text, final = answer(engine.stream_chat([{"role": "user", "content": "Hello"}], GREEDY, 8))
    assert final.finish_reason == "stop" and final.error is None and text == ""


def test_stop_mid_answer(engine):
    seen = []
    for d in engine.stream_completion("Once upon a time", GREEDY, 200, cancel=lambda: len(seen) >= 2):
        seen.append(d)
    assert seen[-1].finish_reason == "cancelled" and seen[-1].usage.completion_tokens == 2
    assert [bool(d.text) for d in seen] == [True, True, False]
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
