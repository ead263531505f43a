"""The numpy reference forward pass: self-consistency on a tiny model, agreement with references."""

import numpy as np
import pytest

from phoenix_chat.engine.backends.cpu import CpuBackend
from phoenix_chat.engine.weights import open_weights
from tests.tinymodels import tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # window 4 and 7 layers: local layers wrap their ring within a few tokens; layer 5 is global
    return open_weights(tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf"))


def test_prefill_equals_token_by_token_decode(tiny):
    ids = list(np.random.default_rng(1).integers(0, 300, 19))
    full = CpuBackend(tiny, 64).forward(ids, 0, all_logits=True)
    stepper = CpuBackend(tiny, 64)
    steps = np.stack([stepper.forward([t], i) for i, t in enumerate(ids)])
    assert np.max(np.abs(full - steps)) < 1e-4


def test_chunks_longer_than_the_ring(tiny):
    ids = list(np.random.default_rng(2).integers(0, 300, 23))
    whole = CpuBackend(tiny, 64).forward(ids, 0, all_logits=True)
    b = CpuBackend(tiny, 64)
    parts = [
        b.forward(ids[:9], 0, all_logits=True),
        b.forward(ids[9:10], 9, all_logits=True),
        b.forward(ids[10:], 10, all_logits=True),
    ]
    assert np.max(np.abs(whole - np.concatenate(parts))) < 1e-4


def test_rollback_is_moving_the_position(tiny):
    rng = np.random.default_rng(3)
    a, b_ = list(rng.integers(0, 300, 12)), list(rng.integers(0, 300, 6))
    fresh = CpuBackend(tiny, 64).forward(a[:6] + b_, 0, all_logits=True)
    reused = CpuBackend(tiny, 64)
    reused.forward(a, 0)  # 12 tokens, then roll back to 6
    again = reused.forward(b_, 6, all_logits=True)
    assert np.max(np.abs(fresh[6:] - again)) < 1e-4


def test_sliding_window_limits_attention(tmp_path):
    """5 local layers with window 4 see at most 5*3 positions back: token 0 cannot reach position 19.
    Add the global 6th layer and it can."""
    base = list(np.random.default_rng(4).integers(0, 300, 20))
    changed = [(base[0] + 1) % 300] + base[1:]
    for layers, reaches in ((5, False), (6, True)):
        w = open_weights(tiny_gguf(tmp_path / f"t{layers}.gguf", cfg=dict(layers=layers)))
        diff = np.max(np.abs(CpuBackend(w, 64).forward(base, 0) - CpuBackend(w, 64).forward(changed, 0)))
        assert (diff > 1e-5) == reaches, (layers, diff)


def test_top5_logits_match_transformers(cpu_model, llama_reference):
    ids = llama_reference["chat_prompt"]["prompt_ids"]
    logits = cpu_model.backend.forward(ids, 0)
    ref = llama_reference["chat_prompt"]["top5_first_position"]["transformers_f32"]
    top = np.argsort(-logits)[:5]
    assert [cpu_model.tokenizer.decode([int(t)]) for t in top] == [name for name, _ in ref]
    assert np.max(np.abs(logits[top] - np.array([v for _, v in ref]))) < 1e-3


def test_greedy_48_tokens_match_llama_cpp_and_transformers(cpu_model, llama_reference):
    from phoenix_chat.engine.generate import generate_step
    from phoenix_chat.engine.sampling import SamplingParams

    chat = llama_reference["chat_prompt"]
    out = list(generate_step(cpu_model, chat["prompt_ids"], SamplingParams(temperature=0), 48))
    assert out == chat["greedy_48_ids"]
