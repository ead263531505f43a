"""GPU sampling: greedy is exactly numpy.argmax; seeded top-k/top-p/min-p sampling is
deterministic, matches the CPU sampler's distribution (engine.sampling.candidates, chi-square)
for every top_k (the top-k sampler up to KC, the full one for 0 and above) and never yields
excluded ids; repetition penalty; the step position advances; one recording replays (the arrival
counter is back at 0 after every run)."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.ops_sample import KC, sample, sampler_for, scratch_bytes, topk_shape
from phoenix_chat.engine.sampling import SamplingParams, candidates
from tests.vulkan.ops_helpers import Bufs, run


def _run_sample(
    dev,
    logits,
    *,
    greedy,
    pos=0,
    n_tokens=1,
    n_draws=1,
    advance=True,
    penalty=False,
    tokens=None,
    full=None,
    **step,
):
    """full: None, the sampler the engine picks for these settings (ops_sample.sampler_for)."""
    vocab = logits.size
    if full is None:
        full = not greedy and sampler_for(SamplingParams(temperature=1.0, top_k=step.get("top_k", 0))) == "full"
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
                full=full,
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
    """The CPU sampler's candidates and probabilities for these settings."""
    return candidates(logits, [], SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))


def _chi2_agrees(draws, ids, probs):
    """Draws only from ids, and in proportion to probs (chi-square over bins expecting >= 5)."""
    assert set(draws.tolist()) <= set(ids.tolist()), "an excluded id was sampled"
    n = len(draws)
    counts = np.array([(draws == i).sum() for i in ids])
    expected = probs * n
    big = expected >= 5
    rest_obs, rest_exp = counts[~big].sum(), expected[~big].sum()
    obs = np.append(counts[big], rest_obs) if rest_exp > 0 else counts[big]
    exp = np.append(expected[big], rest_exp) if rest_exp > 0 else expected[big]
    chi2 = float(np.sum((obs - exp) ** 2 / np.maximum(exp, 1e-9)))
    df = max(len(obs) - 1, 1)
    assert chi2 < df + 6 * np.sqrt(2 * df) + 10, (chi2, df)
    return chi2, df


def _peaked_logits(vocab, rng):
    logits = (rng.standard_normal(vocab) * 2 - 5).astype(np.float32)
    hot = rng.choice(vocab, 12, replace=False)
    logits[hot] = np.log(np.array([30, 20, 15, 10, 8, 6, 4, 3, 2, 1, 0.5, 0.25])) + 6
    return logits


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p",
    [
        (1.0, 8, 1.0, 0.0),  # top-k alone
        (0.7, 0, 0.8, 0.0),  # top-p over the whole vocabulary (top_k 0: the full sampler)
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
    _chi2_agrees(draws, *ref_distribution(logits, **params))


@pytest.mark.parametrize("top_k", [0, 1, 40, 64, 65, 1000])
@pytest.mark.parametrize("shape", ["peaked", "flat"])
def test_every_top_k_samples_on_the_gpu_as_the_cpu_sampler(vk_device, top_k, shape):
    """top_k 0 (off), 1, 40, 64 (the top-k sampler's range), 65 and 1000 (the full sampler): the
    draws follow the CPU sampler's distribution; at temperature 0 every one is the argmax.
    "flat": logits of std 1 at temperature 2, so thousands of tokens share the mass (top-p and
    top-k cut deep into a block's list); "peaked": a dozen tokens hold most of it."""
    rng = np.random.default_rng(top_k + 7)
    vocab = 50000
    if shape == "peaked":
        logits = _peaked_logits(vocab, rng)
        params = dict(temperature=0.9, top_k=top_k, top_p=0.95, min_p=0.0)
    else:
        logits = rng.standard_normal(vocab).astype(np.float32)
        params = dict(temperature=2.0, top_k=top_k, top_p=0.9, min_p=0.0)
    n = 4000
    draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=n, seed=99, **params)
    ids, probs = ref_distribution(logits, **params)
    if len(ids) > n // 5:  # too many candidates for per-id bins: compare the distribution over bands of rank
        rank = {int(t): r for r, t in enumerate(ids)}
        assert set(draws.tolist()) <= set(rank), "an excluded id was sampled"
        edges = np.linspace(0, len(ids), 21).astype(int)
        band_p = np.array([probs[a:b].sum() for a, b in zip(edges[:-1], edges[1:])])
        band = np.searchsorted(edges, [rank[int(t)] for t in draws], side="right") - 1
        _chi2_agrees(band, np.arange(20), band_p)
    else:
        _chi2_agrees(draws, ids, probs)
    greedy, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=4, seed=99, **{**params, "temperature": 0.0})
    assert (greedy == int(np.argmax(logits))).all()


def test_full_sampler_min_p_and_the_top_token_always_kept(vk_device):
    """The full sampler's min-p cut and its edge cases: top_p 0 and min_p above 1 keep only the
    top token (as the CPU sampler does)."""
    rng = np.random.default_rng(5)
    logits = _peaked_logits(30000, rng)
    params = dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.05)
    draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=3000, seed=5, **params)
    _chi2_agrees(draws, *ref_distribution(logits, **params))
    for edge in (dict(top_p=0.0), dict(min_p=1.5)):
        p = {**params, **edge}
        draws, _, _ = _run_sample(vk_device, logits, greedy=False, n_draws=50, seed=5, **p)
        assert set(draws.tolist()) == {int(np.argmax(logits))} == set(ref_distribution(logits, **p)[0].tolist())


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
    _chi2_agrees(draws, *ref_distribution(logits, **params))


