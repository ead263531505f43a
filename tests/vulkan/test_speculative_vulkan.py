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
    """GPUs time forwards of 2 and 8 tokens (and, where those disagree, every count between)
    through the multi-column matvecs and through the GEMMs at load and keep the faster per
    count (CPU devices skip it and keep their GEMM); the choice and the times are in stats(),
    and forwards still compute after the trial recordings are dropped."""
    from phoenix_chat.engine.backends.vulkan.autotune import choose_few_token_path
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.matvec import MAX_COLUMNS
    from phoenix_chat.engine.weights import open_weights

    vk = VulkanBackend(open_weights(tiny_path), 64, device=vk_device)
    try:
        counts = list(range(2, MAX_COLUMNS + 1))
        if vk_device.caps.is_software:
            assert vk.stats()["few_token_matvec"] == [] and "few_token_timing" not in vk.stats()
            counts = [2, 3]  # each count is a set of pipelines llvmpipe compiles slowly
            vk.tuning.few_token_matvec = choose_few_token_path(vk, counts, repeats=1)
        timing = vk.stats()["few_token_timing"]
        wins = {T: t["matvec_ms"] < t["gemm_ms"] for T, t in timing.items()}
        assert counts[0] in timing and counts[-1] in timing
        if sorted(timing) == counts:  # every count timed (always so for [2, 3])
            assert vk.stats()["few_token_matvec"] == [T for T in counts if wins[T]]
        else:  # the ends agreed and decided for all
            assert len(set(wins.values())) == 1
            assert vk.stats()["few_token_matvec"] == (counts if wins[counts[0]] else [])
        assert np.isfinite(vk.forward([2, 5, 9], 0, all_logits=True)).all()
    finally:
        vk.close()
