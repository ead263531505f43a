"""RMSNorm kernels against numpy (f32, Gemma's (1 + w) multiplier handed over as w)."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.ops_norm import norm, norm_add


def rmsnorm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def nmse(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b * b), 1e-30))


def _buf(dev, arr):
    b = dev.buffer(max(arr.nbytes, 4))
    dev.upload(b, arr)
    return b


@pytest.mark.parametrize("rows,n", [(1, 640), (3, 1152), (5, 1000), (2, 5376), (1, 7)])
def test_norm(vk_device, rows, n):
    dev = vk_device
    rng = np.random.default_rng(rows * 1000 + n)
    x = (rng.standard_normal((rows, n)) * 50).astype(np.float32)  # large: f16 would overflow x^2
    w = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    bx, bw, bo = _buf(dev, x), _buf(dev, w), dev.buffer(x.nbytes)
    cl = dev.commands()
    norm(cl, dev, bx, bw, bo, rows=rows, n=n, eps=1e-6)
    cl.end()
    cl.submit(wait=True)
    got = dev.download(bo, np.float32, (rows, n))
    assert nmse(got, rmsnorm(x, w, 1e-6)) < 1e-10


# wg None: the size ops_norm picks, row in registers (norm_row.glsl); 64: rows of 640+ exceed
# 8 elements per invocation, so the three-pass path runs
WGS = pytest.mark.parametrize("wg", [None, 64], ids=["regs", "passes"])


@pytest.mark.parametrize("rows,n", [(1, 640), (4, 2560), (3, 333), (1, 5376)])
@WGS
def test_norm_add(vk_device, rows, n, wg):
    dev = vk_device
    rng = np.random.default_rng(7 + rows + n)
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    res = (rng.standard_normal((rows, n)) * 300).astype(np.float32)  # residual streams grow large
    w1 = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    w2 = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    bx, bw1, br, bw2 = _buf(dev, x), _buf(dev, w1), _buf(dev, res), _buf(dev, w2)
    bo = dev.buffer(x.nbytes)
    cl = dev.commands()
    norm_add(cl, dev, bx, bw1, br, bw2, bo, rows=rows, n=n, eps=1e-6, wg=wg)
    cl.end()
    cl.submit(wait=True)
    want_res = res + rmsnorm(x, w1, 1e-6)
    assert nmse(dev.download(br, np.float32, (rows, n)), want_res) < 1e-10
    assert nmse(dev.download(bo, np.float32, (rows, n)), rmsnorm(want_res, w2, 1e-6)) < 1e-10


def _quantize_rows(dev, out_buf, rows, n):
    """q8_1 of each row of out_buf by quantize_q8_1.comp (the reference the fused variant must equal)."""
    from phoenix_chat.engine.backends.vulkan.matvec import q8_1_bytes, record_quantize

    nb = -(-n // 32)
    got = []
    for r in range(rows):
        xq = dev.buffer(q8_1_bytes(n))
        cl = dev.commands()
        record_quantize(cl, dev, out_buf, xq, n, x_off=r * n)
        cl.end()
        cl.submit(wait=True)
        got.append(dev.download(xq, np.uint32, (nb * 10,)))
        cl.destroy()
        xq.destroy()
    return np.stack(got)


@pytest.mark.parametrize("add", [False, True], ids=["norm", "norm_add"])
@pytest.mark.parametrize("rows,n", [(1, 640), (3, 1152), (2, 1000), (1, 5376), (3, 7), (2, 333)])
@WGS
def test_norm_writes_q8_1_bit_identical(vk_device, add, rows, n, wg):
    """The *_q8_1 variants: the same f32 output, plus q8_1 blocks equal bit for bit to running
    quantize_q8_1 on that output (odd n: the last block of each row zero-padded)."""
    from phoenix_chat.engine.backends.vulkan.matvec import q8_1_bytes

    dev = vk_device
    rng = np.random.default_rng(11 * rows + n + add)
    x = (rng.standard_normal((rows, n)) * 20).astype(np.float32)
    res = (rng.standard_normal((rows, n)) * 300).astype(np.float32)
    x[0, : min(n, 40)] = res[0, : min(n, 40)] = 0.0  # an all-zero output block: d = 0, q = 0
    w1 = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    w2 = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    outs = []
    for fused in (False, True):
        bx, bw1, br, bw2, bo = _buf(dev, x), _buf(dev, w1), _buf(dev, res), _buf(dev, w2), dev.buffer(x.nbytes)
        bq = dev.buffer(rows * q8_1_bytes(n)) if fused else None
        cl = dev.commands()
        if add:
            norm_add(cl, dev, bx, bw1, br, bw2, bo, rows=rows, n=n, eps=1e-6, q=bq, wg=wg)
        else:
            norm(cl, dev, bx, bw1, bo, rows=rows, n=n, eps=1e-6, q=bq)
        cl.end()
        cl.submit(wait=True)
        cl.destroy()
        o = dev.download(bo, np.float32, (rows, n))
        q = dev.download(bq, np.uint32, (rows, -(-n // 32) * 10)) if fused else _quantize_rows(dev, bo, rows, n)
        outs.append((o, dev.download(br, np.float32, (rows, n)), q))
        for b in (bx, bw1, br, bw2, bo, bq):
            if b is not None:
                b.destroy()
    (o0, r0, q0), (o1, r1, q1) = outs
    np.testing.assert_array_equal(o1, o0)
    np.testing.assert_array_equal(r1, r0)
    np.testing.assert_array_equal(q1, q0)
    blocks = q1.reshape(rows, -1, 10)
    assert np.all(blocks[0, 0, 8] == 0) and np.any(blocks[..., 8] != 0)  # the zero block, and real scales


@pytest.mark.parametrize("n", [640, 2560, 5376, 1000, 333, 7])
@pytest.mark.parametrize("wg", [None, 64], ids=["one_pass", "passes"])
def test_norm_add_split(vk_device, n, wg):
    """Decode's norm_add over many workgroups (the second norm's sum of squares from the
    expansion of (res + a)^2): the numpy norm_add on residual out and h, the residual in left
    as it was, and q8_1 blocks bit-identical to quantize_q8_1 of its own h."""
    from phoenix_chat.engine.backends.vulkan.matvec import q8_1_bytes
    from phoenix_chat.engine.backends.vulkan.ops_norm import norm_add_split

    dev = vk_device
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    res = (rng.standard_normal(n) * 300).astype(np.float32)
    zero = n > 64
    if zero:
        x[:40] = res[:40] = 0.0  # an all-zero h block: d = 0, q = 0
    w1 = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    w2 = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    bx, bw1, br, bw2 = _buf(dev, x), _buf(dev, w1), _buf(dev, res), _buf(dev, w2)
    bo, br2, bq = dev.buffer(x.nbytes), dev.buffer(x.nbytes), dev.buffer(q8_1_bytes(n))
    cl = dev.commands()
    norm_add_split(cl, dev, bx, bw1, br, bw2, bo, br2, n=n, eps=1e-6, q=bq, wg=wg)
    cl.end()
    cl.submit(wait=True)
    want_res = res + rmsnorm(x, w1, 1e-6)
    h = dev.download(bo, np.float32, (1, n))
    np.testing.assert_array_equal(dev.download(br, np.float32, (n,)), res)
    assert nmse(dev.download(br2, np.float32, (n,)), want_res) < 1e-10
    assert nmse(h, rmsnorm(want_res, w2, 1e-6)) < 1e-10
    q = dev.download(bq, np.uint32, (-(-n // 32) * 10,))
    np.testing.assert_array_equal(q, _quantize_rows(dev, bo, 1, n)[0])
    assert (q[8] == 0) == zero and np.any(q.reshape(-1, 10)[:, 8] != 0)
    with pytest.raises(ValueError):
        norm_add_split(cl, dev, bx, bw1, br, bw2, bo, br, n=n, eps=1e-6)