def _ordered_keys(logits):
    """shaders/sample.comp's ordered_key: float -> uint32 of the same order, NaN -> 0."""
    bits = logits.astype(np.float32).view(np.uint32)
    keys = np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)
    return np.where(np.isnan(logits), np.uint32(0), keys)


def _block_lists(logits, block, kc=KC):
    """Each block's best kc (ordered key, id), by key desc then id asc; past the vocabulary
    (0, 0xFFFFFFFF)."""
    n_blocks = -(-logits.size // block)
    keys = np.zeros(n_blocks * block, np.uint32)
    ids = np.full(n_blocks * block, 0xFFFFFFFF, np.uint32)
    keys[: logits.size] = _ordered_keys(logits)
    ids[: logits.size] = np.arange(logits.size, dtype=np.uint32)
    out = np.zeros((n_blocks, kc, 2), np.uint32)
    for b in range(n_blocks):
        k, i = keys[b * block : (b + 1) * block], ids[b * block : (b + 1) * block]
        order = np.lexsort((i, -k.astype(np.int64)))[:kc]
        out[b, :, 0], out[b, :, 1] = k[order], i[order]
    return out


def _logit_cases():
    rng = np.random.default_rng(21)
    vocab = 262144
    gauss = (rng.standard_normal(vocab) * 3).astype(np.float32)
    peaked = _peaked_logits(vocab, rng)
    tied = rng.integers(0, 40, vocab).astype(np.float32)  # ~26-100 copies of each value a block
    few_values = rng.integers(0, 4, vocab).astype(np.float32)  # hundreds tie at the 64th: the index rounds
    spiky = gauss.copy()
    spiky[rng.choice(vocab, 5000, replace=False)] = np.nan
    spiky[rng.choice(vocab, 5000, replace=False)] = -np.inf
    spiky[rng.choice(vocab, 300, replace=False)] = np.inf
    ascending = np.linspace(-10, 10, vocab, dtype=np.float32)  # each block's best at its end
    # the second half of every 4,096 logits tied at the top: the kept ties are not a block's first
    late_ties = np.where(np.arange(vocab) % 4096 < 2048, rng.uniform(-5, 0, vocab), 5.0).astype(np.float32)
    return {
        "gaussian": gauss,
        "peaked": peaked,
        "tied": tied,
        "few_values": few_values,
        "flat": np.full(vocab, 1.5, np.float32),
        "nan_inf": spiky,
        "ascending": ascending,
        "late_ties": late_ties,
        "ragged_vocab": gauss[: 262208 - 1024 + 37],  # the last block mostly past the vocabulary
    }


@pytest.mark.parametrize("shape", ["device", (256, 1024), (512, 2048)])
@pytest.mark.parametrize("case", list(_logit_cases()))
def test_block_candidates_are_each_blocks_exact_top_kc(vk_device, case, shape):
    """The top-k sampler's first phase: every block's list is exactly its best KC entries in
    (key desc, id asc) order, whichever way the block got there (the radix rounds over the keys,
    over the tied entries' indices where hundreds tie), in the device's block shape
    (ops_sample.topk_shape) and in smaller ones (devices with smaller workgroups)."""
    logits = _logit_cases()[case]
    vocab = logits.size
    wg, block = topk_shape(vk_device) if shape == "device" else shape
    with Bufs(vk_device) as b:
        bl, cand, tok = b.of(logits), b.zeros(scratch_bytes(vocab)), b.zeros(64)
        counter, st = b.zeros(4), b.step(pos=0, n_tokens=1, temperature=1.0, top_k=40, seed=3)
        run(
            vk_device,
            lambda cl: sample(cl, vk_device, st, bl, cand, counter, tok, vocab=vocab, greedy=False, wg=wg, block=block),
        )
        want = _block_lists(logits, block)
        got = b.read(cand, np.uint32)[: want.size].reshape(want.shape)
    bad = np.nonzero(np.any(got != want, axis=(1, 2)))[0]
    assert bad.size == 0, f"{bad.size} blocks differ, first {bad[:5].tolist()}"


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


def test_a_vocabulary_beyond_the_full_sampler_is_refused_with_a_message(vk_device):
    """Nothing falls back silently: a setting the GPU cannot serve (top_k 0 over more than
    FULL_MAX_BLOCKS * BLOCK tokens) is an error that says why, at record time."""
    from phoenix_chat.engine.backends.vulkan.ops_sample import BLOCK, FULL_MAX_BLOCKS

    vocab = FULL_MAX_BLOCKS * BLOCK + 1
    with Bufs(vk_device) as b:
        st, buf = b.step(pos=0, n_tokens=1), b.zeros(16)
        cl = vk_device.commands()
        with pytest.raises(ValueError, match=r"top_k 0 or > 64 serves vocabularies up to 524288 tokens"):
            sample(cl, vk_device, st, buf, buf, buf, buf, vocab=vocab, greedy=False, full=True)
        sample(cl, vk_device, st, buf, buf, buf, buf, vocab=vocab, greedy=False)  # top_k <= 64: served
        cl.end()
        cl.destroy()
