"""Prefill GEMM against numpy over gguf's dequantize: every weight type, odd token counts and
column counts (not multiples of the tiles), GEGLU epilogue, strides, row-range binding — for
every kernel: the f32 shared-memory GEMM and the CPU devices' register-tiled one everywhere
(either runs on any device), the cooperative-matrix one (f16 operands, so a looser threshold)
where the device has VK_KHR_cooperative_matrix (not lavapipe: those cases skip there and run on
a real GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from phoenix_chat.engine.backends.vulkan.codebooks import grid_prefix
from phoenix_chat.engine.backends.vulkan.memory import RowRange, Tensor, row_ranges
from phoenix_chat.engine.backends.vulkan.ops_gemm import (
    CF_TILES,
    INT8_KERNELS,
    KERNELS,
    cf_direct_layout,
    cf_refusal,
    coopmat_ok,
    fragment_pairs,
    gemm,
    is_coopmat,
    kernel,
)
from tests.vulkan.ops_helpers import Bufs, nmse, run
from tools.make_synthetic_gguf import random_blocks


def random_weight(wtype, rows, cols, rng):
    """(raw bytes [rows, row_bytes], dequantized f32 [rows, cols]) of a random matrix."""
    qt = getattr(GGMLQuantizationType, wtype)
    if wtype in ("F32", "F16", "BF16"):
        w = (rng.standard_normal((rows, cols)) * 0.5).astype(np.float32)
        raw = w if wtype == "F32" else quants.quantize(w, qt)
    else:
        block, _size = GGML_QUANT_SIZES[qt]
        raw = random_blocks(qt, rows * cols // block, rng).reshape(rows, -1)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    deq = quants.dequantize(raw, qt).reshape(rows, cols).astype(np.float64)
    return raw, deq


def on_device(wtype, raw):
    """The bytes as a weight buffer holds them: a codebook type's grid first (WeightMatrix.upload)."""
    grid = np.frombuffer(grid_prefix(getattr(GGMLQuantizationType, wtype)), dtype=np.uint8)
    return np.concatenate([grid, raw.reshape(-1)])


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q4_K"]
TYPES += ["IQ3_XXS", "IQ3_S", "IQ2_XS", "IQ2_S"]  # codebook types: the grid at the start of the binding
TYPES += ["Q5_K", "Q6_K"]
# the f32-input kernels (the int8 ones read q8_1 x: tests/vulkan/test_gemm_int8.py)
EVERY_KERNEL = pytest.mark.parametrize("kern", [k for k in KERNELS if k not in INT8_KERNELS])


def limit(dev, kern: str, wtype: str = "Q8_0", k: int = 256, geglu: bool = False) -> float:
    """NMSE bound: f32 end to end, or f16 operands (~2^-11 relative rounding of x and W). The
    few-token tiles (gemm_coopmat_few.comp) skip, saying why, where they refuse the product."""
    if kern in CF_TILES:
        why = cf_refusal(dev, wtype, k, kern, geglu)
        if why is not None:
            pytest.skip(f"{kern}: {why}")
        return 1e-5
    if is_coopmat(kern) and not coopmat_ok(dev):
        pytest.skip(f"{dev.name} has no VK_KHR_cooperative_matrix f16 16x16x16")
    return 1e-5 if is_coopmat(kern) else 1e-10


def check_gemm(dev, wtype: str, m: int, n: int, k: int, kern: str, seed: int) -> None:
    """y = x W^T for random x (m x k) and W (n x k in wtype's blocks), against float64."""
    bound = limit(dev, kern, wtype, k)
    rng = np.random.default_rng(seed)
    raw, w = random_weight(wtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    with Bufs(dev) as b:
        bx, bw, by = b.of(x), b.of(on_device(wtype, raw)), b.zeros(4 * m * n)
        run(dev, lambda cl: gemm(cl, dev, bx, bw, by, wtype=wtype, m=m, n=n, k=k, kernel_name=kern))
        got = b.read(by, np.float32, (m, n))
    assert nmse(got, x.astype(np.float64) @ w.T) < bound


@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (37, 100, 512), (70, 130, 768)])
@EVERY_KERNEL
def test_gemm(vk_device, wtype, m, n, k, kern):
    check_gemm(vk_device, wtype, m, n, k, kern, seed=m * 131 + n + k)


