"""Buffer layouts of the kernels and the quantization maths, without any device."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.npu.kernels.spec import DEFAULT_SPECS, GemmSpec
from phoenix_chat.npu.quant import bf16_bits_to_f32, dequantize_output, f32_to_bf16_bits, quantize_rows


@pytest.mark.parametrize("spec", DEFAULT_SPECS, ids=lambda s: s.name)
def test_pack_unpack_round_trip(spec):
    a = np.arange(spec.M * spec.K).reshape(spec.M, spec.K)
    b = np.arange(spec.K * spec.N).reshape(spec.K, spec.N)
    c = np.arange(spec.M * spec.N).reshape(spec.M, spec.N)
    assert np.array_equal(spec.unpack_a(spec.pack_a(a)), a)
    assert np.array_equal(spec.unpack_b(spec.pack_b(b)), b)
    assert np.array_equal(spec.unpack_c(spec.pack_c(c)), c)


def test_layouts_match_the_documented_order():
    spec = DEFAULT_SPECS[0]  # i8: m=k=n=64, MAC 4x8x8
    m, k, n, (r, s, t) = spec.m, spec.k, spec.n, spec.mac
    a = np.arange(spec.M * spec.K).reshape(spec.M, spec.K)
    flat = spec.pack_a(a)
    # A [M/m][K/k][m/r][k/s][r][s]: the first r*s values are the top-left 4x8 block, row by row.
    assert np.array_equal(flat[: r * s].reshape(r, s), a[:r, :s])
    # the next r*s block moves s columns right, inside the same (m x k) tile
    assert np.array_equal(flat[r * s : 2 * r * s].reshape(r, s), a[:r, s : 2 * s])
    # the second (m x k) tile of row block 0 is K-tile 1
    assert flat[m * k] == a[0, k]
    # row block 1 (core row 1) starts after all K tiles of row block 0
    assert flat[m * spec.K] == a[m, 0]
    b = np.arange(spec.K * spec.N).reshape(spec.K, spec.N)
    fb = spec.pack_b(b)
    assert np.array_equal(fb[: s * t].reshape(s, t), b[:s, :t])
    assert fb[k * n] == b[k, 0]  # K tile 1 of column block 0
    assert fb[spec.K * n] == b[0, n]  # column block 1
    c = np.arange(spec.M * spec.N).reshape(spec.M, spec.N)
    fc = spec.pack_c(c)
    assert np.array_equal(fc[: r * t].reshape(r, t), c[:r, :t])
    assert fc[m * n] == c[m, 0]  # core row 1 of column 0 follows row 0's tile
    assert fc[spec.M * n] == c[0, n]  # column 1's memory tile output


def test_spec_rejects_shapes_the_array_cannot_run():
    assert GemmSpec("ok", "i8", "i32", 256, 256, 768, 64, 64, 64).tn == 3
    with pytest.raises(ValueError, match="N=300"):
        GemmSpec("bad", "i8", "i32", 256, 256, 300, 64, 64, 64)
    with pytest.raises(ValueError, match="M=200"):
        GemmSpec("bad", "i8", "i32", 200, 256, 256, 64, 64, 64)
    with pytest.raises(ValueError, match="MAC shape"):
        GemmSpec("bad", "i8", "i32", 256, 256, 240, 64, 64, 60)
    with pytest.raises(ValueError, match="L1"):
        GemmSpec("bad", "i8", "i32", 512, 256, 512, 128, 64, 128)
    with pytest.raises(ValueError, match="accumulate"):
        GemmSpec("bad", "i8", "f32", 256, 256, 256, 64, 64, 64)


def test_int8_quantization_bounds_and_error():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 333)).astype(np.float32) * rng.uniform(0.01, 10, (9, 1)).astype(np.float32)
    x[3] = 0
    q, scale = quantize_rows(x)
    assert q.dtype == np.int8 and np.abs(q.astype(int)).max() <= 127
    assert scale[3] == 1.0 and not q[3].any()
    back = q.astype(np.float32) * scale[:, None]
    assert np.all(np.abs(back - x) <= scale[:, None] / 2 + 1e-6)
    assert np.abs(q[np.arange(9) != 3]).max(axis=1).min() == 127  # each row uses the full range


def test_dequantize_applies_both_scales():
    acc = np.array([[10, -20], [30, 40]], np.int32)
    out = dequantize_output(acc, np.array([0.5, 2.0], np.float32), np.array([1.0, 0.25], np.float32))
    assert np.allclose(out, [[5, -2.5], [60, 20]])


def test_bf16_rounding_is_nearest_even():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, np.inf, 3.0e38], np.float32)
    bits = f32_to_bf16_bits(x)
    back = bf16_bits_to_f32(bits)
    assert back[0] == 1.0 and back[1] == 1.0  # tie rounds to even (down)
    assert back[2] == 1.0 + 4 * 2**-8  # tie rounds to even (up)
    assert back[3] == -2.5 and np.isinf(back[4])
    assert np.isnan(bf16_bits_to_f32(f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]
