"""Quantization for the NPU GEMM: symmetric int8 (per output channel / per token) and bf16.

Weights: one f32 scale per output channel (row of W [out, in]), q = round(w / scale), |q| ≤ 127.
Activations: one f32 scale per token (row of x [n, in]), computed at run time from that row.
Then x @ W.T ≈ (qx @ qw.T) * sx[:, None] * sw[None, :]: the int32 product is exact, only the
two roundings to int8 lose precision.
"""

from __future__ import annotations

import numpy as np

QMAX = 127  # symmetric: -128 is never produced, so negating a weight row stays exact


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row: returns (q int8 same shape, scale f32 [rows]). Zero rows get scale 1."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.max(np.abs(x), axis=-1)
    scale = np.where(amax > 0, amax / np.float32(QMAX), np.float32(1.0)).astype(np.float32)
    q = np.rint(x / scale[..., None])
    return np.clip(q, -QMAX, QMAX).astype(np.int8), scale


quantize_weight_per_channel = quantize_rows  # W [out, in]: one scale per output channel
quantize_activation_per_token = quantize_rows  # x [n, in]: one scale per token


def dequantize_output(acc: np.ndarray, token_scale: np.ndarray, channel_scale: np.ndarray) -> np.ndarray:
    """int32 accumulators [n, out] → f32, applying both scales (in f32, as the epilogue does)."""
    return (acc.astype(np.float32) * token_scale[:, None]) * channel_scale[None, :]


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round f32 to the nearest bf16 (ties to even), as uint16 bit patterns. NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
