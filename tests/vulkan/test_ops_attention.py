"""Decode attention (split-K, the last workgroup of a kv head reduces) against numpy: GQA,
sliding window over a ring cache, f16 K/V, one recording replayed at several positions (the
arrival counters must be back at 0 after every run)."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.ops_attention import attention_decode, counter_words, partial_floats
from phoenix_chat.engine.backends.vulkan.ops_common import pack_step
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
    (256, 4, 1, 512, 512, 4, [0, 5, 5]),  # 270M/1B local layer, first tokens
    (256, 4, 1, 512, 530, 8, [1500, 1501]),  # ring: window < positions, slot wraps
    (128, 8, 4, 0, 1100, 16, [1031]),  # global layer, GQA 2
    (128, 32, 16, 1024, 1040, 8, [2047]),  # 27B shape, local
    (256, 8, 1, 0, 300, 3, [299]),  # G = 8, splits not dividing the length
    (256, 8, 4, 0, 200, 1, [130, 3]),  # one split
    (128, 3, 3, 0, 4200, 256, [4100, 0, 17]),  # G = 1, most splits; more splits than positions
    (64, 6, 2, 40, 64, 37, [63, 100, 101]),  # head_dim 64, G = 3, odd splits, ring of 64
    (256, 4, 1, 0, 1200, 128, [1190, 1]),  # 270M global layer with the backend's split count
    (128, 4, 2, 0, 700, 2, [650, 40]),  # splits longer than a workgroup's block (3 blocks)
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
        counters = b.zeros(4 * counter_words(KV))
        out = b.zeros(4 * H * D)
        cl = dev.commands()
        attention_decode(
            cl,
            dev,
            step,
            bq,
            bk,
            bv,
            part,
            counters,
            out,
            head_dim=D,
            n_heads=H,
            n_kv_heads=KV,
            cache_slots=slots,
            window=window,
            scale=scale,
            n_splits=n_splits,
        )
        cl.end()
        for pos in positions:  # one recording, replayed: the position comes from the step buffer
            step.write(np.frombuffer(pack_step(pos=pos), np.uint8))
            dev.upload(out, np.full(H * D, np.nan, np.float32).view(np.uint8))
            cl.submit(wait=True)
            got = b.read(out, np.float32, (H, D))
            want = attend_ref(q, kc.astype(np.float32), vc.astype(np.float32), pos, window, slots, scale)
            assert nmse(got, want) < 1e-9, pos
            assert not b.read(counters, np.uint32).any(), "the last workgroup resets its counter"
            if window and pos >= window:  # the window matters: attending to everything differs
                assert (
                    nmse(got, attend_ref(q, kc.astype(np.float32), vc.astype(np.float32), pos, 0, slots, scale)) > 1e-6
                )
        cl.destroy()


def test_attention_decode_one_recording_many_layers(vk_device):
    """Several dispatches in one command list share one counter buffer (as the backend's layers
    do), each on its own cache, separated by barriers; the list replays."""
    dev = vk_device
    D, H, KV, slots, n_splits = 128, 4, 2, 256, 16
    rng = np.random.default_rng(5)
    scale = 0.1
    with Bufs(dev) as b:
        step = b.step(pos=200)
        q = (rng.standard_normal((H, D)) * 2).astype(np.float32)
        bq = b.of(q)
        part = b.zeros(4 * partial_floats(H, D, n_splits))
        counters = b.zeros(4 * counter_words(KV))
        layers = []
        cl = dev.commands()
        for _ in range(3):
            kc = (rng.standard_normal((KV, slots, D)) * 2).astype(np.float16)
            vc = rng.standard_normal((KV, slots, D)).astype(np.float16)
            out = b.zeros(4 * H * D)
            layers.append((kc, vc, out))
            attention_decode(
                cl,
                dev,
                step,
                bq,
                b.of(kc),
                b.of(vc),
                part,
                counters,
                out,
                head_dim=D,
                n_heads=H,
                n_kv_heads=KV,
                cache_slots=slots,
                window=0,
                scale=scale,
                n_splits=n_splits,
            )
            cl.barrier()
        cl.end()
        for pos in (200, 31, 255):
            step.write(np.frombuffer(pack_step(pos=pos), np.uint8))
            cl.submit(wait=True)
            for kc, vc, out in layers:
                want = attend_ref(q, kc.astype(np.float32), vc.astype(np.float32), pos, 0, slots, scale)
                assert nmse(b.read(out, np.float32, (H, D)), want) < 1e-9, pos
            assert not b.read(counters, np.uint32).any()
        cl.destroy()


@pytest.mark.parametrize("D,H,KV,window,slots,n_splits,positions", CASES)
def test_attention_decode_writes_q8_1_bit_identical(vk_device, D, H, KV, window, slots, n_splits, positions):
    """The _q8_1 variant (q=): the plain one's f32 output (to a few ulp), plus q8_1 blocks equal bit
    for bit to quantize_q8_1 of its own output, rewritten on every replay; an all-zero block has d = 0."""
    from phoenix_chat.engine.backends.vulkan.matvec import q8_1_bytes, record_quantize

    dev = vk_device
    rng = np.random.default_rng(D * 5 + H + slots)
    kc = (rng.standard_normal((KV, slots, D)) * 2).astype(np.float16)
    vc = (rng.standard_normal((KV, slots, D)) * 3).astype(np.float16)
    vc[0, :, :32] = 0.0  # the first block of every query head of kv head 0 is all zero
    q = (rng.standard_normal((H, D)) * 2).astype(np.float32)
    scale = 1.0 / np.sqrt(168.0 if D == 128 else 256.0)
    nq = q8_1_bytes(H * D) // 4
    with Bufs(dev) as b:
        step = b.step(pos=positions[0])
        bq, bk, bv = b.of(q), b.of(kc), b.of(vc)
        part = b.zeros(4 * partial_floats(H, D, n_splits))
        counters = b.zeros(4 * counter_words(KV))
        out0, out1 = b.zeros(4 * H * D), b.zeros(4 * H * D)
        oq, ref_q = b.zeros(4 * nq), b.zeros(4 * nq)
        kw = dict(
            head_dim=D, n_heads=H, n_kv_heads=KV, cache_slots=slots, window=window, scale=scale, n_splits=n_splits
        )
        cl = dev.commands()
        attention_decode(cl, dev, step, bq, bk, bv, part, counters, out0, **kw)
        cl.barrier()
        attention_decode(cl, dev, step, bq, bk, bv, part, counters, out1, q=oq, **kw)
        cl.barrier()
        record_quantize(cl, dev, out1, ref_q, H * D)
        cl.end()
        for pos in positions:
            step.write(np.frombuffer(pack_step(pos=pos), np.uint8))
            for buf, n in ((out1, H * D), (oq, nq), (ref_q, nq)):
                dev.upload(buf, np.full(n, 0xFFFFFFFF, np.uint32).view(np.uint8))
            cl.submit(wait=True)
            got = b.read(out1, np.float32, (H, D))
            # the two variants are separate pipelines: a compiler may contract a*b+c into FMAs
            # differently in each (lavapipe on an AVX-512 host did: 1-2 ulp on one case), so
            # their f32 outputs agree to a few ulp; the q8_1 blocks below must match this
            # variant's own output exactly (what the int8 matvec reads)
            np.testing.assert_array_max_ulp(got, b.read(out0, np.float32, (H, D)), maxulp=4)
            want = attend_ref(q, kc.astype(np.float32), vc.astype(np.float32), pos, window, slots, scale)
            assert nmse(got, want) < 1e-9, pos
            blocks = b.read(oq, np.uint32, (H * D // 32, 10))
            np.testing.assert_array_equal(blocks, b.read(ref_q, np.uint32, (H * D // 32, 10)))
            zero = np.zeros(H * D // 32, bool)
            zero[np.arange(H // KV) * (D // 32)] = True  # block 0 of kv head 0's query heads
            assert np.all(blocks[zero] == 0) and np.all(blocks[~zero, 8] != 0), pos
            assert not b.read(counters, np.uint32).any()
        cl.destroy()


def test_batched_decode_split_rule(monkeypatch):
    """batch_splits (device-free): a batched step's attention aims at ~1,024 workgroups (rows x kv
    heads x splits), a power of two of splits, never more than the single stream's (its scratch);
    the variable forces a count (capped the same way) or is refused with a message."""
    from phoenix_chat.engine.backends.vulkan import ops_attention

    monkeypatch.delenv("PHOENIX_VULKAN_BATCH_ATTN_SPLITS", raising=False)
    rule = ops_attention.batch_splits
    assert [rule(32, rows, 16) for rows in (2, 4, 8, 16, 32)] == [32, 16, 8, 4, 2]  # 27B, 512 context
    assert [rule(32, rows, 4) for rows in (2, 8, 32)] == [32, 32, 8]  # 4B
    assert rule(128, 32, 1) == 32 and rule(128, 3, 1) == 128  # 270M at 8k context; 3 rows: 341 -> 256 -> 128
    assert rule(4, 32, 16) == 2 and rule(4, 32, 64) == 1  # never 0
    monkeypatch.setenv("PHOENIX_VULKAN_BATCH_ATTN_SPLITS", "3")
    assert rule(32, 32, 16) == 3 and rule(2, 32, 16) == 2
    for bad in ("0", "257", "two"):
        monkeypatch.setenv("PHOENIX_VULKAN_BATCH_ATTN_SPLITS", bad)
        with pytest.raises(ValueError, match="PHOENIX_VULKAN_BATCH_ATTN_SPLITS"):
            rule(32, 8, 16)
