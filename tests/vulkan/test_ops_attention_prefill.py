"""Causal chunk attention against numpy: GQA, sliding window over a ring cache, chunks that are
not multiples of the query block, a chunk starting mid-context, fewer tokens than recorded.
Both kernels: the scalar f32 one (every device) and the matrix-core one
(attention_prefill_coopmat.comp: f16 Q and P, f32 softmax and accumulators; skipped where the
device has no cooperative matrices, as lavapipe)."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan import ops_attention
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
# the matrix-core kernel: 64-row blocks of tokens x query heads of one kv head, key tiles of 32
# (head_dim 256) or 64, so also blocks and tiles cut by the chunk's end, the window and the ring
CM_CASES = CASES + [
    (256, 8, 4, 1024, 1024 + 64, 1500, 63, 64),  # 4B local, ring wrapped, window cut mid-tile
    (256, 4, 1, 512, 512 + 64, 700, 37, 40),  # 1B/270M local, ring wrapped, odd tokens
    (128, 32, 16, 1024, 1024 + 512, 3000, 512, 512),  # 27B local: a full chunk, window across the ring
    (128, 32, 16, 0, 2200, 1600, 131, 160),  # 27B global: ~1.7k keys, chunk mid-context
    (256, 2, 1, 0, 2048, 0, 2048, 2048),  # GQA 2/1, 2k tokens from 0 (2k keys)
    (256, 4, 1, 0, 2100, 2000, 67, 80),  # 270M global: a 67-token chunk after 2k positions
    (128, 8, 1, 0, 300, 5, 33, 40),  # G = 8: 8 tokens x 8 heads a block
    (128, 6, 2, 0, 200, 10, 21, 24),  # G = 3: one head a block
    (64, 4, 2, 40, 64, 100, 17, 32),  # head_dim 64, ring of 64
    (256, 4, 1, 512, 512 + 64, 0, 1, 8),  # one token
]
CM_NMSE = 2e-5  # f16 Q and P: ~5e-7 in a numpy model of the rounding (per-row worst ~2e-6)


def need_coopmat(dev, head_dim):
    why = ops_attention.prefill_refusal(dev, head_dim)
    if why is not None:
        pytest.skip(f"no coopmat prefill attention: {why}")


def check_prefill(dev, D, H, KV, window, slots, pos0, n_tokens, max_tokens, *, kernel, slot=0, vis=None, splits=None):
    """Run attention_prefill on random q and caches (slot `slot` of slot + 1), compare with numpy
    in float64. vis: the last position each token sees (None: its own). splits: the coopmat
    kernel's key split (None: the engine's rule)."""
    rng = np.random.default_rng(D + H + pos0 + n_tokens)
    kc = (rng.standard_normal((slot + 1, KV, slots, D)) * 2).astype(np.float16)
    vc = rng.standard_normal((slot + 1, KV, slots, D)).astype(np.float16)
    stride = (H + 2 * KV) * D  # q inside a fused QKV buffer
    qkv = (rng.standard_normal((max_tokens, stride)) * 2).astype(np.float32)
    scale = 1.0 / np.sqrt(168.0 if D == 128 else 256.0)
    with Bufs(dev) as b:
        out = b.of(np.full((max_tokens, H * D), 5.0, np.float32))
        step = b.step(pos=pos0, n_tokens=n_tokens, slot=slot)
        bq, bk, bv = b.of(qkv), b.of(kc), b.of(vc)
        bvis = b.of(np.asarray(vis, np.uint32)) if vis is not None else None
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
                vis=bvis,
                kernel=kernel,
                splits=splits,
            ),
        )
        got = b.read(out, np.float32, (max_tokens, H, D))
    k32, v32 = kc[slot].astype(np.float32), vc[slot].astype(np.float32)
    want = np.stack(
        [
            attend_ref(qkv[t, : H * D].reshape(H, D), k32, v32, pos0 + t, window, slots, scale)
            if vis is None
            else spans_ref(qkv[t, : H * D].reshape(H, D), k32, v32, pos0 + t, int(vis[t]), window, slots, scale)
            for t in range(n_tokens)
        ]
    )
    assert np.all(got[n_tokens:] == 5.0), "rows beyond step.n_tokens must stay untouched"
    return nmse(got[:n_tokens], want)


def spans_ref(q, kc, vc, pos, last, window, slots, scale):
    """attend_ref with keys up to `last` (a picture's tokens see the whole picture), the window's
    lower bound from the query's own position."""
    H, D = q.shape
    G = H // kc.shape[0]
    lo = max(0, pos - window + 1) if window else 0
    slot = np.arange(lo, last + 1) % slots
    out = np.zeros((H, D))
    for h in range(H):
        K, V = kc[h // G, slot].astype(np.float64), vc[h // G, slot].astype(np.float64)
        s = K @ q[h].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[h] = p @ V / p.sum()
    return out


@pytest.mark.parametrize("D,H,KV,window,slots,pos0,n_tokens,max_tokens", CASES)
def test_attention_prefill(vk_device, D, H, KV, window, slots, pos0, n_tokens, max_tokens):
    err = check_prefill(vk_device, D, H, KV, window, slots, pos0, n_tokens, max_tokens, kernel="scalar")
    assert err < 1e-9


@pytest.mark.parametrize("D,H,KV,window,slots,pos0,n_tokens,max_tokens", CM_CASES)
def test_attention_prefill_coopmat(vk_device, D, H, KV, window, slots, pos0, n_tokens, max_tokens):
    need_coopmat(vk_device, D)
    err = check_prefill(vk_device, D, H, KV, window, slots, pos0, n_tokens, max_tokens, kernel="coopmat")
    print(f"\ncoopmat prefill attention nmse {err:.2e}")
    assert err < CM_NMSE


SPLIT_CASES = [  # D, H, KV, window, slots, pos0, n_tokens, max_tokens, splits
    (256, 8, 4, 1024, 1024 + 64, 1500, 63, 64, 4),  # 4B local, ring wrapped: the engine's 4 ways
    (256, 8, 4, 0, 2100, 1900, 64, 64, 3),  # 4B global, ~2k keys in 3 unequal runs
    (128, 32, 16, 0, 2200, 1600, 131, 160, 2),  # 27B global, blocks cut by the chunk's end
    (256, 4, 1, 512, 512 + 64, 0, 37, 40, 8),  # first chunk: runs past a block's last key are empty
    (128, 8, 1, 0, 300, 5, 33, 40, 8),  # G = 8, 8 tokens a block
    (64, 4, 2, 40, 64, 100, 17, 32, 5),  # head_dim 64, ring of 64, window cut mid-run
    (256, 4, 1, 512, 512 + 64, 0, 1, 8, 8),  # one token: one key, seven empty runs
]


@pytest.mark.parametrize("D,H,KV,window,slots,pos0,n_tokens,max_tokens,splits", SPLIT_CASES)
def test_attention_prefill_coopmat_split_keys(vk_device, D, H, KV, window, slots, pos0, n_tokens, max_tokens, splits):
    """Each query block's keys split between workgroups, the records merged by
    attention_prefill_combine.comp: the same attention (empty runs included)."""
    need_coopmat(vk_device, D)
    err = check_prefill(vk_device, D, H, KV, window, slots, pos0, n_tokens, max_tokens, kernel="coopmat", splits=splits)
    print(f"\nsplit {splits}: nmse {err:.2e}")
    assert err < CM_NMSE


def test_split_records_are_merged(vk_device):
    """attention_prefill_combine.comp alone (every device, lavapipe too): records of random O,
    m (log2 units, some runs empty: m = -1e30, l = 0) and l merge as
    sum 2^(m_z - M) O_z / sum 2^(m_z - M) l_z; a row with every run empty is 0; rows beyond
    step.n_tokens stay untouched."""
    T, H, D, S, n = 6, 3, 64, 5, 5
    rng = np.random.default_rng(7)
    rec = np.zeros((T, H, S, D + 4), np.float32)
    rec[..., :D] = rng.standard_normal((T, H, S, D)) * 3
    rec[..., D] = rng.uniform(-20, 20, (T, H, S))
    rec[..., D + 1] = rng.uniform(0.5, 40, (T, H, S))
    rec[:, :, 1, D], rec[:, :, 1, D + 1], rec[:, :, 1, :D] = -1e30, 0.0, 0.0  # an empty run
    rec[2, 1, :, D], rec[2, 1, :, D + 1], rec[2, 1, :, :D] = -1e30, 0.0, 0.0  # a row that saw nothing
    m = rec[..., D].astype(np.float64)
    w = np.exp2(m - m.max(-1, keepdims=True))
    want = (w[..., None] * rec[..., :D]).sum(2) / np.maximum((w * rec[..., D + 1]).sum(2), 1e-300)[..., None]
    want[2, 1] = 0.0
    with Bufs(vk_device) as b:
        out = b.of(np.full((T, H * D), 5.0, np.float32))
        step = b.step(pos=0, n_tokens=n)
        recs = b.of(rec)
        run(
            vk_device,
            lambda cl: ops_attention.combine_splits(
                cl, vk_device, step, recs, out, head_dim=D, n_heads=H, splits=S, max_tokens=T
            ),
        )
        got = b.read(out, np.float32, (T, H, D))
    assert np.all(got[n:] == 5.0)
    assert np.all(got[2, 1] == 0.0)
    assert nmse(got[:n], want[:n]) < 1e-12


def test_prefill_split_rule(monkeypatch):
    """prefill_splits (device-free): chunks of too few query blocks split up to ~128 workgroups,
    at most 8 ways and as far as the records fit their scratch; the variable forces a count or is
    refused with a message."""
    monkeypatch.delenv("PHOENIX_VULKAN_ATTN_SPLITS", raising=False)
    rule = ops_attention.prefill_splits
    assert rule(512, 8, 4, 256) == 2  # 4B: 16 blocks x 4 head pairs = 64 workgroups
    assert rule(512, 32, 16, 128) == 1  # 27B: 256 workgroups already
    assert rule(512, 4, 1, 256) == 4  # 270M / 1B: 32 workgroups
    assert rule(512, 16, 8, 256) == 1  # 12B: 128
    assert rule(8, 32, 16, 128) == 8  # a few-token forward: 16 workgroups, 8 ways at most
    assert ops_attention.split_record_bytes(512, 8, 256, 4) <= ops_attention.ATTN_SPLIT_BYTES
    monkeypatch.setenv("PHOENIX_VULKAN_ATTN_SPLITS", "3")
    assert rule(512, 32, 16, 128) == 3
    # records over the scratch: fewer ways (1 024 tokens x 32 heads x 260 floats is 34 MB a way)
    monkeypatch.setenv("PHOENIX_VULKAN_ATTN_SPLITS", "8")
    assert rule(256, 32, 16, 256) == 3
    assert rule(1024, 32, 16, 256) == 1
    for bad in ("0", "9", "two"):
        monkeypatch.setenv("PHOENIX_VULKAN_ATTN_SPLITS", bad)
        with pytest.raises(ValueError, match="PHOENIX_VULKAN_ATTN_SPLITS"):
            rule(512, 8, 4, 256)


@pytest.mark.parametrize("kernel", ["scalar", "coopmat"])
def test_attention_prefill_second_slot(vk_device, kernel):
    """A sequence in KV slot 1 reads its own slot's cache (step.slot)."""
    if kernel == "coopmat":
        need_coopmat(vk_device, 128)
    err = check_prefill(vk_device, 128, 8, 4, 24, 24 + 16, 40, 15, 16, kernel=kernel, slot=1)
    assert err < (CM_NMSE if kernel == "coopmat" else 1e-9)


SPANS_CASES = [  # D, H, KV, window, slots, pos0, n_tokens, (picture's first, last token)
    (256, 4, 1, 512, 512 + 80, 3, 70, (5, 60)),  # a picture inside the chunk
    (128, 8, 4, 16, 16 + 80, 100, 70, (2, 40)),  # a picture longer than the window
]


@pytest.mark.parametrize("kernel", ["scalar", "coopmat"])
@pytest.mark.parametrize("D,H,KV,window,slots,pos0,n_tokens,span", SPANS_CASES)
def test_attention_prefill_spans(vk_device, kernel, D, H, KV, window, slots, pos0, n_tokens, span):
    """ATTN_SPANS: a picture's tokens see each other both ways, text tokens causally."""
    if kernel == "coopmat":
        need_coopmat(vk_device, D)
    vis = np.arange(pos0, pos0 + n_tokens)
    vis[span[0] : span[1] + 1] = pos0 + span[1]
    err = check_prefill(vk_device, D, H, KV, window, slots, pos0, n_tokens, n_tokens, kernel=kernel, vis=vis)
    assert err < (CM_NMSE if kernel == "coopmat" else 1e-9)


def test_prefill_kernel_choice(vk_device, monkeypatch):
    """The coopmat kernel where the device has cooperative matrices and the head_dim is built,
    the switch forces the scalar one, a forced coopmat kernel on a device without refuses."""
    dev = vk_device
    assert ops_attention.prefill_kernel(dev, 96) == "scalar"
    assert "head_dim 96" in ops_attention.prefill_path(dev, 96) or not dev.caps.cooperative_matrix
    want = "coopmat" if ops_attention.prefill_refusal(dev, 256) is None else "scalar"
    assert ops_attention.prefill_kernel(dev, 256) == want
    monkeypatch.setenv("PHOENIX_VULKAN_ATTN_COOPMAT", "0")
    assert ops_attention.prefill_kernel(dev, 256) == "scalar"
    if dev.caps.cooperative_matrix:
        assert ops_attention.prefill_refusal(dev, 256) == "disabled by PHOENIX_VULKAN_ATTN_COOPMAT=0"
    with Bufs(dev) as b:
        x = b.of(np.zeros(4, np.float32))
        with pytest.raises(ValueError, match="no coopmat kernel"):
            attention_prefill(
                dev.commands(),
                dev,
                x,
                x,
                x,
                x,
                x,
                head_dim=256,
                n_heads=4,
                n_kv_heads=1,
                cache_slots=8,
                window=0,
                scale=1.0,
                max_tokens=1,
                kernel="coopmat",
            )


def test_prefill_refusal_rules():
    """prefill_refusal on made-up devices: each limit with its reason."""
    from types import SimpleNamespace

    def dev(**kw):
        caps = dict(
            cooperative_matrix=True,
            refused={},
            subgroup_size=32,
            max_workgroup_invocations=1024,
            shared_memory=48 << 10,
        )
        return SimpleNamespace(caps=SimpleNamespace(**{**caps, **kw}))

    assert ops_attention.prefill_refusal(dev(), 256) is None
    assert ops_attention.prefill_refusal(dev(), 128) is None
    assert ops_attention.prefill_refusal(dev(cooperative_matrix=False), 256) == "no cooperative matrices"
    assert "head_dim 80" in ops_attention.prefill_refusal(dev(), 80)
    assert "maxComputeWorkGroupInvocations" in ops_attention.prefill_refusal(dev(subgroup_size=256), 256)
    assert "shared memory" in ops_attention.prefill_refusal(dev(shared_memory=32 << 10), 128)
    assert ops_attention.prefill_refusal(dev(shared_memory=32 << 10), 256) is None  # 31 KiB at 256
    assert [ops_attention.heads_per_group(h, kv) for h, kv in ((4, 1), (8, 4), (32, 16), (16, 1), (6, 2))] == [
        4,
        2,
        2,
        8,
        1,
    ]
