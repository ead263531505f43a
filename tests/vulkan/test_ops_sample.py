"""GPU sampling: greedy is exactly numpy.argmax; seeded top-k/top-p/min-p sampling is
deterministic, matches the reference distribution (chi-square) and never yields excluded ids;
repetition penalty; the step position advances; one recording replays (the arrival counter is
back at 0 after every run)."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.ops_sample import KC, sample, scratch_bytes
from tests.vulkan.ops_helpers import Bufs, run


def _run_sample(dev, logits, *, greedy, pos=0, n_tokens=1, n_draws=1, advance=True, penalty=False, tokens=None, **step):
    vocab = logits.size
    tokens = np.zeros(pos + n_tokens + n_draws + 8, np.uint32) if tokens is None else tokens
    with Bufs(dev) as b:
        bl, cand, tok = b.of(logits.astype(np.float32)), b.zeros(scratch_bytes(vocab)), b.of(tokens)
        counter = b.zeros(4)
        st = b.step(pos=pos, n_tokens=n_tokens, **step)
        run(
            dev,
            lambda cl: sample(
                cl,
                dev,
                st,
                bl,
                cand,
                counter,
                tok,
                vocab=vocab,
                greedy=greedy,
                penalty=penalty,
                n_draws=n_draws,
                advance=advance,
            ),
        )
        assert b.read(counter, np.uint32)[0] == 0, "the last block resets the arrival counter"
        out = b.read(tok, np.uint32)
        return out[pos + n_tokens : pos + n_tokens + n_draws], b.read_step(st), b.read(bl, np.float32)


@pytest.mark.parametrize("vocab", [262144, 262208, 1025, 1000, 5])
def test_greedy_is_argmax(vk_device, vocab):
    rng = np.random.default_rng(vocab)
    logits = (rng.standard_normal(vocab) * 5).astype(np.float32)
    if vocab > 100:
        top = logits.max() + 1
        logits[[vocab // 3, vocab - 1, 77]] = top  # ties: the lowest id wins
        logits[[5, vocab // 2]] = np.nan  # NaN never wins
    got, st, _ = _run_sample(vk_device, logits, greedy=True, pos=3, n_tokens=4)
    want = int(np.nanargmax(logits))
    assert got[0] == want
    assert (st["pos"], st["n_tokens"]) == (7, 1), "advance: the next step decodes the sampled token"
    # the sampling path with temperature 0 is greedy too
    got2, _, _ = _run_sample(vk_device, logits, greedy=False, temperature=0.0, top_k=40, seed=5)
    assert got2[0] == want


def ref_distribution(logits, temperature, top_k, top_p, min_p):
    K = KC if top_k == 0 or top_k > KC else top_k
    order = np.lexsort((np.arange(logits.size), -logits.astype(np.float64)))[:K]
    p = np.exp((logits[order].astype(np.float64) - logits[order[0]]) / temperature)
    keep = K
    if top_p < 1:
        keep = int(np.argmax(np.cumsum(p) >= top_p * p.sum())) + 1
    if min_p > 0:
        small = np.nonzero(p[:keep] < min_p * p[0])[0]
        keep = int(small[0]) if small.size else keep
    return order[:keep], p[:keep] / p[:keep].sum()


def _peaked_logits(vocab, rng):
    logits = (rng.standard_normal(vocab) * 2 - 5).astype(np.float32)
    hot = rng.choice(vocab, 12, replace=False)
    logits[hot] = np.log(np.array([30, 20, 15, 10, 8, 6, 4, 3, 2, 1, 0.5, 0.25])) + 6
    return logits


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p",
    [
        (1.0, 8, 1.0, 0.0),  # top-k alone
        (0.7, 0, 0.8, 0.0),  # top-p over the KC best
        (1.3, 10, 0.95, 0.1),  # all three
        (1.0, 64, 1.0, 0.0),  # the full candidate set, blocks contribute many candidates
    ],
)
def test_sampling_distribution(vk_device, temperature, top_k, top_p, min_p):
    rng = np.random.default_rng(11)
    vocab = 20000
    logits = _peaked_logits(vocab, rng)
    n = 4000
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=n, seed=1234, **params)
    ids, probs = ref_distribution(logits, **params)
    assert set(draws.tolist()) <= set(ids.tolist()), "an excluded id was sampled"
    counts = np.array([(draws == i).sum() for i in ids])
    expected = probs * n
    big = expected >= 5  # chi-square over well-populated bins
    rest_obs, rest_exp = counts[~big].sum(), expected[~big].sum()
    obs = np.append(counts[big], rest_obs) if rest_exp > 0 else counts[big]
    exp = np.append(expected[big], rest_exp) if rest_exp > 0 else expected[big]
    chi2 = float(np.sum((obs - exp) ** 2 / np.maximum(exp, 1e-9)))
    df = max(len(obs) - 1, 1)
    assert chi2 < df + 6 * np.sqrt(2 * df) + 10, (chi2, df)


def test_seeded_sampling_is_deterministic(vk_device):
    rng = np.random.default_rng(3)
    logits = _peaked_logits(5000, rng)
    a, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=200, seed=42, temperature=1.0, top_k=20)
    b, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=200, seed=42, temperature=1.0, top_k=20)
    c, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=200, seed=43, temperature=1.0, top_k=20)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # the draw depends on the position of the sampled token (step.pos + n_tokens)
    d, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=200, seed=42, temperature=1.0, top_k=20, pos=1)
    assert not np.array_equal(a, d)


def test_top_k_one_and_tiny_vocab(vk_device):
    logits = np.array([0.5, 3.0, 2.9, -1.0, 3.0], np.float32)
    draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=50, seed=9, temperature=2.0, top_k=1)
    assert np.all(draws == 1)
    draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=300, seed=9, temperature=1.0, top_k=3)
    assert set(draws.tolist()) == {1, 2, 4}


def test_repetition_penalty(vk_device):
    vocab = 3000
    logits = np.zeros(vocab, np.float32)
    logits[[10, 20, 30, 40]] = [5.0, 4.9, -1.0, 4.0]
    tokens = np.zeros(32, np.uint32)
    tokens[:6] = [10, 30, 10, 7, 7, 99]  # window of 4 before q = 6: 10, 7, 7, 99
    got, _, after = _run_sample(
        vk_device, logits, greedy=True, pos=5, n_tokens=1, penalty=True, tokens=tokens, rep_penalty=1.5, rep_window=4
    )
    want = logits.copy()
    want[10] /= 1.5  # once, though it appears twice
    want[7] *= 1.5
    want[99] *= 1.5
    assert np.allclose(after, want)
    assert got[0] == 20
    _, _, same = _run_sample(
        vk_device, logits, greedy=True, pos=5, penalty=True, tokens=tokens, rep_penalty=1.0, rep_window=4
    )
    assert np.array_equal(same, logits)


@pytest.mark.parametrize("vocab,top_k", [(262144, 5), (40000, 64)])
def test_flat_logits_take_the_lowest_ids(vk_device, vocab, top_k):
    """All logits equal: more than CAP candidates tie (the bisection fallback); the top-k are the
    lowest ids, drawn uniformly."""
    logits = np.full(vocab, 1.5, np.float32)
    draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=2000, seed=3, temperature=1.0, top_k=top_k)
    assert set(draws.tolist()) <= set(range(top_k))
    counts = np.bincount(draws, minlength=top_k)
    exp = 2000 / top_k
    chi2 = float(np.sum((counts - exp) ** 2 / exp))
    assert chi2 < top_k - 1 + 6 * np.sqrt(2 * (top_k - 1)) + 10


def test_ties_at_the_threshold_fallback(vk_device):
    """Few distinct values (fast path with ties): exactly the K best by (value, lowest id)."""
    rng = np.random.default_rng(4)
    logits = rng.integers(0, 4, 30000).astype(np.float32)  # ~7500 ids share the top value
    logits[[17, 29000]] = 10.0
    draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=500, seed=8, temperature=100.0, top_k=6)
    want = [17, 29000] + [int(i) for i in np.nonzero(logits == 3.0)[0][:4]]
    assert set(draws.tolist()) <= set(want)
    assert len(set(draws.tolist())) == 6


def test_ties_at_the_threshold_fast_path(vk_device):
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(30000).astype(np.float32)
    logits[[17, 500, 2000, 29000]] = 10.0
    logits[[90, 3, 7]] = 9.0  # K = 5: only id 3 of these
    draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=500, seed=8, temperature=100.0, top_k=5)
    assert set(draws.tolist()) == {17, 500, 2000, 29000, 3}


def test_gaussian_logits_radix_select(vk_device):
    """Gaussian logits over the full vocabulary: thousands of entries lie above the blocks'
    40th keys (the radix-select path); the draws still follow the exact top-40 distribution."""
    rng = np.random.default_rng(12)
    logits = (rng.standard_normal(262144) * 3).astype(np.float32)
    n = 3000
    params = dict(temperature=0.5, top_k=40, top_p=1.0, min_p=0.0)
    draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=n, seed=77, **params)
    ids, probs = ref_distribution(logits, **params)
    assert set(draws.tolist()) <= set(ids.tolist())
    big = probs * n >= 5
    counts = np.array([(draws == i).sum() for i in ids])
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(probs[big] * n, probs[~big].sum() * n)
    chi2 = float(np.sum((obs - exp) ** 2 / np.maximum(exp, 1e-9)))
    df = len(obs) - 1
    assert chi2 < df + 6 * np.sqrt(2 * df) + 10, (chi2, df)


@pytest.mark.parametrize("greedy", [True, False])
def test_one_recording_replays(vk_device, greedy):
    """A decode step's sampler recorded once and submitted again and again: each run draws at
    the next position (advance) and leaves the arrival counter at 0 for the next."""
    dev = vk_device
    vocab, runs = 70000, 5
    rng = np.random.default_rng(21)
    logits = _peaked_logits(vocab, rng)
    logits[[60001, 9]] = logits.max() + 1  # greedy tie: 9 wins
    with Bufs(dev) as b:
        bl, cand, counter = b.of(logits), b.zeros(scratch_bytes(vocab)), b.zeros(4)
        tok = b.of(np.zeros(32, np.uint32))
        st = b.step(pos=2, n_tokens=1, seed=7, temperature=0.8, top_k=30)
        cl = dev.commands()
        sample(cl, dev, st, bl, cand, counter, tok, vocab=vocab, greedy=greedy)
        cl.end()
        for _ in range(runs):
            cl.submit(wait=True)
            assert b.read(counter, np.uint32)[0] == 0
        cl.destroy()
        got = b.read(tok, np.uint32)[3 : 3 + runs]
        assert b.read_step(st)["pos"] == 2 + runs
    if greedy:
        assert got.tolist() == [9] * runs
    else:  # the same draws as separate recordings at those positions
        want = [
            _run_sample(dev, logits, greedy=False, pos=2 + i, seed=7, temperature=0.8, top_k=30)[0][0]
            for i in range(runs)
        ]
        assert got.tolist() == want
