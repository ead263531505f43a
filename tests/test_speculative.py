"""Speculative decoding (engine/speculative.py) on the real 270M: the target's own output, token
for token, whatever the draft proposes; the acceptance rule leaves the target's distribution.

The draft is the real 270M cut to its first 12 of 18 layers (conftest `draft_path`):
same tokenizer, real weights, and it disagrees with the full model often enough that both the
accepted and the rejected paths run. (No smaller Gemma 3 than the 270M exists to draft for it.)
"""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.errors import PhoenixError
from phoenix_chat.engine.generate import generate_step, stream_generate
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.speculative import (
    Distribution,
    SpeculativeStats,
    accept_or_resample,
    check_draft,
    speculative_step,
)

from .tinymodels import tiny_gguf

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="session")
def cpu_draft(draft_path):
    from phoenix_chat import engine

    m = engine.load(draft_path, backend="cpu")
    yield m
    m.close()


@pytest.fixture(scope="session")
def capital_ids(cpu_model):
    return cpu_model.tokenizer.encode("The capital of France is", add_bos=True)


def test_speculative_greedy_is_the_targets_greedy_token_for_token(cpu_model, cpu_draft, capital_ids):
    plain = list(generate_step(cpu_model, capital_ids, GREEDY, 24))
    for k in (1, 4):
        stats = SpeculativeStats()
        assert list(speculative_step(cpu_model, cpu_draft, capital_ids, GREEDY, 24, k, stats)) == plain
        assert 0 < stats.accepted < stats.proposed  # both paths ran
        assert stats.rounds + stats.accepted >= 23  # each pass: its accepted proposals + one of its own


def test_a_draft_that_is_the_target_is_always_accepted(cpu_model, capital_ids):
    plain = list(generate_step(cpu_model, capital_ids, GREEDY, 16))
    stats = SpeculativeStats()
    assert list(speculative_step(cpu_model, cpu_model, capital_ids, GREEDY, 16, 4, stats)) == plain
    assert stats.acceptance == 1.0 and stats.tokens_per_round == 5.0
    sampled = SpeculativeStats()  # p == q up to batch-shape rounding: min(1, p/q) ~ 1
    list(speculative_step(cpu_model, cpu_model, capital_ids, SamplingParams(temperature=0.8, seed=3), 16, 4, sampled))
    assert sampled.acceptance >= 0.9


def test_seeded_speculative_sampling_is_reproducible(cpu_model, cpu_draft, capital_ids):
    params = SamplingParams(temperature=0.8, seed=11)
    first = list(speculative_step(cpu_model, cpu_draft, capital_ids, params, 12, 4))
    assert first == list(speculative_step(cpu_model, cpu_draft, capital_ids, params, 12, 4))
    assert len(first) == 12 and all(0 <= t < cpu_model.config.vocab_size for t in first)


def test_acceptance_rule_leaves_the_targets_distribution():
    """Draw a proposal from q, keep it or resample: the token's frequency must follow p (40 000
    trials, 6 tokens, p and q far apart; a rule that kept every proposal would follow q)."""
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    p = Distribution(np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05, 1e-9], np.float32)), [], params)
    q = Distribution(np.log(np.array([0.05, 0.1, 0.1, 0.25, 0.3, 0.2], np.float32)), [], params)
    rng = np.random.default_rng(0)
    n = 40_000
    counts = np.zeros(6)
    for _ in range(n):
        counts[accept_or_resample(p, q, q.draw(rng), rng)[1]] += 1
    np.testing.assert_allclose(counts / n, p.dense(), atol=0.01)
    assert abs(counts[4] / n - 0.3) > 0.2  # and not q's


def test_greedy_rule_keeps_only_the_targets_argmax():
    rng = np.random.default_rng(0)
    p = Distribution(np.array([0.0, 3.0, 1.0], np.float32), [], GREEDY)
    assert accept_or_resample(p, Distribution(np.array([0.0, 3.0, 0.0], np.float32), [], GREEDY), 1, rng) == (True, 1)
    assert accept_or_resample(p, Distribution(np.array([5.0, 3.0, 0.0], np.float32), [], GREEDY), 0, rng) == (False, 1)


def test_stream_generate_with_a_draft_gives_the_same_answer(cpu_model, cpu_draft, llama_reference):
    chat = llama_reference["chat_prompt"]["messages"]
    plain = "".join(r.text for r in stream_generate(cpu_model, chat, GREEDY, 12))
    stats = SpeculativeStats()
    records = list(stream_generate(cpu_model, chat, GREEDY, 12, draft=cpu_draft, draft_tokens=4, spec_stats=stats))
    assert "".join(r.text for r in records) == plain
    assert records[-1].generation_tokens == 12 and records[-1].finish_reason == "length" and stats.rounds > 0


def test_a_draft_with_another_vocabulary_is_refused(cpu_model, tmp_path):
    from phoenix_chat import engine

    tiny = engine.load(tiny_gguf(tmp_path / "tiny.gguf"), backend="cpu")
    with pytest.raises(PhoenixError, match="does not share the tokenizer"):
        check_draft(cpu_model, tiny)
    with pytest.raises(PhoenixError, match="draft tokens must be"):
        next(speculative_step(cpu_model, cpu_model, [2, 100], GREEDY, 4, draft_tokens=64))
