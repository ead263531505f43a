"""RMSNorm kernels against numpy (f32, Gemma's (1 + w) multiplier handed over as w)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.backends.vulkan.ops_norm import norm, norm_add


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
    x = (rng.standard_normal((rows, n)) * 50).astype(np.float32)   # large: f16 would overflow x^2
    w = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    bx, bw, bo = _buf(dev, x), _buf(dev, w), dev.buffer(x.nbytes)
    cl = dev.commands()
    norm(cl, dev, bx, bw, bo, rows=rows, n=n, eps=1e-6)
    cl.end()
    cl.submit(wait=True)
    got = dev.download(bo, np.float32, (rows, n))
    assert nmse(got, rmsnorm(x, w, 1e-6)) < 1e-10


@pytest.mark.parametrize("rows,n", [(1, 640), (4, 2560), (3, 333)])
def test_norm_add(vk_device, rows, n):
    dev = vk_device
    rng = np.random.default_rng(7 + rows + n)
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    res = (rng.standard_normal((rows, n)) * 300).astype(np.float32)   # residual streams grow large
    w1 = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    w2 = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    bx, bw1, br, bw2 = _buf(dev, x), _buf(dev, w1), _buf(dev, res), _buf(dev, w2)
    bo = dev.buffer(x.nbytes)
    cl = dev.commands()
    norm_add(cl, dev, bx, bw1, br, bw2, bo, rows=rows, n=n, eps=1e-6)
    cl.end()
    cl.submit(wait=True)
    want_res = res + rmsnorm(x, w1, 1e-6)
    assert nmse(dev.download(br, np.float32, (rows, n)), want_res) < 1e-10
    assert nmse(dev.download(bo, np.float32, (rows, n)), rmsnorm(want_res, w2, 1e-6)) < 1e-10
