"""The CPU reference against Hugging Face transformers (f32) and llama.cpp on the embedded model.

Goldens come from tools/make_goldens.py (transformers 5.23 / llama-cpp-python 0.3.36); nothing
here is typed by hand.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from phoenix_chat.engine.generate import generate_step
from phoenix_chat.engine.sampling import SamplingParams

GOLDENS = Path(__file__).parent / "goldens"
PROMPTS = ("chat", "capital", "code", "long")
TAIL = 48  # positions of the long prompt whose logits are checked (all beyond the 512-token window)


@pytest.fixture(scope="module")
def golden():
    meta = json.loads((GOLDENS / "transformers_270m.json").read_text())
    return meta, np.load(GOLDENS / "transformers_270m.npz")


@pytest.fixture(scope="module")
def prompt_logits(cpu_model, golden):
    """All-position logits of every prompt (only the tail of the long one: 863 x 262k floats is 0.9 GB)."""
    _, npz = golden
    out = {}
    for name in PROMPTS:
        ids = npz[f"{name}_prompt_ids"].tolist()
        start = max(0, len(ids) - TAIL) if name == "long" else 0
        if start:
            cpu_model.backend.forward(ids[:start], 0)
        out[name] = (start, cpu_model.backend.forward(ids[start:], start, all_logits=True))
    return out


@pytest.mark.parametrize("name", PROMPTS)
def test_last_logits_match_transformers(prompt_logits, golden, name):
    _, npz = golden
    _, logits = prompt_logits[name]
    diff = np.abs(logits[-1] - npz[f"{name}_last_logits"])
    assert diff.max() < 1e-3, f"{name}: max abs diff {diff.max():.2e}"


@pytest.mark.parametrize("name", PROMPTS)
def test_top32_logits_at_every_position_match_transformers(prompt_logits, golden, name):
    _, npz = golden
    start, logits = prompt_logits[name]
    ids, ref = npz[f"{name}_top32_ids"][start:], npz[f"{name}_top32_logits"][start:]
    ours = np.take_along_axis(logits, ids, axis=1)
    assert np.abs(ours - ref).max() < 1e-3
    assert (logits.argmax(-1) == ids[:, 0]).all()


@pytest.mark.parametrize("name", PROMPTS)
def test_greedy_40_tokens_identical_to_transformers(cpu_model, golden, name):
    meta, npz = golden
    ids = npz[f"{name}_prompt_ids"].tolist()
    ours = list(generate_step(cpu_model, ids, SamplingParams(temperature=0), 40))
    assert ours == npz[f"{name}_greedy_ids"].tolist()
    if meta["prompts"][name]["llama_cpp"]["agrees_with_transformers"]:
        assert ours == meta["prompts"][name]["llama_cpp"]["greedy_40_ids"]


def test_hidden_states_layer_by_layer(cpu_model, golden):
    """Where a mismatch starts, if there is one: the residual stream after every block."""
    from phoenix_chat.engine.models.gemma3 import Segment, rms_norm

    _, npz = golden
    ref = npz["capital_hidden_states"]
    m = cpu_model.backend.model
    ids = npz["capital_prompt_ids"]
    x = m.embed[ids] * m.embed_scale
    assert np.abs(x - ref[0]).max() < 1e-4
    positions = np.arange(len(ids))
    for layer in range(m.config.num_layers):
        x = m._block(layer, x, [Segment(m.cache, positions, 0)])
        scale = np.abs(ref[layer + 1]).max()
        assert np.abs(x - ref[layer + 1]).max() < 1e-5 * scale + 1e-4, f"block {layer}"
    assert np.abs(rms_norm(x, m.w["norm"], m.config.rms_norm_eps) - ref[19]).max() < 1e-4


def test_perplexity_matches_transformers(cpu_model, golden):
    from phoenix_chat.engine.perplexity import perplexity

    meta, npz = golden
    ref = meta["perplexity"]
    text = (GOLDENS / "ppl_text.txt").read_text()
    assert cpu_model.tokenizer.encode(text, add_bos=True, parse_special=False) == npz["ppl_ids"].tolist()
    result = perplexity(cpu_model, text, ref["n_ctx"])
    assert result["scored_tokens"] == ref["transformers_f32"]["n_scored"]
    assert result["ppl"] == pytest.approx(ref["transformers_f32"]["ppl"], rel=1e-4)
    # llama.cpp quantizes activations to 8 bits on the CPU: close, not equal
    assert result["ppl"] == pytest.approx(ref["llama_cpp_cpu"]["ppl"], rel=0.02)