@pytest.mark.parametrize(
    "wtype", ["F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "Q5_1", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "IQ3_S", "IQ2_XS"]
)
@EVERY_KERNEL
def test_gemm_geglu_strides(vk_device, wtype, kern):
    dev = vk_device
    m, n, k = 19, 96, 256
    bound = limit(dev, kern, wtype, k, geglu=True)
    rng = np.random.default_rng(5)
    rg, wg = random_weight(wtype, n, k, rng)
    ru, wu = random_weight(wtype, n, k, rng)
    x = rng.standard_normal((m, k + 8)).astype(np.float32)  # x rows padded: x_stride = k + 8
    with Bufs(dev) as b:
        bx, bg, bu, by = b.of(x), b.of(on_device(wtype, rg)), b.of(on_device(wtype, ru)), b.zeros(4 * m * (n + 3))
        run(
            dev,
            lambda cl: gemm(
                cl,
                dev,
                bx,
                bg,
                by,
                wtype=wtype,
                m=m,
                n=n,
                k=k,
                x_stride=k + 8,
                y_stride=n + 3,
                w_up=bu,
                kernel_name=kern,
            ),
        )
        got = b.read(by, np.float32, (m, n + 3))
    xs = x[:, :k].astype(np.float64)
    assert nmse(got[:, :n], gelu_tanh(xs @ wg.T) * (xs @ wu.T)) < bound
    assert not got[:, n:].any()


def bound_in_row_ranges(dev, b, raw, n):
    """The weight rows uploaded as one tensor bound in ranges of at most 100 rows (at least three),
    as tensors beyond maxStorageBufferRange are; its buffer joins `b` (a Bufs) to be freed."""
    t = Tensor.upload(dev, raw, raw.shape[1])
    b.all.append(t.buffer)
    align = max(dev.caps.min_storage_offset_alignment, 4)
    t.ranges = [
        RowRange(t.buffer, r * t.row_bytes, c * t.row_bytes, r, c)
        for r, c in row_ranges(n, t.row_bytes, 100 * t.row_bytes, align)
    ]
    assert len(t.ranges) >= 3
    return t


@EVERY_KERNEL
def test_gemm_row_ranges(vk_device, kern):
    """A weight bound in pieces (as tensors beyond maxStorageBufferRange are): one dispatch per range."""
    dev = vk_device
    bound = limit(dev, kern)
    rng = np.random.default_rng(9)
    m, n, k = 9, 300, 256
    raw, w = random_weight("Q8_0", n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    with Bufs(dev) as b:
        t = bound_in_row_ranges(dev, b, raw, n)
        bx, by = b.of(x), b.zeros(4 * m * n)
        run(dev, lambda cl: gemm(cl, dev, bx, t, by, wtype="Q8_0", m=m, n=n, k=k, kernel_name=kern))
        got = b.read(by, np.float32, (m, n))
    assert nmse(got, x.astype(np.float64) @ w.T) < bound


@pytest.mark.parametrize("wtype", ["Q4_0", "Q4_K", "Q6_K"])
@EVERY_KERNEL
def test_gemm_several_tiles(vk_device, wtype, kern):
    """More tokens and columns than one 128 x 128 tile, neither a multiple of it."""
    check_gemm(vk_device, wtype, 150, 260, 256, kern, seed=21)


def test_cpu_devices_get_the_register_tiled_kernel(vk_device):
    """lavapipe takes gemm_lanes.comp (a CPU pays for shared memory and barriers lane by lane);
    a GPU takes the shared-memory or matrix-core kernel."""
    expected = "lanes" if vk_device.caps.is_software else ("coopmat" if coopmat_ok(vk_device) else "tiled")
    assert kernel(vk_device) == expected


@pytest.mark.parametrize("wtype", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("n", [3, 5])
@EVERY_KERNEL
def test_gemm_rows_of_odd_block_counts(vk_device, wtype, n, kern):
    """Rows of 3 blocks (54 / 102 B): blocks start on both halves of a word and the binding ends
    mid-word (a kernel reading whole words past its last block would read beyond the binding)."""
    check_gemm(vk_device, wtype, 7, n, 96, kern, seed=31 + n)


@pytest.mark.parametrize("geglu", [False, True])
def test_split_k_reduce_adds_the_splits_in_order(vk_device, geglu):
    """gemm_splitk_reduce.comp, the second half of the split-K few-token tiles (which need matrix
    cores; this half runs anywhere): [split][matrix][token][row] partial sums added per (token,
    row), the GEGLU applied to the two matrices' sums, y written at its stride and column offset."""
    dev = vk_device
    rng = np.random.default_rng(17)
    splits, m, n, y_stride, y_off = 3, 5, 37, 50, 7
    nw = 2 if geglu else 1
    part = rng.standard_normal((splits, nw, m, n)).astype(np.float32)
    with Bufs(dev) as b:
        bp, by = b.of(part), b.zeros(4 * m * y_stride)
        red = dev.pipeline("gemm_splitk_reduce" + ("_geglu" if geglu else ""), WG=256)
        push = red.push.pack(m=m, n=n, k=splits, x_stride=0, y_stride=y_stride, y_off=y_off)
        run(dev, lambda cl: cl.dispatch(red, [bp, by], groups=(-(-(m * n) // 256), 1, 1), push=push))
        got = b.read(by, np.float32, (m, y_stride))
    sums = part.astype(np.float64).sum(axis=0)
    want = gelu_tanh(sums[0]) * sums[1] if geglu else sums[0]
    np.testing.assert_allclose(got[:, y_off : y_off + n], want, rtol=1e-5, atol=1e-5)
    assert not got[:, :y_off].any() and not got[:, y_off + n :].any()


def _pair_layout(pr: int, pk: int) -> np.ndarray:
    """coopmat_fragment_layout.comp's output for a driver with the pair layout (PR, PK)."""
    lane, e = np.arange(32)[:, None], np.arange(8)[None, :]
    n = lane // 4 + 8 * ((pr >> (e // 2)) & 1)
    k = 2 * (lane % 4) + e % 2 + 8 * ((pk >> (e // 2)) & 1)
    return np.append((n * 16 + k).astype(np.float32).ravel(), 8.0)


def test_the_fragment_layout_probe_is_read_as_pairs_or_refused():
    """The CF_DIRECT tiles' layout check (ops_gemm.fragment_pairs): NVIDIA's 16 x 8 x 16 layout
    (measured on the H100: (12, 10)) and any other pair order are read; a layout of another shape,
    or a fragment of another length, refuses the tiles with the reason."""
    assert fragment_pairs(_pair_layout(12, 10)) == (12, 10)
    assert fragment_pairs(_pair_layout(3, 5)) == (3, 5)
    scrambled = _pair_layout(12, 10)
    scrambled[:256] = scrambled[:256].reshape(32, 8)[::-1].ravel()  # lanes in the other order
    assert "not the pair layout" in fragment_pairs(scrambled)
    longer = _pair_layout(12, 10)
    longer[256] = 16.0
    assert "16 elements" in fragment_pairs(longer)


def test_the_direct_tiles_say_why_they_do_not_run(vk_device):
    """Where they cannot run (lavapipe: no cooperative matrices) the CF_DIRECT tiles and their
    layout query say why; a type the tile does not build from (Q8_0 for the others; Q4_K for the
    CF_WIDE ones) is refused by name."""
    layout = cf_direct_layout(vk_device)
    if isinstance(layout, tuple):
        assert "Q4_0" in cf_refusal(vk_device, "Q8_0", 256, "cmd2_4", False)
        assert "Q8_0" in cf_refusal(vk_device, "Q4_K", 256, "cmw1_4", False)  # CF_WIDE: Q4_0's / Q8_0's block pairs
        assert cf_refusal(vk_device, "Q8_0", 256, "cmw1_4", False) is None
        assert cf_refusal(vk_device, "Q4_K", 256, "cpd2_8", False) is None
        return
    assert layout and cf_refusal(vk_device, "Q4_0", 256, "cmw1_4", False) == layout


def test_the_wide_tiles_build_from_q4_0_and_q8_0_the_other_direct_ones_from_q4_0_and_q4_k():
    from phoenix_chat.engine.backends.vulkan.ops_table import CF_DIRECT_TILES, CF_WIDE_TILES, cf_direct_types

    for kn in CF_DIRECT_TILES:
        assert cf_direct_types(kn) == (("Q4_0", "Q8_0") if kn in CF_WIDE_TILES else ("Q4_0", "Q4_K")), kn


def test_phoenix_vulkan_cf_direct_0_refuses_the_register_built_tiles(vk_device, monkeypatch):
    """PHOENIX_VULKAN_CF_DIRECT=0 (for comparisons) refuses exactly the CF_DIRECT tiles, saying so,
    before any layout query; the cached answer of an earlier query does not override it."""
    from phoenix_chat.engine.backends.vulkan import gemm_tuning
    from phoenix_chat.engine.backends.vulkan.ops_table import CF_DIRECT_TILES

    monkeypatch.setenv("PHOENIX_VULKAN_CF_DIRECT", "0")
    assert cf_direct_layout(vk_device) == "disabled by PHOENIX_VULKAN_CF_DIRECT=0"
    if coopmat_ok(vk_device) and vk_device.caps.subgroup_size == 32:
        assert cf_refusal(vk_device, "Q4_0", 256, "cmw1_4", False) == "disabled by PHOENIX_VULKAN_CF_DIRECT=0"
        assert cf_refusal(vk_device, "Q4_0", 256, "cmf1hr", False) is None
    few = set(gemm_tuning.candidates_for(vk_device, "Q4_0", 256, False, few=True))
    assert not few & CF_DIRECT_TILES


def test_lanes_refuses_x_it_cannot_read_as_vec4s(vk_device):
    """gemm_lanes.comp loads x 16 bytes at a time: a row stride off a multiple of 4 floats is
    refused by name before anything is recorded, not read misaligned."""
    dev = vk_device
    m, n, k = 2, 32, 64
    raw, _w = random_weight("Q8_0", n, k, np.random.default_rng(1))
    x = np.zeros((m, k + 2), np.float32)
    with Bufs(dev) as b:
        bx, bw, by = b.of(x), b.of(on_device("Q8_0", raw)), b.zeros(4 * m * n)
        with pytest.raises(ValueError, match="lanes kernel reads x 16 bytes at a time"):
            run(
                dev,
                lambda cl: gemm(cl, dev, bx, bw, by, wtype="Q8_0", m=m, n=n, k=k, x_stride=k + 2, kernel_name="lanes"),
            )
