"""The OpenAI-compatible server on the Vulkan backend (lavapipe in CI): the openai client's
streamed and whole chat answers and raw completions are the engine's greedy answer on that device."""

from __future__ import annotations

import json

import openai
import pytest

from phoenix_chat import engine
from phoenix_chat.app.server.config import ServerConfig
from phoenix_chat.app.server.running import start_server
from phoenix_chat.engine.generate import generate
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler
from tests.server.conftest import raw

CHAT = [{"role": "user", "content": "Name a colour."}]
N = 4


@pytest.fixture(scope="module")
def vk_served(vk_device, model_path):
    model = engine.load(model_path, backend="vulkan", context_length=256)
    scheduler = Scheduler(model)
    with start_server(scheduler, ServerConfig(port=0)) as running:
        yield model, running
    scheduler.close()
    model.close()


def test_openai_client_on_vulkan_gets_the_greedy_answer(vk_served):
    model, running = vk_served
    want = generate(model, CHAT, SamplingParams(temperature=0), max_tokens=N)
    client = openai.OpenAI(base_url=running.url + "/v1", api_key="local", max_retries=0, timeout=300)
    mid = running.state.model_id
    whole = client.chat.completions.create(model=mid, messages=CHAT, max_tokens=N, temperature=0)
    assert whole.choices[0].message.content == want and whole.usage.completion_tokens == N
    chunks = list(client.chat.completions.create(model=mid, messages=CHAT, max_tokens=N, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    status, _, body = raw(running, "GET", "/health")
    assert status == 200 and json.loads(body)["backend"] == model.backend.name != "cpu"


def test_openai_completions_on_vulkan_continue_the_raw_prompt(vk_served):
    """/v1/completions (no template): whole and streamed equal the engine's raw greedy continuation."""
    model, running = vk_served
    prompt = "The capital of France is"
    want = generate(model, prompt, SamplingParams(temperature=0), max_tokens=N, raw=True)
    client = openai.OpenAI(base_url=running.url + "/v1", api_key="local", max_retries=0, timeout=300)
    mid = running.state.model_id
    whole = client.completions.create(model=mid, prompt=prompt, max_tokens=N, temperature=0)
    assert want.strip() and whole.choices[0].text == want and whole.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model=mid, prompt=prompt, max_tokens=N, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
