"""The OpenAI-compatible server on the Vulkan backend (lavapipe in CI): the openai client's
streamed and whole chat answers and raw completions are the engine's greedy answer on that device,
and parallel clients on two slots share decode steps and each still get that answer."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

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


PROMPTS = ["The capital of France is", "Water boils at", "My favourite fruit is"]


@pytest.fixture(scope="module")
def vk_served_2_slots(vk_device, model_path):
    model = engine.load(model_path, backend="vulkan", context_length=256, slots=2)
    scheduler = Scheduler(model)
    with start_server(scheduler, ServerConfig(port=0)) as running:
        yield model, scheduler, running
    scheduler.close()
    model.close()


def test_parallel_openai_clients_on_vulkan_share_steps_and_each_get_their_greedy_answer(vk_served_2_slots):
    """3 threaded clients, different prompts, 2 slots: two run batched while the third waits, and
    every answer is the engine's greedy answer to that prompt alone (computed outside the
    scheduler, under exclusive(), before any request ran)."""
    model, scheduler, running = vk_served_2_slots
    assert model.backend.n_slots == 2
    with scheduler.exclusive():
        alone = [generate(model, p, SamplingParams(temperature=0), max_tokens=N + 2, raw=True) for p in PROMPTS]
    assert len(set(alone)) == len(PROMPTS)  # different answers: cross-talk could not hide behind sameness
    assert scheduler.max_batch == 0
    client = openai.OpenAI(base_url=running.url + "/v1", api_key="local", max_retries=0, timeout=300)
    mid = running.state.model_id
    together = threading.Barrier(len(PROMPTS))

    def ask(i: int) -> str:
        together.wait(30)
        body = dict(model=mid, prompt=PROMPTS[i], max_tokens=N + 2, temperature=0)
        if i == 1:  # one of them streamed
            return "".join(c.choices[0].text for c in client.completions.create(**body, stream=True) if c.choices)
        return client.completions.create(**body).choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask, range(len(PROMPTS))))
    assert answers == alone
    assert scheduler.max_batch == 2  # two sequences advanced in one decode step: batching happened
    status, _, body = raw(running, "GET", "/health")
    health = json.loads(body)
    assert status == 200 and health["slots"] == 2 and health["max_batch"] == 2
    assert health["active"] == 0 and health["waiting"] == 0
