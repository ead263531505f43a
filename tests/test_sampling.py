import numpy as np
import pytest

from phoenix_chat.engine.sampling import Sampler, SamplingParams, apply_repetition_penalty, filter_candidates


def _logits(seed=0, n=1000):
    return np.random.default_rng(seed).normal(0, 3, n).astype(np.float32)


def test_greedy_is_argmax():
    logits = _logits()
    assert Sampler(SamplingParams(temperature=0))(logits) == int(np.argmax(logits))


def test_same_seed_same_tokens_different_seed_differs():
    logits = _logits()

    def sampler(seed):
        return Sampler(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, seed=seed))

    def draw(seed):
        return [sampler(seed)(logits)]

    def seq(seed):
        s = sampler(seed)
        return [s(logits) for _ in range(50)]

    assert seq(7) == seq(7)
    assert seq(7) != seq(8)
    assert draw(3) == draw(3)


def test_top_k_keeps_only_k_best():
    logits = _logits()
    ids, probs = filter_candidates(logits, SamplingParams(top_k=5, top_p=1.0))
    assert set(ids) == set(np.argsort(-logits)[:5])
    assert probs.sum() == pytest.approx(1.0)
    sampler = Sampler(SamplingParams(top_k=5, top_p=1.0, seed=1))
    assert {sampler(logits) for _ in range(200)} <= set(ids)


def test_top_p_smallest_prefix_reaching_mass():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    ids, _ = filter_candidates(logits, SamplingParams(top_k=0, top_p=0.8))
    assert list(ids) == [0, 1]
    ids, _ = filter_candidates(logits, SamplingParams(top_k=0, top_p=0.81))
    assert list(ids) == [0, 1, 2]


def test_min_p_drops_unlikely_tokens():
    logits = np.log(np.array([0.6, 0.3, 0.07, 0.03], np.float32))
    ids, _ = filter_candidates(logits, SamplingParams(top_k=0, top_p=1.0, min_p=0.1))
    assert list(ids) == [0, 1, 2]


def test_temperature_sharpens_distribution():
    logits = np.log(np.array([0.6, 0.4], np.float32))
    _, cold = filter_candidates(logits, SamplingParams(temperature=0.5, top_k=0, top_p=1.0))
    _, hot = filter_candidates(logits, SamplingParams(temperature=2.0, top_k=0, top_p=1.0))
    assert cold[0] > 0.6 > hot[0] > 0.5


def test_sampling_frequencies_follow_probabilities():
    logits = np.log(np.array([0.5, 0.25, 0.25], np.float32))
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=123))
    counts = np.bincount([sampler(logits) for _ in range(4000)], minlength=3) / 4000
    assert np.allclose(counts, [0.5, 0.25, 0.25], atol=0.03)


def test_repetition_penalty_divides_positive_multiplies_negative():
    logits = np.array([2.0, -2.0, 1.0], np.float32)
    out = apply_repetition_penalty(logits, [0, 1, 1], 2.0)
    assert list(out) == [1.0, -4.0, 1.0]
    assert Sampler(SamplingParams(temperature=0, repetition_penalty=3.0))(np.array([3.0, 2.0], np.float32), [0]) == 1
