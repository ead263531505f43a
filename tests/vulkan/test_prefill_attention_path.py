"""The prefill attention path a device gets is reported in stats(), and the matrix-core kernel
(attention_prefill_coopmat.comp: f16 Q and P) gives the model output of the scalar f32 kernel
and the CPU reference: the tiny model (head_dim 64, window 32) over a 600-token prompt, two chunks
(512 + 88): the second one's local layers read their ring (32 + 512 slots) wrapped, and blocks of
32 tokens x 2 heads are cut by the window and the chunk's end.

On lavapipe (no VK_KHR_cooperative_matrix) the comparison skips."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan import ops_attention

CONTEXT = 640


@pytest.fixture(scope="module")
def tiny_weights(open_tiny):
    return open_tiny("q8_0", seed=5)


def _logits(weights, dev, ids):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    be = VulkanBackend(weights, CONTEXT, device=dev)
    try:
        return be.forward(ids, 0, all_logits=True), be.stats()["prefill_attention"]
    finally:
        be.close()


def test_attention_path_is_reported(tiny_weights, vk_device, monkeypatch):
    ids = np.random.default_rng(1).integers(3, 4096, 8).tolist()
    _, path = _logits(tiny_weights, vk_device, ids)
    cfg = tiny_weights.config
    splits = ops_attention.prefill_splits(512, cfg.num_heads, cfg.num_kv_heads, 64)
    assert path == ops_attention.prefill_path(vk_device, 64, splits)
    assert ("split" in path) == (ops_attention.prefill_refusal(vk_device, 64) is None and splits > 1)
    monkeypatch.setenv("PHOENIX_VULKAN_ATTN_COOPMAT", "0")
    _, path = _logits(tiny_weights, vk_device, ids)
    assert path.startswith("scalar f32 (")


@pytest.mark.parametrize("splits", ["1", None])
def test_coopmat_attention_matches_scalar_and_cpu(tiny_weights, vk_device, monkeypatch, splits):
    why = ops_attention.prefill_refusal(vk_device, 64)
    if why is not None:
        pytest.skip(f"no coopmat prefill attention: {why}")
    from phoenix_chat.engine.backends.cpu import CpuBackend

    ids = np.random.default_rng(2).integers(3, 4096, 600).tolist()
    if splits is not None:  # one workgroup per query block; None: the engine's key split
        monkeypatch.setenv("PHOENIX_VULKAN_ATTN_SPLITS", splits)
    cm, path = _logits(tiny_weights, vk_device, ids)
    assert path.startswith("coopmat")
    assert ("split" in path) == (splits is None)
    monkeypatch.delenv("PHOENIX_VULKAN_ATTN_SPLITS", raising=False)
    monkeypatch.setenv("PHOENIX_VULKAN_ATTN_COOPMAT", "0")
    sc, _ = _logits(tiny_weights, vk_device, ids)
    cpu = CpuBackend(tiny_weights, CONTEXT).forward(ids, 0, all_logits=True)
    scale = np.abs(cpu).max()
    print(f"\ncoopmat vs scalar attention: max |diff| {np.abs(cm - sc).max():.5f} (logit scale {scale:.2f})")
    assert np.mean(cm.argmax(-1) == sc.argmax(-1)) >= 0.98
    assert np.mean(cm.argmax(-1) == cpu.argmax(-1)) >= 0.98
    np.testing.assert_allclose(cm, sc, atol=2e-2 * scale)
