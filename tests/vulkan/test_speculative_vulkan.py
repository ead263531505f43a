"""Speculative decoding on the Vulkan backend: the target scores the draft's proposals in one
multi-token forward and the rejected tail is rolled back in its GPU KV cache (local rings of
window + a prefill chunk): the output is still the reference greedy continuation. And the
few-token forward GPUs use for those passes (`few_token_matvec`: matvecs taking several vectors
per pass over the weights; lavapipe runs its GEMM unless asked) against the CPU reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.speculative import SpeculativeStats, speculative_step

GOLDENS = Path(__file__).resolve().parents[1] / "goldens"


class _Model:  # speculative_step needs only `.backend`
    def __init__(self, backend):
        self.backend = backend


def test_speculative_greedy_on_vulkan_is_the_reference_greedy(vk_device, model_path, draft_path):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.weights import open_weights

    golden = np.load(GOLDENS / "transformers_270m.npz")
    target = VulkanBackend(open_weights(model_path), 256, VulkanOptions(int_dot=False), device=vk_device)
    draft = VulkanBackend(open_weights(draft_path), 256, VulkanOptions(int_dot=False), device=vk_device)
    try:
        stats = SpeculativeStats()
        out = list(
            speculative_step(
                _Model(target),
                _Model(draft),
                golden["capital_prompt_ids"].tolist(),
                SamplingParams(temperature=0),
                16,
                4,
                stats,
            )
        )
    finally:
        draft.close()
        target.close()
    assert out == golden["capital_greedy_ids"][:16].tolist()
    assert 0 < stats.accepted < stats.proposed  # kept and rolled-back proposals both happened


def test_few_token_forward_through_matvecs_matches_the_cpu_reference(vk_device, model_path, cpu_model):
    """Forwards of 2..8 tokens through the multi-column matvecs: every position's logits as the
    CPU reference's (top-1 identical, small differences), after a longer prefill."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.weights import open_weights

    golden = np.load(GOLDENS / "transformers_270m.npz")
    ids = golden["ppl_ids"][:40].tolist()
    vk = VulkanBackend(
        open_weights(model_path), 256, VulkanOptions(int_dot=False, few_token_matvec=True), device=vk_device
    )
    try:
        vk.forward(ids[:32], 0)
        got = vk.forward(ids[32:37], 32, all_logits=True)
    finally:
        vk.close()
    cpu_model.backend.forward(ids[:32], 0)
    want = cpu_model.backend.forward(ids[32:37], 32, all_logits=True)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert np.abs(got - want).max() < 0.05


def test_load_time_choice_of_the_few_token_path(vk_device, tiny_path):
    """GPUs time forwards of the counts of TIMED_COUNTS (and the ends) through the GEMMs, the
    f32 multi-column matvecs (up to MAX_COLUMNS tokens) and, with int8 activations, the int8
    ones at load, and keep the fastest per count (a count between timed ones takes the next timed
    count's winner); CPU devices skip it and keep their GEMM. The choice and the times are in
    stats(), and forwards still compute after the trial recordings are dropped."""
    from phoenix_chat.engine.backends.vulkan.autotune import (
        FEW_TOKENS,
        TIMED_COUNTS,
        choose_few_token_path,
        few_token_winner,
    )
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.backends.vulkan.matvec import MAX_COLUMNS
    from phoenix_chat.engine.weights import open_weights

    # int8 activations wherever the instruction exists (lavapipe too), so the int8 path is timed
    vk = VulkanBackend(open_weights(tiny_path), 64, VulkanOptions(int_dot=vk_device.caps.int_dot), device=vk_device)
    try:
        assert vk.int_dot == vk_device.caps.int_dot
        counts = list(range(2, FEW_TOKENS + 1))
        if vk_device.caps.is_software:
            assert vk.stats()["few_token_matvec"] == [] and "few_token_timing" not in vk.stats()
            assert vk.stats()["few_token_int8"] == []
            counts = [2, 3]  # each count is a set of pipelines llvmpipe compiles slowly
            choose_few_token_path(vk, counts, repeats=1)
        timing = vk.stats()["few_token_timing"]
        assert sorted(timing) == [T for T in counts if T in TIMED_COUNTS or T in (counts[0], counts[-1])]
        paths = {"gemm", "matvec"} | ({"int8"} if vk.int_dot else set())
        for T, t in timing.items():
            assert set(t) == {p + "_ms" for p in paths if p != "matvec" or T <= MAX_COLUMNS}, (T, t)
        winner = {T: few_token_winner(t) for T, t in timing.items()}
        for T in counts:
            w = winner[min(t for t in timing if t >= T)]
            assert (T in vk.stats()["few_token_matvec"]) == (w == "matvec"), T
            assert (T in vk.stats()["few_token_int8"]) == (w == "int8"), T
        assert np.isfinite(vk.forward([2, 5, 9], 0, all_logits=True)).all()
    finally:
        vk.close()
    # a context shorter than the counts: only the forwards it holds are timed (a 19-token
    # context once stopped a load on an H100 here, its 32-token forward refused)
    short = VulkanBackend(open_weights(tiny_path), 3, device=vk_device)
    try:
        choose_few_token_path(short, [2, 3, 8], repeats=1)
        assert sorted(short.stats()["few_token_timing"]) == [2, 3]
    finally:
        short.close()
    # near a tie the matvec path keeps the count (the GEMM must win by autotune.GEMM_MARGIN)
    assert few_token_winner({"gemm_ms": 17.2, "int8_ms": 17.25}) == "int8"
    assert few_token_winner({"gemm_ms": 33.0, "int8_ms": 40.0, "matvec_ms": 50.0}) == "gemm"
    assert few_token_winner({"gemm_ms": 9.0, "matvec_ms": 8.0, "int8_ms": 8.5}) == "matvec"
