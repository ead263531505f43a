"""QK-norm + NEOX RoPE + f16 KV-cache write against numpy (HF Gemma 3 semantics)."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.ops_rope import rope_kv
from tests.vulkan.ops_helpers import Bufs, nmse, rmsnorm, run


def rope_ref(x, pos, theta, factor):
    """x [T, heads, D] rotated as HF: inv_freq in f32, / factor, angle = pos * inv_freq in f32."""
    D = x.shape[-1]
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, D, 2, dtype=np.float32) / np.float32(D)))).astype(np.float32)
    inv = (inv / np.float32(factor)).astype(np.float32)
    ang = (np.asarray(pos, np.float32)[:, None] * inv[None, :]).astype(np.float32).astype(np.float64)
    c = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, None, :]
    s = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, None, :]
    x = np.asarray(x, np.float64)
    rot = np.concatenate([-x[..., D // 2 :], x[..., : D // 2]], -1)
    return x * c + rot * s


CASES = [  # D, H, KV, pos0, T, max_tokens, slots, theta, factor
    (256, 4, 1, 0, 1, 1, 512, 10_000.0, 1.0),  # 270M/1B local, first token
    (256, 4, 1, 700, 3, 4, 520, 10_000.0, 1.0),  # ring wraps (700 % 520), fewer tokens than recorded
    (128, 8, 4, 1021, 6, 6, 1030, 10_000.0, 1.0),  # 27B-like local layer, ring wraps inside the chunk
    (256, 8, 4, 3000, 2, 2, 4096, 1_000_000.0, 8.0),  # 4B global layer with linear scaling
    (64, 2, 2, 5, 1, 1, 16, 1_000_000.0, 1.0),
]


@pytest.mark.parametrize("D,H,KV,pos0,T,max_tokens,slots,theta,factor", CASES)
def test_rope_kv(vk_device, D, H, KV, pos0, T, max_tokens, slots, theta, factor):
    dev = vk_device
    rng = np.random.default_rng(D + H + pos0)
    q = (rng.standard_normal((max_tokens, H, D)) * 4).astype(np.float32)
    k = (rng.standard_normal((max_tokens, KV, D)) * 4).astype(np.float32)
    v = rng.standard_normal((max_tokens, KV, D)).astype(np.float32)
    qw = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    kw = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    with Bufs(dev) as b:
        # fused QKV layout: one buffer, per token [q | k | v], to exercise offsets and strides
        qkv = np.concatenate([q.reshape(max_tokens, -1), k.reshape(max_tokens, -1), v.reshape(max_tokens, -1)], 1)
        bqkv = b.of(qkv)
        kc, vc = b.zeros(KV * slots * D * 2), b.zeros(KV * slots * D * 2)
        step = b.step(pos=pos0, n_tokens=T)
        stride = qkv.shape[1]
        run(
            dev,
            lambda cl: rope_kv(
                cl,
                dev,
                step,
                bqkv,
                bqkv,
                bqkv,
                b.of(qw),
                b.of(kw),
                kc,
                vc,
                head_dim=D,
                n_heads=H,
                n_kv_heads=KV,
                cache_slots=slots,
                theta=theta,
                scale_factor=factor,
                max_tokens=max_tokens,
                q_stride=stride,
                kv_stride=stride,
                q_offset=0,
                k_offset=H * D,
                v_offset=(H + KV) * D,
            ),
        )
        out = b.read(bqkv, np.float32, qkv.shape)
        kcache = b.read(kc, np.float16, (KV, slots, D)).astype(np.float32)
        vcache = b.read(vc, np.float16, (KV, slots, D)).astype(np.float32)

    pos = np.arange(pos0, pos0 + T)
    want_q = rope_ref(rmsnorm(q[:T], qw), pos, theta, factor)
    want_k = rope_ref(rmsnorm(k[:T], kw), pos, theta, factor)
    got_q = out[:T, : H * D].reshape(T, H, D)
    assert nmse(got_q, want_q) < 1e-7  # pos off by one gives > 6e-4 here
    assert np.array_equal(out[:, H * D :], qkv[:, H * D :]), "k/v inputs must stay untouched"
    assert np.array_equal(out[T:], qkv[T:]), "tokens beyond step.n_tokens must stay untouched"
    slot = pos % slots
    assert nmse(kcache[:, slot].transpose(1, 0, 2), want_k) < 1e-6  # f16 storage
    assert nmse(vcache[:, slot].transpose(1, 0, 2), v[:T]) < 1e-6
    untouched = np.ones(slots, bool)
    untouched[slot] = False
    assert not kcache[:, untouched].any() and not vcache[:, untouched].any()
