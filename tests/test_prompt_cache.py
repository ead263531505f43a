"""Prefix reuse (engine/prompt_cache.py) on the real embedded 270M, CPU reference backend.

A chat's next turn prefills only the tokens the KV cache lacks, and what it then generates is
what a full re-prefill generates (greedy), across the 512-token sliding window and after an
edit of an early message; a rollback longer than the rings' slack re-prefills from 0 and says so.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from phoenix_chat.engine.backends.base import PREFILL_CHUNK
from phoenix_chat.engine.generate import prompt_ids_for, stream_generate
from phoenix_chat.engine.prompt_cache import PromptCache, common_prefix
from phoenix_chat.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)
FOX = "The quick brown fox jumps over the lazy dog. "


class ForwardCounter:
    """Counts the positions each `backend.forward` call computes (the real forward runs)."""

    def __init__(self, backend, monkeypatch) -> None:
        self.calls: list[tuple[int, int]] = []  # (start position, tokens)
        real = backend.forward

        def forward(ids, start_pos, **kw):
            self.calls.append((start_pos, len(ids)))
            return real(ids, start_pos, **kw)

        monkeypatch.setattr(backend, "forward", forward)

    def take(self) -> list[tuple[int, int]]:
        calls, self.calls = self.calls, []
        return calls


def answer(model, messages, cache=None, max_tokens=6):
    records = list(stream_generate(model, messages, GREEDY, max_tokens=max_tokens, cache=cache))
    return [r.token for r in records if r.token is not None], records[-1]


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_turns_reuse_the_cache_and_match_full_prefills(cpu_model, monkeypatch):
    """Turn 2 crosses the 512-token window with ~430 tokens reused; regenerate reuses all but the
    last prompt token; an edit of the first message reuses only what precedes the edit. Each
    continuation equals a full prefill's on the same backend (run afterwards, from position 0)."""
    model = cpu_model
    assert model.config.sliding_window == 512
    cache = PromptCache(model.backend)
    counter = ForwardCounter(model.backend, monkeypatch)
    u1 = {"role": "user", "content": FOX * 40 + "How many times did the fox jump?"}
    turn1 = [u1]
    got1, _ = answer(model, turn1, cache)
    assert counter.take()[0] == (0, len(prompt_ids_for(model, turn1)))
    a1 = {"role": "assistant", "content": model.tokenizer.decode(got1)}
    u2 = {"role": "user", "content": "Say it again, slowly: " + FOX * 10}
    turn2 = [u1, a1, u2]
    ids1, ids2 = prompt_ids_for(model, turn1), prompt_ids_for(model, turn2)
    assert len(ids1) < 512 < len(ids2)

    got2, last2 = answer(model, turn2, cache)
    start, computed = counter.take()[0]
    # only the new turn is prefilled: the second prompt minus the first and the fed answer tokens
    assert computed == len(ids2) - len(ids1) - (len(got1) - 1) == last2.prompt_tokens - last2.prompt_reused
    assert start == last2.prompt_reused > 400

    regen, last3 = answer(model, turn2, cache)  # regenerate: the same prompt again
    assert counter.take()[0] == (len(ids2) - 1, 1) and last3.prompt_reused == len(ids2) - 1
    assert regen == got2

    edited = [{"role": "user", "content": "A " + u1["content"]}, a1, u2]
    got4, last4 = answer(model, edited, cache)
    ids4 = prompt_ids_for(model, edited)
    assert last4.prompt_reused == common_prefix(ids2, ids4) and 0 < last4.prompt_reused < 8
    assert counter.take()[0] == (last4.prompt_reused, len(ids4) - last4.prompt_reused)
    assert cache.last is not None and cache.last.note == ""  # the rings (window + PREFILL_CHUNK slots) held it all

    full2, _ = answer(model, turn2)  # references: no cache, prefilled from position 0
    assert counter.take()[0] == (0, len(ids2))
    full4, _ = answer(model, edited)
    print(f"\nturn 2: reused {last2.prompt_reused}/{len(ids2)}; greedy {got2} vs full prefill {full2}")
    assert got2 == full2
    assert got4 == full4


def test_rollback_beyond_the_rings_slack_re_prefills_from_zero_and_says_so(cpu_model, monkeypatch):
    """An edit ~400 tokens back in a ~830-token conversation: the local layers' rings (512 window +
    PREFILL_CHUNK slack) no longer hold the window before the edit, so resuming there would be wrong (shown
    below by doing it); the cache re-prefills from 0, reports it, and matches the full prefill."""
    model = cpu_model
    backend = model.backend
    cache = PromptCache(backend)
    text = FOX * 40 + "Then the dog woke up. " + FOX * 40
    first = [{"role": "user", "content": text}]
    answer(model, first, cache, max_tokens=2)
    ids = prompt_ids_for(model, first)
    assert len(ids) > backend.kv_ring_slots == backend.config.sliding_window + PREFILL_CHUNK
    edited = [{"role": "user", "content": text.replace("the dog woke", "the cat woke")}]
    ids_e = prompt_ids_for(model, edited)
    p = common_prefix(ids, ids_e)
    assert 300 < p < len(ids) - 300

    counter = ForwardCounter(backend, monkeypatch)
    _, last = answer(model, edited, cache, max_tokens=4)
    assert counter.take()[0] == (0, len(ids_e)) and last.prompt_reused == 0
    assert cache.last is not None and "re-prefilled" in cache.last.note and f"resuming at {p}" in cache.last.note

    # what the rule prevents: resuming at p anyway after those ~830 positions gives other logits
    naive = backend.forward(ids_e[p:], p)
    ref = backend.forward(ids_e, 0)
    diff = float(np.abs(naive - ref).max())
    print(f"\nresuming at {p} past the rings' slack: max |logit diff| {diff:.3f} vs a full prefill")
    assert diff > 0.05


