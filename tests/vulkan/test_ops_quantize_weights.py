"""Weights re-quantized on the device (`--quant`) against gguf-py's quantizer, byte for byte:
every target type from every source kind, with the values where rounding is decided (ties at
.5, equal |max| of both signs, zero blocks, f16 subnormals and overflow; for Q4_1/Q5_1 also
all-equal blocks, one outlier, min/max steps at x.5 and values near f16's limit), and tensors
split into several pieces whose destinations start at unaligned offsets."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from phoenix_chat.engine.backends.vulkan import ops_quantize_weights
from phoenix_chat.engine.backends.vulkan.ops_quantize_weights import quantize_tensor
from phoenix_chat.engine.backends.vulkan.pipelines import VARIANTS
from phoenix_chat.shaders import SPV_DIR


def awkward_values(rows: int, cols: int, seed: int) -> np.ndarray:
    """Normal values at scales from 1e-6 to 1e5 per row, then blocks that test the rounding rules."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w *= (10.0 ** rng.uniform(-6, 5, (rows, 1))).astype(np.float32)
    w[0, :32] = 0.0  # zero block
    w[0, 32:64] = 0.0
    w[0, 32] = -0.0  # ... whose first value is -0.0
    ties = np.arange(-16, 16, dtype=np.float32) + 0.5  # Q8_0 with amax 127: v / d = v exactly
    ties[0] = -127.0
    w[1, :32] = ties
    w[1, 32:64] = 3.0  # Q4_0: equal |max| of both signs, first wins
    w[1, 40] = -3.0
    w[1, 33] = -3.0
    if cols >= 128:
        w[2, 64:96] = np.linspace(-8.5, 8.5, 32, dtype=np.float32)  # Q4_0 steps at x.5
        w[2, 96:128] = np.float32(2.0**-20) * np.arange(32)  # f16 subnormals
    w[3, :4] = [70000.0, -70000.0, 65520.0, 65519.0]  # f16 overflow / last rounding
    if cols >= 256:  # Q4_1 / Q5_1 edges (the min/max types)
        w[4, :32] = np.float32(-1.7)  # all equal: d = 0, every q 0, m the value
        w[4, 32:64] = 0.25
        w[4, 33] = 1e4  # one outlier: all others at level 0
        w[4, 64:96] = np.arange(32, dtype=np.float32) * np.float32(0.5) - 3.0  # (v - min) / d lands on x.5
        w[4, 96:128] = np.linspace(-2.0, 13.0, 32, dtype=np.float32)  # range 15: d = 1 exactly
        w[4, 128:160] = np.float32(65504.0) * np.linspace(-1, 1, 32, dtype=np.float32)  # m at f16's limit
        w[4, 160:192] = np.float32(-70000.0)  # all equal past f16's range: m = -inf
        w[4, 192:224] = np.float32(3.0e38) * np.sign(np.linspace(-1, 1, 32, dtype=np.float32))  # max - min = inf
        w[4, 224:256] = np.float32(2.0**-20) * np.arange(32) + np.float32(1.0)  # a range far below the values
    return w


