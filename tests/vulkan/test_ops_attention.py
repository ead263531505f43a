"""Decode attention (split-K + reduce) against numpy: GQA, sliding window over a ring cache,
f16 K/V, one recording replayed at several positions."""
from __future__ import annotations

import numpy as np
import pytest

from engine.backends.vulkan.ops_attention import attention_decode, partial_floats
from engine.backends.vulkan.ops_common import pack_step
from tests.vulkan.ops_helpers import Bufs, nmse


def attend_ref(q, kc, vc, pos, window, slots, scale):
    """q [H, D]; caches [KV, slots, D] (f32 values of the f16 cache); positions live at p % slots."""
    H, D = q.shape
    KV = kc.shape[0]
    G = H // KV
    lo = max(0, pos - window + 1) if window else 0
    slot = np.arange(lo, pos + 1) % slots
    out = np.zeros((H, D))
    for h in range(H):
        K = kc[h // G, slot].astype(np.float64)
        V = vc[h // G, slot].astype(np.float64)
        s = K @ q[h].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[h] = p @ V / p.sum()
    return out


CASES = [  # D, H, KV, window, slots, n_splits, positions replayed
    (256, 4, 1, 512, 512, 4, [0, 5]),                # 270M/1B local layer, first tokens
    (256, 4, 1, 512, 530, 8, [1500, 1501]),          # ring: window < positions, slot wraps
    (128, 8, 4, 0, 1100, 16, [1031]),                # global layer, GQA 2
    (128, 32, 16, 1024, 1040, 8, [2047]),            # 27B shape, local
    (256, 8, 1, 0, 300, 3, [299]),                   # G = 8, splits not dividing the length
    (256, 8, 4, 0, 200, 1, [130]),                   # one split
]


@pytest.mark.parametrize("D,H,KV,window,slots,n_splits,positions", CASES)
def test_attention_decode(vk_device, D, H, KV, window, slots, n_splits, positions):
    dev = vk_device
    rng = np.random.default_rng(D * 7 + H + slots)
    kc = (rng.standard_normal((KV, slots, D)) * 2).astype(np.float16)
    vc = rng.standard_normal((KV, slots, D)).astype(np.float16)
    q = (rng.standard_normal((H, D)) * 2).astype(np.float32)
    scale = 1.0 / np.sqrt(168.0 if D == 128 else 256.0)
    with Bufs(dev) as b:
        step = b.step(pos=positions[0])
        bq, bk, bv = b.of(q), b.of(kc), b.of(vc)
        part = b.zeros(4 * partial_floats(H, D, n_splits))
        out = b.zeros(4 * H * D)
        cl = dev.commands()
        attention_decode(cl, dev, step, bq, bk, bv, part, out, head_dim=D, n_heads=H, n_kv_heads=KV,
                         cache_slots=slots, window=window, scale=scale, n_splits=n_splits)
        cl.end()
        for pos in positions:      # one recording, replayed: the position comes from the step buffer
            step.write(np.frombuffer(pack_step(pos=pos), np.uint8))
            cl.submit(wait=True)
            got = b.read(out, np.float32, (H, D))
            want = attend_ref(q, kc.astype(np.float32), vc.astype(np.float32), pos, window, slots, scale)
            assert nmse(got, want) < 1e-9, pos
            if window and pos >= window:   # the window matters: attending to everything differs
                assert nmse(got, attend_ref(q, kc.astype(np.float32), vc.astype(np.float32), pos, 0,
                                            slots, scale)) > 1e-6
        cl.destroy()
