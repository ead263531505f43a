"""The int8 prefill GEMMs (shaders/gemm_int8.comp on the int8 dot, shaders/gemm_coopmat_int8.comp
on int8 cooperative matrices) against numpy: every int8 weight type, every tile, odd token and row
counts (not multiples of the tiles), the GEGLU epilogue, y strides and offsets, a weight bound in
row ranges, and the refusals (no int dot, a K the tile's step does not divide, no xq, a type the
matrix-core tiles do not fold).

The reference is exact up to f32 rounding: `gguf.quants.dequantize` of the weight bytes the kernel
reads times x's q8_1 blocks as the quantize dispatch wrote them (decoded here), in f64 — so any
error beyond accumulation order is the kernel's. The int8-dot tiles run on lavapipe in CI (it has
the int8 dot); the matrix-core ones need a GPU with s8 cooperative matrices (the H100) and skip
elsewhere, saying why.
"""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.ops_gemm import (
    CM8_KERNELS,
    INT8_KERNELS,
    INT8_TYPES,
    gemm,
    int8_refusal,
    int8_tile,
    kernel,
)
from phoenix_chat.engine.backends.vulkan.ops_table import CM8_TYPES
from tests.vulkan.ops_helpers import Bufs, nmse, run
from tests.vulkan.test_matvec_cols import quantized_x
from tests.vulkan.test_ops_gemm import bound_in_row_ranges, gelu_tanh, random_weight

EXACT_NMSE = 1e-10  # f32 accumulation of exact int8 products against the f64 sum
TILES = pytest.mark.parametrize("kern", INT8_KERNELS)


@pytest.fixture(autouse=True)
def _int_dot(vk_device, monkeypatch):
    if not vk_device.caps.int_dot:
        pytest.skip(f"{vk_device.name} has no shaderIntegerDotProduct")
    monkeypatch.setenv("PHOENIX_VULKAN_CM8", "1")  # the int8 matrix-core tiles are opt-in


def fits(dev, kern, geglu=False, wtype="Q4_0"):
    """Skip a tile the device cannot run (lavapipe: 32 KiB of shared memory, no cooperative
    matrices; the H100 runs them all) or a type a matrix-core tile does not fold, after checking
    the refusal says so."""
    if kern in CM8_KERNELS and wtype not in CM8_TYPES:
        why = int8_refusal(dev, wtype, 256, kern, geglu)
        assert why is not None
        pytest.skip(f"{kern}: {why}")
    if int8_tile(kern, geglu) and int8_refusal(dev, "Q4_0", 256, kern, geglu) is not None:
        pytest.skip(f"{kern}: {int8_refusal(dev, 'Q4_0', 256, kern, geglu)} on {dev.name}")


def check(dev, wtype, m, n, k, kern, seed, *, geglu=False, y_stride=None, y_off=0):
    fits(dev, kern, geglu, wtype)
    rng = np.random.default_rng(seed)
    raw, w = random_weight(wtype, n, k, rng)
    raw_up, w_up = random_weight(wtype, n, k, rng) if geglu else (None, None)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 4.0, (m, 1))).astype(np.float32)
    ys = y_stride or n
    with Bufs(dev) as b:
        xq, xv = quantized_x(dev, x)
        b.all.append(xq)
        bx, bw, by = b.of(x), b.of(raw.reshape(-1)), b.zeros(4 * m * ys)
        bu = b.of(raw_up.reshape(-1)) if geglu else None
        yb = (by, 4 * y_off, by.size - 4 * y_off)  # the product's columns start at y_off
        run(
            dev,
            lambda cl: gemm(
                cl, dev, bx, bw, yb, wtype=wtype, m=m, n=n, k=k, y_stride=ys, w_up=bu, kernel_name=kern, xq=xq
            ),
        )
        got = b.read(by, np.float32, (m, ys))
    want = xv @ w.T if not geglu else gelu_tanh(xv @ w.T) * (xv @ w_up.T)
    assert nmse(got[:, y_off : y_off + n], want) < EXACT_NMSE
    rest = np.delete(got, np.s_[y_off : y_off + n], axis=1)
    assert not rest.any()  # nothing written outside the product's columns


@pytest.mark.parametrize("wtype", INT8_TYPES)
@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (37, 100, 512), (70, 130, 768)])
@TILES
def test_int8_gemm(vk_device, wtype, m, n, k, kern):
    check(vk_device, wtype, m, n, k, kern, seed=m * 131 + n + k)


