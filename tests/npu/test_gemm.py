"""The GEMM driver through the emulated NPU: odd shapes, padding, K-splitting, both types."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phoenix_chat.npu.errors import NpuUnavailableError
from phoenix_chat.npu.gemm import NpuGemm, plan_cost, reference_matmul


@pytest.mark.parametrize(
    "n,in_f,out_f",
    [
        (1, 8, 3),  # far smaller than one call
        (37, 700, 300),  # odd everything: M, K and N padded, K split
        (256, 640, 1024),  # Gemma 3 270M q_proj, exactly one M chunk
        (300, 2048, 640),  # 270M down_proj: two M chunks, four K chunks
        (513, 256, 257),  # one column over a block, three M chunks
    ],
)
def test_int8_gemm_is_bit_exact_with_the_quantized_reference(device, artifacts, n, in_f, out_f):
    rng = np.random.default_rng(n * 7 + in_f)
    w = rng.standard_normal((out_f, in_f)).astype(np.float32) * 0.05
    x = rng.standard_normal((n, in_f)).astype(np.float32)
    gemm = NpuGemm(device, artifacts, "i8")
    gemm.add_weight("w", w)
    y = gemm.matmul(x, "w")
    assert y.shape == (n, out_f) and y.dtype == np.float32
    assert np.array_equal(y, reference_matmul(x, w, "i8"))  # tiling/packing lose nothing
    exact = x @ w.T  # int8 costs this much
    rel = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    assert rel < 0.02, rel


def test_int8_k_split_sums_partials_exactly(device, artifacts):
    # Large K with all-max values: partial sums reach 127*127*4096 = 66M, beyond f32's exact range,
    # so only exact int32 partials summed as integers give the right answer.
    w = np.ones((5, 4096), np.float32)
    x = np.ones((3, 4096), np.float32)
    gemm = NpuGemm(device, artifacts, "i8")
    pw = gemm.add_weight("w", w)
    assert pw.k_chunks == 8
    y = gemm.matmul(x, "w")
    assert np.array_equal(y, reference_matmul(x, w))
    assert np.allclose(y, 4096.0, rtol=1e-6)


@pytest.mark.parametrize("n,in_f,out_f", [(5, 100, 70), (130, 300, 513)])
def test_bf16_gemm_matches_within_f32_accumulation(device, artifacts, n, in_f, out_f):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((out_f, in_f)).astype(np.float32)
    x = rng.standard_normal((n, in_f)).astype(np.float32)
    gemm = NpuGemm(device, artifacts, "bf16")
    gemm.add_weight("w", w)
    y = gemm.matmul(x, "w")
    ref = reference_matmul(x, w, "bf16")
    assert np.allclose(y, ref, rtol=1e-5, atol=1e-4 * math.sqrt(in_f))
    rel = np.linalg.norm(y - x @ w.T) / np.linalg.norm(x @ w.T)
    assert rel < 0.01


def test_weights_are_uploaded_once_and_stay_resident(device, artifacts, emu):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((300, 700)).astype(np.float32)
    gemm = NpuGemm(device, artifacts, "i8")
    pw = gemm.add_weight("w", w)
    weight_bos = {bo.bo.id for row in pw.blocks for bo in row}
    assert len(weight_bos) == pw.k_chunks * pw.n_blocks
    mark = len(emu.log)
    gemm.matmul(rng.standard_normal((20, 700)).astype(np.float32), "w")
    second = len(emu.log)
    for _ in range(2):
        gemm.matmul(rng.standard_normal((20, 700)).astype(np.float32), "w")
    assert not [e for e in emu.log[mark:] if e[0] in ("write", "sync") and e[1] in weight_bos]
    assert not [e for e in emu.log[second:] if e[0] == "bo"]  # A and C buffers are reused too
    assert gemm.stats["runs"] == 3 * pw.k_chunks * pw.n_blocks


def test_variant_choice_trades_padding_against_calls(device, artifacts):
    gemm = NpuGemm(device, artifacts, "i8")
    by_name = {a.spec.name: a.spec for a in artifacts.values()}
    assert gemm.choose(256, 256).spec.name == "gemm_i8_256x256x256"  # no padding at all
    assert gemm.choose(640, 1024).spec.name == "gemm_i8_256x512x1024"  # 270M q_proj: 2 calls
    assert gemm.choose(2048, 2048).spec.name == "gemm_i8_256x1024x2048"  # 2 calls instead of 32
    small, big = by_name["gemm_i8_256x256x256"], by_name["gemm_i8_256x1024x2048"]
    assert plan_cost(small, 2048, 2048) > plan_cost(big, 2048, 2048)


def test_no_kernel_of_the_type(device, artifacts):
    only_bf16 = {k: v for k, v in artifacts.items() if v.spec.dtype_in == "bf16"}
    with pytest.raises(NpuUnavailableError, match="no i8 GEMM kernel"):
        NpuGemm(device, only_bf16, "i8")
