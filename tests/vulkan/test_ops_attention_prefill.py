"""Causal chunk attention against numpy: GQA, sliding window over a ring cache, chunks that are
not multiples of the query block, a chunk starting mid-context, fewer tokens than recorded."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.ops_attention import attention_prefill
from tests.vulkan.ops_helpers import Bufs, nmse, run
from tests.vulkan.test_ops_attention import attend_ref

CASES = [  # D, H, KV, window, slots, pos0, n_tokens, max_tokens
    (256, 4, 1, 512, 512 + 64, 0, 37, 40),  # 270M local layer, first chunk
    (256, 4, 1, 16, 16 + 24, 50, 21, 24),  # ring + window inside the chunk
    (128, 8, 4, 0, 256, 100, 13, 13),  # global, GQA 2, chunk mid-context
    (128, 32, 16, 24, 24 + 9, 70, 9, 16),  # 27B shape, local, short window
    (256, 8, 4, 0, 64, 0, 64, 64),  # whole chunk from position 0
]


@pytest.mark.parametrize("D,H,KV,window,slots,pos0,n_tokens,max_tokens", CASES)
def test_attention_prefill(vk_device, D, H, KV, window, slots, pos0, n_tokens, max_tokens):
    dev = vk_device
    rng = np.random.default_rng(D + H + pos0 + n_tokens)
    kc = (rng.standard_normal((KV, slots, D)) * 2).astype(np.float16)
    vc = rng.standard_normal((KV, slots, D)).astype(np.float16)
    stride = (H + 2 * KV) * D  # q inside a fused QKV buffer
    qkv = (rng.standard_normal((max_tokens, stride)) * 2).astype(np.float32)
    scale = 1.0 / np.sqrt(168.0 if D == 128 else 256.0)
    with Bufs(dev) as b:
        out = b.of(np.full((max_tokens, H * D), 5.0, np.float32))
        step = b.step(pos=pos0, n_tokens=n_tokens)
        bq, bk, bv = b.of(qkv), b.of(kc), b.of(vc)
        run(
            dev,
            lambda cl: attention_prefill(
                cl,
                dev,
                step,
                bq,
                bk,
                bv,
                out,
                head_dim=D,
                n_heads=H,
                n_kv_heads=KV,
                cache_slots=slots,
                window=window,
                scale=scale,
                max_tokens=max_tokens,
                q_stride=stride,
            ),
        )
        got = b.read(out, np.float32, (max_tokens, H, D))
    k32, v32 = kc.astype(np.float32), vc.astype(np.float32)
    want = np.stack(
        [attend_ref(qkv[t, : H * D].reshape(H, D), k32, v32, pos0 + t, window, slots, scale) for t in range(n_tokens)]
    )
    assert nmse(got[:n_tokens], want) < 1e-9
    assert np.all(got[n_tokens:] == 5.0), "rows beyond step.n_tokens must stay untouched"