@pytest.mark.parametrize("wtype", ["Q4_0", "Q8_0", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS", "Q5_K"])
@TILES
def test_int8_gemm_geglu_strides_offsets(vk_device, wtype, kern):
    check(vk_device, wtype, 19, 96, 256, kern, seed=5, geglu=True, y_stride=96 + 64 + 7, y_off=64)  # 256 B: aligned


@TILES
def test_int8_gemm_row_ranges(vk_device, kern):
    """A weight bound in pieces (as tensors beyond maxStorageBufferRange are): one dispatch per range."""
    dev = vk_device
    fits(dev, kern)
    rng = np.random.default_rng(9)
    m, n, k = 9, 300, 256
    raw, w = random_weight("Q4_0", n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    with Bufs(dev) as b:
        xq, xv = quantized_x(dev, x)
        b.all.append(xq)
        t = bound_in_row_ranges(dev, b, raw, n)
        bx, by = b.of(x), b.zeros(4 * m * n)
        run(dev, lambda cl: gemm(cl, dev, bx, t, by, wtype="Q4_0", m=m, n=n, k=k, kernel_name=kern, xq=xq))
        got = b.read(by, np.float32, (m, n))
    assert nmse(got, xv @ w.T) < EXACT_NMSE


def test_int8_gemm_refusals(vk_device):
    dev = vk_device
    with Bufs(dev) as b:
        bx, by, bw = b.zeros(4 * 32 * 96), b.zeros(4 * 32 * 64), b.zeros(18 * 64 * 3)
        cl = dev.commands()
        try:
            with pytest.raises(ValueError, match="pass xq"):
                gemm(cl, dev, bx, bw, by, wtype="Q4_0", m=32, n=64, k=96, kernel_name="int8_1")
            # a K step of 64 values does not divide k = 96
            assert int8_tile("int8", False)[2] == 64
            with pytest.raises(ValueError, match="not a multiple of the tile's K step 64"):
                gemm(cl, dev, bx, bw, by, wtype="Q4_0", m=32, n=64, k=96, kernel_name="int8", xq=bx)
            with pytest.raises(ValueError, match="F16 has no int8 unpacking"):
                gemm(cl, dev, bx, bw, by, wtype="F16", m=32, n=64, k=96, kernel_name="int8_1", xq=bx)
        finally:
            cl.destroy()
    assert int8_refusal(dev, "Q4_0", 96, "int8_1", False) is None  # a K step of 32 divides it
    if dev.caps.coopmat_int8_k:
        assert "built for" in int8_refusal(dev, "Q6_K", 256, "cm8_8", False)
        assert int8_refusal(dev, "Q4_K", 256, "cm8_8", False) is None
    else:  # says why: the device's own refusal of int8 cooperative matrices
        assert int8_refusal(dev, "Q4_0", 256, "cm8_8", False) == dev.caps.refused["cooperative_matrix_int8"]


@pytest.fixture(scope="module")
def tiny_weights(open_tiny):
    return open_tiny("q4_0", seed=3)


def every_product_on(be, shapes, kn):
    """Every weight shape's products through GEMM `kn`, in every forward: an all-logits forward
    runs 32-token chunks, which a GPU's tuning may give to the few-token tile or the multi-column
    matvecs instead (lavapipe tunes nothing)."""
    be.tuning.gemm_kernels = dict.fromkeys(shapes, kn)
    be.tuning.gemm_kernels_few = {}
    be.tuning.gemm_kernel_few = None
    be.tuning.few_token_int8 = frozenset()
    be.tuning.few_token_matvec = frozenset()
    be.drop_recordings()


@pytest.mark.parametrize("family", ["int8-dot", "int8 matrix cores"])
def test_prefill_through_int8_tiles_matches_the_f32_kernel_and_cpu(tiny_weights, vk_device, family):
    """The graph's prefill with every weight shape on an int8 tile (as the load-time timing picks
    where they win; lavapipe times nothing, so the choice is set here): x is quantized once per
    group of products sharing it, and the logits agree with the device's f32 kernel and the CPU."""
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.gemm_tuning import model_shapes

    ids = np.random.default_rng(2).integers(3, 4096, 60).tolist()
    be = VulkanBackend(tiny_weights, 64, device=vk_device)
    try:
        # the reference: every shape on the device's own float kernel (the load-time timing may
        # already have put some on int8 tiles: on the H100 it does)
        shapes = model_shapes(be.graph)
        every_product_on(be, shapes, kernel(vk_device))
        f32_all = be.forward(ids, 0, all_logits=True)
        dot_kernels = tuple(k for k in INT8_KERNELS if k not in CM8_KERNELS)
        family_kernels = CM8_KERNELS if family == "int8 matrix cores" else dot_kernels
        tile = next(
            (
                kn
                for kn in family_kernels
                if all(
                    int8_refusal(vk_device, mats[0].qtype.name, cols, kn, len(mats) == 2) is None
                    for mats, cols in shapes.values()
                )
            ),
            None,
        )
        if tile is None:
            pytest.skip(f"no {family} tile runs here: {int8_refusal(vk_device, 'Q4_0', 256, family_kernels[0], False)}")
        every_product_on(be, shapes, tile)
        i8_all = be.forward(ids, 0, all_logits=True)
        assert be.stats()["gemm_kernels"] == dict.fromkeys(shapes, tile)
    finally:
        be.close()
    cpu = CpuBackend(tiny_weights, 64).forward(ids, 0, all_logits=True)
    scale = np.abs(cpu).max()
    print(f"\n{tile} vs f32: max |diff| {np.abs(i8_all - f32_all).max():.5f} (logit scale {scale:.2f})")
    assert not np.array_equal(i8_all, f32_all)  # the int8 tiles really ran (q8_1 x rounds differently)
    assert np.mean(i8_all.argmax(-1) == f32_all.argmax(-1)) >= 0.98
    assert np.mean(i8_all.argmax(-1) == cpu.argmax(-1)) >= 0.98
    np.testing.assert_allclose(i8_all, f32_all, atol=2e-2 * scale)