@pytest.mark.slow
def test_ten_turn_chat_prefills_only_each_new_turn(cpu_model, monkeypatch):
    """A scripted 10-turn chat: every turn prefills only its new tokens (deterministic), so time to
    first token stays flat while the history grows (timings printed; bound generous: shared CPU)."""
    model = cpu_model
    answer(model, "Warm up.", max_tokens=1)  # turn 1 is timed warm, as turn 10 is
    cache = PromptCache(model.backend)
    counter = ForwardCounter(model.backend, monkeypatch)
    messages: list[dict] = []
    ttft, computed, previous = [], [], 0
    for turn in range(10):
        messages.append({"role": "user", "content": f"Question {turn + 1}: what comes after {turn * 7}?"})
        ids = prompt_ids_for(model, messages)
        got, last = answer(model, messages, cache, max_tokens=8)
        start, n = counter.take()[0]
        ttft.append(last.ttft_s)
        computed.append(n)
        assert start == last.prompt_reused and n == len(ids) - start
        if turn:  # the previous prompt and all but the last answer token came from the cache
            assert start >= previous - 1 and n <= 30
        previous = len(ids) + len(got)
        messages.append({"role": "assistant", "content": model.tokenizer.decode(got)})
    t0 = time.perf_counter()
    answer(model, messages[:-1], max_tokens=1)  # turn 10 without reuse, for comparison
    full = time.perf_counter() - t0
    print(
        f"\nCPU 10-turn chat: prefilled tokens per turn {computed}; ttft turn 1 {ttft[0] * 1e3:.0f} ms, "
        f"turn 10 {ttft[-1] * 1e3:.0f} ms ({ttft[-1] / ttft[0]:.2f}x); turn 10 with a full prefill of "
        f"{len(prompt_ids_for(model, messages[:-1]))} tokens {full * 1e3:.0f} ms"
    )
    assert ttft[-1] <= 2.0 * ttft[0]


class _Model:  # generate_step needs only `.backend`
    def __init__(self, backend) -> None:
        self.backend = backend


def _tiny_backend(kind: str, path, context: int):
    from phoenix_chat.engine.weights import open_weights

    weights = open_weights(path)
    if kind == "cpu":
        from phoenix_chat.engine.backends.cpu import CpuBackend

        return CpuBackend(weights, context)
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.errors import DeviceUnavailableError

    try:
        return VulkanBackend(weights, context, VulkanOptions(allow_software=True))
    except DeviceUnavailableError as exc:
        pytest.skip(f"no Vulkan device ({exc}); CI installs lavapipe")


@pytest.mark.parametrize("kind", ["cpu", pytest.param("vulkan", marks=pytest.mark.vulkan)])
def test_ring_boundary_is_exact_to_the_position(kind, tmp_path):
    """A synthetic Gemma 3 with a 32-token window (random weights: fast) after 800 positions, so
    the local rings (window + one forward's positions) have wrapped: resuming at the first
    position the cache allows gives a full prefill's logits; one position earlier the rings have
    lost a key the window needs (the logits differ), and the cache re-prefills from 0."""
    from tools.make_synthetic_gguf import write

    backend = _tiny_backend(kind, write(tmp_path / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=3), 1024)
    try:
        window, ring = backend.config.sliding_window, backend.kv_ring_slots
        from phoenix_chat.engine.backends.vulkan.plan import PREFILL_CHUNK as VULKAN_CHUNK

        assert window == 32 and ring == 32 + (PREFILL_CHUNK if kind == "cpu" else VULKAN_CHUNK)
        ids = np.random.default_rng(0).integers(3, 4096, 800).tolist()
        cache = PromptCache(backend)
        list(cache.generate(_Model(backend), ids, GREEDY, 1, cache.plan(ids)))
        assert cache.tokens == ids and cache.ring_low == 800 - ring
        first_ok = 800 - ring + window - 1  # the window before it starts at the ring's oldest position

        def resume(p: int):
            edited = ids[:p] + [5, 6, 7, 8]
            return edited, cache.plan(edited)

        edited, plan = resume(first_ok)
        assert plan.reused == first_ok and plan.note == ""
        got = backend.forward(edited[first_ok:], first_ok, all_logits=True)
        want = backend.forward(edited, 0, all_logits=True)[first_ok:]
        exact = float(np.abs(got - want).max())

        backend.forward(ids, 0)  # back to the 800 positions
        edited, plan = resume(first_ok - 1)
        assert plan.reused == 0 and "re-prefilled" in plan.note
        naive = backend.forward(edited[first_ok - 1 :], first_ok - 1, all_logits=True)
        want = backend.forward(edited, 0, all_logits=True)[first_ok - 1 :]
        diff = float(np.abs(naive - want).max())
        print(f"\n{kind}: max |logit diff| vs a full prefill: at {first_ok} {exact:.2e}, one earlier {diff:.2e}")
        assert exact < 1e-3 * np.abs(want).max() and diff > 10 * max(exact, 1e-4)
    finally:
        backend.close()
