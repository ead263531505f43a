"""A whole model of the low-bit types (tests/test_weight_types.py's mixes: Q2_K, Q3_K, Q4_1,
Q5_1, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S matrices and embeddings) on Vulkan against
the CPU reference on the same file: prefill (GEMM) logits and greedy decode (matvec) token by
token."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_weight_types import MIXES
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
