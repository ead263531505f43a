"""Embedding lookup against gguf's dequantize: every table type, ids from the token buffer,
tables bound in several row ranges."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from phoenix_chat.engine.backends.vulkan.memory import RowRange, Tensor, row_ranges
from phoenix_chat.engine.backends.vulkan.ops_embed import embed
from tests.vulkan.ops_helpers import Bufs, nmse, run


@pytest.mark.parametrize("wtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0"])
@pytest.mark.parametrize(
    "hidden,vocab,pos,n_tokens,max_tokens,split_bytes",
    [
        (640, 1000, 0, 1, 1, None),  # decode: one id
        (1152, 700, 9, 5, 7, 64 * 1024),  # prefill chunk, fewer tokens than recorded, 2+ row ranges
        (96, 3001, 3, 4, 4, 8 * 1024),  # many ranges
    ],
)
def test_embed(vk_device, wtype, hidden, vocab, pos, n_tokens, max_tokens, split_bytes):
    dev = vk_device
    rng = np.random.default_rng(hidden + vocab)
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    qt = getattr(GGMLQuantizationType, wtype)
    raw = table if wtype == "F32" else quants.quantize(table, qt)
    deq = table if wtype == "F32" else quants.dequantize(raw, qt).reshape(vocab, hidden)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(vocab, -1)
    row_bytes = raw.shape[1]
    tokens = np.zeros(64, np.uint32)
    ids = rng.integers(0, vocab, n_tokens)
    ids[-1] = vocab - 1  # the last row of the last range
    tokens[pos : pos + n_tokens] = ids
    scale = float(np.float32(np.sqrt(hidden)))
    with Bufs(dev) as b:
        t = Tensor.upload(dev, raw, row_bytes, name="embd")
        if split_bytes:
            align = max(dev.caps.min_storage_offset_alignment, 4)
            t.ranges = [
                RowRange(t.buffer, r * row_bytes, n * row_bytes, r, n)
                for r, n in row_ranges(vocab, row_bytes, split_bytes, align)
            ]
            assert len(t.ranges) >= 2
        b.all.append(t.buffer)
        out = b.of(np.full((max_tokens, hidden), 7.0, np.float32))
        step, tok = b.step(pos=pos, n_tokens=n_tokens), b.of(tokens)
        run(
            dev,
            lambda cl: embed(
                cl, dev, step, tok, t, out, wtype=wtype, hidden=hidden, scale=scale, max_tokens=max_tokens
            ),
        )
        got = b.read(out, np.float32, (max_tokens, hidden))
    want = deq[ids] * scale
    assert nmse(got[:n_tokens], want) < 1e-12
    # rows past step.n_tokens (a bucketed prefill's pad rows) are zeroed, whichever range held the ids
    assert np.all(got[n_tokens:] == 0.0), "rows beyond step.n_tokens must be zeroed"


@pytest.mark.parametrize(
    "wtype", ["Q5_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_1", "Q5_1", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K"]
)
@pytest.mark.parametrize("hidden,vocab,split_bytes", [(512, 900, None), (768, 2000, 32 * 1024)])
def test_embed_more_types(vk_device, wtype, hidden, vocab, split_bytes):
    """Tables in the other GGUF types (random blocks, checked against gguf's dequantize)."""
    from tests.vulkan.test_ops_gemm import random_weight

    dev = vk_device
    rng = np.random.default_rng(hidden + vocab + len(wtype))
    raw, deq = random_weight(wtype, vocab, hidden, rng)
    row_bytes = raw.shape[1]
    pos, n_tokens = 2, 6
    tokens = np.zeros(16, np.uint32)
    ids = rng.integers(0, vocab, n_tokens)
    ids[0], ids[-1] = 0, vocab - 1
    tokens[pos : pos + n_tokens] = ids
    with Bufs(dev) as b:
        t = Tensor.upload(dev, raw, row_bytes, name="embd")
        b.all.append(t.buffer)
        if split_bytes:
            align = max(dev.caps.min_storage_offset_alignment, 4)
            t.ranges = [
                RowRange(t.buffer, r * row_bytes, n * row_bytes, r, n)
                for r, n in row_ranges(vocab, row_bytes, split_bytes, align)
            ]
            assert len(t.ranges) >= 2
        out = b.zeros(4 * n_tokens * hidden)
        step, tok = b.step(pos=pos, n_tokens=n_tokens), b.of(tokens)
        run(
            dev,
            lambda cl: embed(cl, dev, step, tok, t, out, wtype=wtype, hidden=hidden, scale=2.0, max_tokens=n_tokens),
        )
        got = b.read(out, np.float32, (n_tokens, hidden))
    assert nmse(got, deq[ids] * 2.0) < 1e-12