def source_bytes(w: np.ndarray, kind: Q) -> tuple[np.ndarray, np.ndarray]:
    """(the source as a file would store it, its f32 values)."""
    if kind == Q.F32:
        return w, w
    if kind == Q.F16:
        h = np.clip(w, -6e4, 6e4).astype(np.float16)  # a real f16 file holds no infinities
        return h, h.astype(np.float32)
    b = (w.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation: any bf16 will do
    return b, (b.astype(np.uint32) << 16).view(np.float32)


def mixed_zero_extremes(values: np.ndarray, target: Q) -> np.ndarray:
    """Per block of Q4_1/Q5_1: does its min or max fall on a zero while the block holds both +0 and
    -0? There numpy's min/max reduction picks either zero (its SIMD order decides; ggml's C and the
    device take the first), so only the sign bit of a zero d or m may differ."""
    if target not in (Q.Q4_1, Q.Q5_1):
        return np.zeros(values.size // 32, bool)
    b = values.reshape(-1, 32)
    zero = b == 0
    both = (zero & np.signbit(b)).any(1) & (zero & ~np.signbit(b)).any(1)
    return both & ((b.min(1) == 0) | (b.max(1) == 0))


def sign_of_zero_scales_cleared(blocks: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The blocks with the sign bit of d and m cleared where `mask` says the sign is numpy's whim,
    where d and m are zeros."""
    out = blocks.copy()
    for word in (0, 1):  # d, m: f16 at bytes 0-1, 2-3
        hi = 2 * word + 1
        is_zero = (out[:, 2 * word] == 0) & ((out[:, hi] & 0x7F) == 0)
        out[mask & is_zero, hi] &= 0x7F
    return out


@pytest.mark.parametrize("target", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_1, Q.F16])
@pytest.mark.parametrize("kind", [Q.F32, Q.F16, Q.BF16])
@pytest.mark.parametrize("rows,cols,piece_rows", [(37, 96, 5), (6, 256, None)])
def test_device_quantization_is_gguf_byte_for_byte(vk_device, monkeypatch, target, kind, rows, cols, piece_rows):
    w = awkward_values(rows, cols, seed=rows + cols)
    src, values = source_bytes(w, kind)
    if kind == Q.F16 and target == Q.F16:
        pytest.skip("the file's own type is uploaded as it is")
    if piece_rows:  # several dispatches; Q8_0 rows of 102 B put most pieces at unaligned offsets
        bytes_per_row = cols * (4 if kind == Q.F32 else 2)
        monkeypatch.setattr(ops_quantize_weights, "PIECE_BYTES", piece_rows * bytes_per_row)
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.ascontiguousarray(quants.quantize(values, target)).view(np.uint8).reshape(-1)
    t = quantize_tensor(vk_device, src, kind, target, (rows, cols), name="w")
    try:
        got = vk_device.download(t.buffer, np.uint8, shape=(t.nbytes,))
    finally:
        t.buffer.destroy()
    assert got.size == want.size
    mixed = mixed_zero_extremes(values, target)
    if mixed.any():
        size = want.size // mixed.size
        got = sign_of_zero_scales_cleared(got.reshape(-1, size), mixed).reshape(-1)
        want = sign_of_zero_scales_cleared(want.reshape(-1, size), mixed).reshape(-1)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"{bad.size} of {want.size} bytes differ, first at byte {bad[:8].tolist()}"


@pytest.mark.parametrize("target", [Q.Q4_1, Q.Q5_1])
def test_min_max_types_take_the_first_of_two_zeros_as_ggml_does(vk_device, target):
    """Blocks whose min or max is a zero held as both +0 and -0: the device's d and m are those of
    ggml's C reference (`if (v < min) min = v`: the first zero), where numpy's reduction picks
    either; every other byte is gguf-py's."""
    rng = np.random.default_rng(5)
    n = 256
    b = np.abs(rng.standard_normal((n, 32))).astype(np.float32)
    for i in range(n):
        pos = rng.choice(32, int(rng.integers(2, 6)), replace=False)
        b[i, pos] = 0.0
        b[i, pos[0]] = -0.0
        b[i, pos[1:]] = np.where(rng.random(pos.size - 1) < 0.5, np.float32(-0.0), np.float32(0.0))
    b[1::2] *= -1  # the zero is the max there
    t = quantize_tensor(vk_device, b, Q.F32, target, (n, 32), name="w")
    try:
        got = vk_device.download(t.buffer, np.uint8, shape=(t.nbytes,)).reshape(n, -1)
    finally:
        t.buffer.destroy()
    want = np.ascontiguousarray(quants.quantize(b, target)).view(np.uint8).reshape(n, -1)
    first_min = np.take_along_axis(b, b.argmin(1)[:, None], 1)[:, 0]  # argmin: the first of equals
    first_max = np.take_along_axis(b, b.argmax(1)[:, None], 1)[:, 0]
    d = (first_max - first_min) / np.float32(15 if target == Q.Q4_1 else 31)
    ggml = np.stack([d, first_min], 1).astype(np.float16).view(np.uint8)
    assert np.array_equal(got[:, :4], ggml)
    assert np.array_equal(got[:, 4:], want[:, 4:])
    assert np.array_equal(got[:, [0, 2]], want[:, [0, 2]])  # d and m differ at most in their sign


def test_rejects_rows_that_are_no_whole_blocks(vk_device):
    with pytest.raises(ValueError, match="no whole Q4_0 blocks"):
        quantize_tensor(vk_device, np.zeros((2, 40), np.float32), Q.F32, Q.Q4_0, (2, 40), name="w")
    with pytest.raises(ValueError, match="dequantize it first"):
        quantize_tensor(vk_device, np.zeros(2 * 34, np.uint8), Q.Q8_0, Q.Q4_0, (2, 32), name="w")


def _fused_multiply_adds(spv: bytes) -> int:
    """OpExtInst GLSL.std.450 Fma (50) instructions in a SPIR-V module."""
    words = np.frombuffer(spv, np.uint32)
    i, n = 5, 0
    while i < words.size:
        count, op = int(words[i] >> 16), int(words[i] & 0xFFFF)
        n += op == 12 and int(words[i + 4]) == 50
        i += count
    return n


@pytest.mark.parametrize("name", [n for n in VARIANTS if n.startswith("quantize_weights_")])
def test_committed_kernels_round_twice_where_gguf_does(name):
    """Lavapipe runs an Fma as a multiply and an add, so only the SPIR-V shows a fused one (the
    H100 fused `v * id + 8.5` when the compiler's unroller had made them Fma)."""
    assert _fused_multiply_adds((SPV_DIR / f"{name}.spv").read_bytes()) == 0
