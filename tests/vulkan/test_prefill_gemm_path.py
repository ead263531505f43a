"""The prefill GEMM path a device gets is reported, and the matrix-core kernel (f16 operands)
gives the same model output as the f32 tiled kernel and the CPU reference.

On lavapipe (no VK_KHR_cooperative_matrix) the comparison skips; it runs on GPUs that have it
(checked on an NVIDIA H100, docs/PERFORMANCE.md)."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan import ops_gemm


@pytest.fixture(scope="module")
def tiny_weights(open_tiny):
    return open_tiny("q4_0", seed=3)


def _logits(weights, dev, ids):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    be = VulkanBackend(weights, 64, device=dev)
    try:
        return be.forward(ids, 0, all_logits=True), be.forward(ids, 0), be.stats()["prefill_gemm"]
    finally:
        be.close()


def test_path_is_reported(tiny_weights, vk_device, monkeypatch):
    ids = np.random.default_rng(1).integers(3, 4096, 8).tolist()
    _, _, path = _logits(tiny_weights, vk_device, ids)
    assert path == ops_gemm.path(vk_device)
    monkeypatch.setenv("PHOENIX_VULKAN_COOPMAT", "0")
    f32 = "register-tiled f32 (CPU device)" if vk_device.caps.is_software else "tiled f32"
    assert _logits(tiny_weights, vk_device, ids)[2] == f32


def test_coopmat_prefill_matches_f32_and_cpu(tiny_weights, vk_device, monkeypatch):
    if not ops_gemm.coopmat_ok(vk_device):
        pytest.skip(f"{vk_device.name} has no VK_KHR_cooperative_matrix f16 16x16x16")
    from phoenix_chat.engine.backends.cpu import CpuBackend

    ids = np.random.default_rng(2).integers(3, 4096, 60).tolist()
    cm_all, cm_last, _ = _logits(tiny_weights, vk_device, ids)
    monkeypatch.setenv("PHOENIX_VULKAN_COOPMAT", "0")
    f32_all, f32_last, _ = _logits(tiny_weights, vk_device, ids)
    cpu = CpuBackend(tiny_weights, 64).forward(ids, 0, all_logits=True)
    scale = np.abs(cpu).max()
    print(f"\ncoopmat vs f32: max |diff| {np.abs(cm_all - f32_all).max():.5f} (logit scale {scale:.2f})")
    assert np.mean(cm_all.argmax(-1) == f32_all.argmax(-1)) >= 0.98
    assert np.mean(cm_all.argmax(-1) == cpu.argmax(-1)) >= 0.98
    np.testing.assert_allclose(cm_all, f32_all, atol=2e-2 * scale)
    np.testing.assert_allclose(cm_last, f32_last, atol=2e-2 * scale)
