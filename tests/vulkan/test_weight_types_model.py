"""A whole model of the low-bit types (tests/test_weight_types.py's mixes: Q2_K, Q3_K, Q4_1,
Q5_1, IQ4_NL, IQ4_XS matrices and embeddings) on Vulkan against the CPU reference on the same
file: prefill (GEMM) logits and greedy decode (matvec) token by token."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_weight_types import CPU_ONLY_MIXES, MIXES
from tools.make_synthetic_gguf import write


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_mixed_low_bit_model_matches_cpu(tmp_path, vk_device, mix):
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.weights import open_weights

    wtype, etype, roles = MIXES[mix]
    w = open_weights(write(tmp_path / f"{mix}.gguf", "tiny", wtype, etype, seed=3, roles=roles))
    vk = VulkanBackend(w, 64, device=vk_device)
    try:
        # the file's own bytes on the device, no re-quantization
        assert {m.qtype.name for L in vk.layers for m in L.qkv} == {wtype.upper()}
        cpu = CpuBackend(w, 64)
        ids = np.random.default_rng(1).integers(3, 4096, 20).tolist()
        ref = cpu.forward(ids, 0, all_logits=True)
        got = vk.forward(ids, 0, all_logits=True)
        assert np.mean(ref.argmax(-1) == got.argmax(-1)) >= 0.95
        np.testing.assert_allclose(got, ref, atol=2e-2 * np.abs(ref).max())
        for pos in (20, 21):  # decode: one token at a time after the prompt
            tok = [ids[pos - 20]]
            np.testing.assert_allclose(vk.forward(tok, pos), cpu.forward(tok, pos), atol=2e-2 * np.abs(ref).max())
    finally:
        vk.close()
        w.close()


def test_codebook_types_refused_with_the_remedy_or_requantized(tmp_path, vk_device):
    """IQ3_XXS / IQ2_XS have no Vulkan kernel: the file's own bytes are refused in one line that
    names the tensor, the type and the two ways out; --quant q8_0 re-quantizes them on the
    device and the model then matches the CPU reference on the file's own weights."""
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.errors import UnsupportedModelError
    from phoenix_chat.engine.quantization import WeightQuant
    from phoenix_chat.engine.weights import open_weights

    wtype, etype, roles = CPU_ONLY_MIXES["iq3"]
    w = open_weights(write(tmp_path / "iq3.gguf", "tiny", wtype, etype, seed=3, roles=roles))
    try:
        with pytest.raises(
            UnsupportedModelError, match=r"blk\.0\.attn_q\.weight: type IQ3_XXS has no Vulkan kernel"
        ) as e:
            VulkanBackend(w, 64, device=vk_device)
        assert "--backend cpu" in str(e.value) and "--quant q4_0" in str(e.value)
        vk = VulkanBackend(w, 64, VulkanOptions(quant=WeightQuant.parse("q8_0"), allow_software=True), device=vk_device)
        try:
            assert {m.qtype.name for L in vk.layers for m in L.qkv} == {"Q8_0"}
            ids = np.random.default_rng(1).integers(3, 4096, 12).tolist()
            ref = CpuBackend(w, 64).forward(ids, 0, all_logits=True)
            got = vk.forward(ids, 0, all_logits=True)
            assert np.mean(ref.argmax(-1) == got.argmax(-1)) >= 0.9
            np.testing.assert_allclose(got, ref, atol=3e-2 * np.abs(ref).max())
        finally:
            vk.close()
    finally:
        w.close()
