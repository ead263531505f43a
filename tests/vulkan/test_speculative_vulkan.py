"""Speculative decoding on the Vulkan backend: the target scores the draft's proposals in one
multi-token forward and the rejected tail is rolled back in its GPU KV cache (local rings of
window + a prefill chunk) — the output is still the reference greedy continuation."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.sampling import SamplingParams
from engine.speculative import SpeculativeStats, speculative_step

GOLDENS = Path(__file__).resolve().parents[1] / "goldens"


class _Model:  # speculative_step needs only `.backend`
    def __init__(self, backend):
        self.backend = backend


def test_speculative_greedy_on_vulkan_is_the_reference_greedy(vk_device, model_path, draft_path):
    from engine.backends.vulkan.backend import VulkanBackend
    from engine.weights import open_weights
    golden = np.load(GOLDENS / "transformers_270m.npz")
    target = VulkanBackend(open_weights(model_path), 256, device=vk_device, int_dot=False)
    draft = VulkanBackend(open_weights(draft_path), 256, device=vk_device, int_dot=False)
    try:
        stats = SpeculativeStats()
        out = list(speculative_step(_Model(target), _Model(draft), golden["capital_prompt_ids"].tolist(),
                                    SamplingParams(temperature=0), 16, 4, stats))
    finally:
        draft.close()
        target.close()
    assert out == golden["capital_greedy_ids"][:16].tolist()
    assert 0 < stats.accepted < stats.proposed          # kept and rolled-back proposals both happened
