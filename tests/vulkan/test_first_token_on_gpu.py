"""The first token on the GPU, and GPU sampling for every setting (the real 270M on lavapipe).

generate_step on the Vulkan backend never samples on the CPU: the prefill's last chunk ends in
the decode step's sampler (`VulkanBackend.generate_tokens`), with the Philox counter at the drawn
token's position, so prefill + decode draw exactly what "prefill, the sampler kernel on its
logits, then decode_tokens" draws; top_k 0 (off) and > 64 run on the GPU's full sampler.
"""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine import generate as generate_module
from phoenix_chat.engine.backends.vulkan.ops_sample import sampler_for
from phoenix_chat.engine.generate import generate_step
from phoenix_chat.engine.sampling import SamplingParams
from tests.vulkan.test_ops_sample import _run_sample

TEXT = "The quick brown fox jumps over the lazy dog. Paris is the capital of"
SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "top_k 40": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=11),
    "top_k 0": SamplingParams(temperature=1.0, top_k=0, top_p=0.9, seed=12),
    "top_k 1": SamplingParams(temperature=1.0, top_k=1, seed=13),
    "top_k 64": SamplingParams(temperature=1.1, top_k=64, top_p=1.0, seed=14),
    "top_k 65": SamplingParams(temperature=1.1, top_k=65, top_p=1.0, min_p=0.02, seed=15),
    "top_k 1000 + penalty": SamplingParams(temperature=1.3, top_k=1000, top_p=0.98, repetition_penalty=1.3, seed=16),
}


class _Model:  # generate_step needs only `.backend`
    def __init__(self, backend) -> None:
        self.backend = backend


@pytest.fixture(scope="module")
def vk(vk_device):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    backend = VulkanBackend(open_weights(embedded_model_path()), 96, device=vk_device)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def prompt(vk):
    return vk.weights_source.tokenizer().encode(TEXT)[:12]


@pytest.fixture
def no_cpu_sampler(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the CPU sampler ran on the Vulkan backend")

    monkeypatch.setattr(generate_module, "Sampler", refuse)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_token_is_drawn_on_the_gpu(vk, prompt, no_cpu_sampler, name):
    """The CPU sampler refuses to run; the tokens come from the sampler the setting needs (the
    backend counts its draws), the first one included."""
    params = SETTINGS[name]
    kind = sampler_for(params)
    before = dict(vk.stats()["gpu_sampled"])
    got = list(generate_step(_Model(vk), prompt, params, 5))
    after = vk.stats()["gpu_sampled"]
    assert len(got) == 5 and all(0 <= t < vk.config.vocab_size for t in got)
    assert after[kind] - before[kind] == 5 and sum(after.values()) - sum(before.values()) == 5
    assert kind == {"greedy": "argmax", "top_k 40": "topk", "top_k 1": "topk", "top_k 64": "topk"}.get(name, "full")


@pytest.mark.parametrize("name", ["greedy", "top_k 40", "top_k 0", "top_k 1000 + penalty"])
def test_the_first_token_continues_the_decode_rng_stream(vk, prompt, no_cpu_sampler, name):
    """Prefill ending in the sampler == prefill to logits, the sampler kernel over those logits at
    the same position and seed (tokens[n] of a buffer holding the prompt), then decode_tokens: the
    same ids, so the first token sits on the decode steps' Philox stream."""
    params = SETTINGS[name]
    got = list(generate_step(_Model(vk), prompt, params, 4))
    logits = vk.forward(prompt, 0)
    tokens = np.zeros(len(prompt) + 8, np.uint32)
    tokens[: len(prompt)] = prompt
    first, _, _ = _run_sample(
        vk.dev,
        logits,
        greedy=params.greedy,
        pos=0,
        n_tokens=len(prompt),
        tokens=tokens,
        penalty=params.repetition_penalty != 1.0,
        seed=params.seed or 0,
        top_k=params.top_k,
        temperature=params.temperature,
        top_p=params.top_p,
        min_p=params.min_p,
        rep_penalty=params.repetition_penalty,
        rep_window=params.repetition_window,
    )
    want = [int(first[0])] + list(vk.decode_tokens(int(first[0]), len(prompt), params, 3))
    print(f"\n{name}: {got}")
    assert got == want
    if params.greedy:  # and greedy is the logits' argmax
        assert got[0] == int(np.argmax(logits))


def test_same_seed_same_tokens_other_seed_other_tokens(vk, prompt, no_cpu_sampler):
    params = SETTINGS["top_k 0"]
    a = list(generate_step(_Model(vk), prompt, params, 5))
    b = list(generate_step(_Model(vk), prompt, params, 5))
    c = list(generate_step(_Model(vk), prompt, SamplingParams(**{**params.__dict__, "seed": 99}), 5))
    assert a == b and a != c
