"""Prefill GEMM: y[m, :] = x[m, :] @ W.T for a chunk of tokens, W quantized.

Four kernels with one contract: shaders/gemm_coopmat.comp on matrix cores (f16 operands, f32
accumulation) where the device has VK_KHR_cooperative_matrix, in several tiles (CM_TILES: "coopmat"
64 tokens x 128 columns per workgroup, "coopmat_l" 128 x 128, "coopmat_ld" the same with two
shared buffers, "coopmat_p"/"_pm" two buffers filled through registers (128 x 128,
64 x 128), "coopmat_w"/"_wp" 4 subgroups
of 64 x 64, "coopmat_m" 32 x 128, "coopmat_s" 32 x 64; the backend picks one for full
prefill chunks and one for a few tokens by timing at load, autotune.choose_gemm_tile);
shaders/gemm_lanes.comp on CPU Vulkan devices (lavapipe: register tiles, no shared memory or
barriers, which a CPU pays for lane by lane); else shaders/gemm.comp (f32 shared-memory
tiles); and two kernels that read x as q8_1 blocks the caller quantizes, weights unpacked to int8
(INT8_KERNELS): shaders/gemm_int8.comp on the packed int8 dot (GPUs with the int8 dot, matrix
cores or not) and, on request (PHOENIX_VULKAN_CM8=1: they lost end to end on the H100), int8
cooperative matrices (CM8_KERNELS: shaders/gemm_coopmat_int8.comp's prefill tiles and
gemm_coopmat_int8_few.comp's few-token ones, for GPUs with 32-lane subgroups and s8 x s8 -> s32
16 x 16 x 32 products); gemm_tuning times their tiles per weight shape beside the others.
For a few tokens (a batched decode step of up to 32 rows, a short turn) the f16 matrix-core tiles
of shaders/gemm_coopmat_few.comp (CF_KERNELS: each subgroup streams its own 16 rows' blocks through
registers two K slabs ahead; split-K tiles add their partial sums with gemm_splitk_reduce.comp)
compete in the few-token timing on GPUs with 32-lane subgroups; PHOENIX_VULKAN_CF=0 turns them off.
The same kernel's prefill tiles (CF_PREFILL_KERNELS: Q4_0 / Q4_K weight fragments built in registers, 32-64
tokens x 128-256 rows a workgroup) compete in the prefill chunk's timing; on the H100 they took
every 27B / 4B product (PHOENIX_VULKAN_CF_DIRECT=0 refuses them, with the few-token CF_DIRECT tiles).
`kernel(dev)` says which one a device gets; PHOENIX_VULKAN_COOPMAT=0 turns the
matrix-core kernel off (for comparisons), and the backend reports the choice in stats().
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from phoenix_chat.engine.backends.vulkan.matvec import record_quantize
from phoenix_chat.engine.backends.vulkan.memory import Binding, Tensor
from phoenix_chat.engine.backends.vulkan.ops_table import (
    CF_DIRECT_TILES,
    CF_PREFILL_TILES,
    CF_RAW_TYPES,
    CF_TILES,
    CF_TYPES,
    CM8_TILES,
    CM8_TYPES,
    CM8F_TILES,
    CM_GEGLU_HALF_N,
    GEMM_TYPES,
    I8_TILES,
    INT8_GEMM_TYPES,
    cf_direct_types,
)
from phoenix_chat.engine.backends.vulkan.pipelines import SUBGROUP_SIZE

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.pipelines import Pipeline
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

TILE = 64  # gemm.comp: 64 tokens x 64 columns
# gemm_coopmat.comp: kernel -> (tokens, columns) per workgroup; the "_m"/"_s" tiles serve a few
# tokens (a short prefill, a batched decode step), where a 64- or 128-token tile computes mostly
# padding and the narrow grid leaves most of a big GPU idle
CM_TILES = {
    "coopmat": (64, 128),
    "coopmat_l": (128, 128),
    "coopmat_ld": (128, 128),  # _l with two shared buffers: the next K step staged during the MMAs
    "coopmat_m": (32, 128),
    "coopmat_s": (32, 64),
    "coopmat_p": (128, 128),  # two shared buffers filled through registers (loads behind the MMAs)
    "coopmat_pm": (64, 128),  # the same, 64 tokens
    "coopmat_w": (128, 128),  # 4 subgroups of 64 x 64 (more products per shared-memory fragment)
    "coopmat_wp": (128, 128),  # _w filled through registers
}
CM_SUBGROUPS = 8  # the most subgroups a tile has (the device check)
CM_TILE_SUBGROUPS = {"coopmat_w": 4, "coopmat_wp": 4}  # the others have CM_SUBGROUPS
# the GEGLU kernels whose tile has half the columns (ops_table.CM_GEGLU_HALF_N)
CM_TILES_GEGLU = {
    name: (tm, tn // 2) for name, (tm, tn) in CM_TILES.items() if name.removeprefix("coopmat") in CM_GEGLU_HALF_N
}
CM_DOUBLE_BUFFERED = ("coopmat_ld", "coopmat_p", "coopmat_pm", "coopmat_wp")  # _ld: not its GEGLU


def cm_shared_bytes(kernel_name: str, geglu: bool) -> int:
    """Shared memory of a matrix-core tile (gemm_coopmat.comp): x and W tiles of 32 + 8 halves a
    row (two of each where double-buffered), and a 16 x 16 f32 output tile per subgroup."""
    tm, tn = CM_TILES_GEGLU.get(kernel_name, CM_TILES[kernel_name]) if geglu else CM_TILES[kernel_name]
    nbuf = 2 if kernel_name in CM_DOUBLE_BUFFERED and not (geglu and kernel_name == "coopmat_ld") else 1
    rows = nbuf * (tm + tn) + (nbuf * tn if geglu else 0)
    return rows * 40 * 2 + CM_TILE_SUBGROUPS.get(kernel_name, CM_SUBGROUPS) * 16 * 16 * 4


# gemm_lanes.comp: columns x tokens per invocation (GEGLU: half the columns, each with two
# weight rows). Measured on lavapipe (2 cores, Gemma 270M shapes, 64 tokens): 16 x 16 runs at
# 1.5-1.7 GMAC/s against 0.22 for gemm.comp; 32 x 32 is ~2x faster again but takes llvmpipe
# minutes to compile (every weight row and token unrolled), 16 x 16 about 6 s once with x read
# as vec4s (12 s read as floats; Mesa's shader cache keeps it, CI's starts empty). 16 x 8 / 8 x 16
# compile in ~3.3 / ~6 s and run a 64-token prefill in 6.2 / 6.8 s against 16 x 16's 4.8-5.0.
LANES_RN, LANES_TM = 16, 16
CM8_KERNELS = (*CM8_TILES, *CM8F_TILES)  # gemm_coopmat_int8.comp, gemm_coopmat_int8_few.comp
# what gemm_coopmat_int8.comp is compiled for: (subgroup size, K of its 16 x 16 x K int8 product) —
# NVIDIA's; RDNA3 (wave64 by default, 16 x 16 x 16 int8) would take variants of its own
CM8_SHAPE = (32, 32)
# why they are off unless asked for: measured on an H100 (docs/PERFORMANCE.md) they lose end to end
CM8_OPT_IN = (
    "off unless PHOENIX_VULKAN_CM8=1: on the H100 they ran prefill products at 0.6-0.8x the f16 "
    "matrix-core tiles, and a 4B batched step of 32 rows through them took 16.6 ms against 14.7 "
    "through the int8 multi-column matvec"
)
INT8_KERNELS = (*I8_TILES, *CM8_KERNELS)  # the kernels that read x as q8_1 blocks (gemm's xq)
INT8_TYPES = INT8_GEMM_TYPES
KERNELS = ("tiled", *CM_TILES, "lanes", *INT8_KERNELS, *CF_TILES)
COOPMAT_KERNELS = tuple(CM_TILES)
CF_KERNELS = tuple(kn for kn in CF_TILES if kn not in CF_PREFILL_TILES)  # gemm_coopmat_few.comp, a few tokens
CF_PREFILL_KERNELS = tuple(kn for kn in CF_TILES if kn in CF_PREFILL_TILES)  # the same kernel's prefill tiles
CF_SUBGROUP = 32  # gemm_coopmat_few.comp: a subgroup's 16 rows x 2 chunks are its lanes' records
CF_KSTEP = 64
# the split-K tiles' partial sums: one device buffer of this size (splits x matrices x tokens x rows
# floats: 4 x 2 x 32 x 32,768 fits), allocated on first use and kept until the device closes
CF_SPLIT_BYTES = 32 << 20


def cf_tile(kernel_name: str) -> tuple[int, int]:
    """(tokens, weight rows) per workgroup of a gemm_coopmat_few.comp tile (ops_table.CF_TILES)."""
    ft, nsg, _raw, _splits, _kc = CF_TILES[kernel_name]
    return 16 * ft, 16 * nsg


def cf_shared_bytes(kernel_name: str, geglu: bool) -> int:
    """Shared memory of a gemm_coopmat_few.comp tile (few-token or prefill): two slabs of x and
    each subgroup's weight rows (f16, 72 halves a row), a 16 x 16 f32 output tile per subgroup, and
    the raw copy of each subgroup's blocks (Q4_0 / Q8_0: at most 68 bytes a row); the CF_DIRECT
    tiles keep no weights there."""
    ft, nsg, _raw, _splits, kc = CF_TILES[kernel_name]
    if kernel_name in CF_DIRECT_TILES:
        return 2 * 16 * ft * (128 * kc + 16) + nsg * 1024
    nw = 2 if geglu else 1
    return (2 * 16 * ft + nsg * nw * 16) * (128 * kc + 16) + nsg * 1024 + nsg * nw * 16 * 68 * kc


def cf_subgroup(dev: Device) -> dict[str, int] | str:
    """How the gemm_coopmat_few.comp tiles (and their layout query) get CF_SUBGROUP lanes here: {}
    where that is the driver's own size (NVIDIA), {SUBGROUP_SIZE: 32} where it can be asked for
    through VK_EXT_subgroup_size_control (RADV runs RDNA3 compute in wave64 unless told: without
    the ask, a 780M had none of these tiles), or why neither."""
    c = dev.caps
    if c.subgroup_size == CF_SUBGROUP:
        return {}
    if CF_SUBGROUP in c.compute_subgroup_sizes:
        return {SUBGROUP_SIZE: CF_SUBGROUP}
    return (
        f"subgroup size {c.subgroup_size}: the gemm_coopmat_few.comp tiles are compiled for {CF_SUBGROUP} "
        f"lanes, which this device cannot be asked for (sizes allowed: {list(c.compute_subgroup_sizes) or 'none'})"
    )


def cf_refusal(dev: Device, wtype: str, k: int, kernel_name: str, geglu: bool, m: int = 0, n: int = 0) -> str | None:
    """Why the gemm_coopmat_few.comp tile `kernel_name` (few-token or prefill) cannot run this product here
    (PHOENIX_VULKAN_CF=0 turns them off, for comparisons); with the product's m x n, also where a
    split-K tile's partial sums would not fit the CF_SPLIT_BYTES scratch."""
    if os.environ.get("PHOENIX_VULKAN_CF", "1") == "0":
        return "disabled by PHOENIX_VULKAN_CF=0"
    why = coopmat_refusal(dev)
    if why is not None:
        return why
    if wtype.upper() not in CF_TYPES:
        return f"{wtype}: the gemm_coopmat_few.comp tiles are built for {', '.join(CF_TYPES)}"
    direct = kernel_name in CF_DIRECT_TILES
    if not direct and CF_TILES[kernel_name][2] and wtype.upper() not in CF_RAW_TYPES:
        return f"{wtype}: tile {kernel_name} loads {' / '.join(CF_RAW_TYPES)} blocks as whole words"
    lanes = cf_subgroup(dev)
    if isinstance(lanes, str):
        return lanes
    kstep = CF_KSTEP * CF_TILES[kernel_name][4]
    if k % kstep:
        return f"k = {k} is not a multiple of the tile's K step {kstep}"
    if cf_shared_bytes(kernel_name, geglu) > dev.caps.shared_memory:
        return f"needs {cf_shared_bytes(kernel_name, geglu)} B of shared memory"
    if direct:
        types = cf_direct_types(kernel_name)
        if wtype.upper() not in types:
            return f"{wtype}: tile {kernel_name} builds its fragments from {' / '.join(types)} blocks"
        layout = cf_direct_layout(dev)
        if isinstance(layout, str):
            return layout
    splits = CF_TILES[kernel_name][3]
    need = splits * (2 if geglu else 1) * m * n * 4
    if splits > 1 and need > CF_SPLIT_BYTES:
        return f"tile {kernel_name}: {need} B of partial sums exceed the {CF_SPLIT_BYTES} B scratch"
    return None


_CF_LAYOUTS: weakref.WeakKeyDictionary[Device, tuple[int, int] | str] = weakref.WeakKeyDictionary()


def cf_direct_layout(dev: Device) -> tuple[int, int] | str:
    """(CF_PR, CF_PK) of this device's 16 x 16 f16 B fragments for the CF_DIRECT tiles, or why
    they cannot run. The tiles assume lane L holds 4 pairs of consecutive K slots, pair q at row
    L / 4 + 8 PR_q and slots 2 (L % 4) + 8 PK_q (how NVIDIA lays out its 16 x 8 x 16 products);
    coopmat_fragment_layout.comp shows what the driver really does, once per device."""
    if os.environ.get("PHOENIX_VULKAN_CF_DIRECT", "1") == "0":
        return "disabled by PHOENIX_VULKAN_CF_DIRECT=0"
    known = _CF_LAYOUTS.get(dev)
    if known is not None:
        return known
    why = coopmat_refusal(dev)
    lanes = cf_subgroup(dev)
    if why is None and isinstance(lanes, str):
        why = lanes
    result: tuple[int, int] | str = why if why is not None else _read_layout(dev)
    _CF_LAYOUTS[dev] = result
    return result


def _read_layout(dev: Device) -> tuple[int, int] | str:
    from phoenix_chat.engine.backends.vulkan.memory import Buffer

    out = Buffer(dev, 257 * 4, host=True, name="fragment layout")
    cl = dev.commands(name="fragment layout")
    try:
        lanes = cf_subgroup(dev)  # the tiles' own lanes: a wave64 driver's wave32 layout is theirs
        assert not isinstance(lanes, str)
        cl.dispatch(dev.pipeline("coopmat_fragment_layout", **lanes), [out], 1)
        cl.end()
        cl.submit()
        vals = out.view(np.float32, 257).copy()
    finally:
        cl.destroy()
        out.destroy()
    return fragment_pairs(vals)


def fragment_pairs(vals: np.ndarray) -> tuple[int, int] | str:
    """(PR, PK) from coopmat_fragment_layout.comp's output (lane L's element e holds n * 16 + k of
    its (K slot k, row n)), or why that layout is not the pair layout the CF_DIRECT tiles assume."""
    if int(vals[256]) != 8:
        return f"the driver's 16 x 16 f16 fragment has {int(vals[256])} elements a lane, the CF_DIRECT tiles 8"
    got = vals[:256].astype(np.int64).reshape(32, 8)
    n, k = got // 16, got % 16
    pr = sum(1 << q for q in range(4) if n[0, 2 * q] >= 8)
    pk = sum(1 << q for q in range(4) if k[0, 2 * q] >= 8)
    lane = np.arange(32)[:, None]
    q = np.arange(8)[None, :] // 2
    want_n = lane // 4 + 8 * ((pr >> q) & 1)
    want_k = 2 * (lane % 4) + np.arange(8)[None, :] % 2 + 8 * ((pk >> q) & 1)
    if not (np.array_equal(n, want_n) and np.array_equal(k, want_k)):
        return "the driver's f16 fragment layout is not the pair layout the CF_DIRECT tiles are built for"
    return pr, pk


def cf_scratch_bytes(dev: Device) -> int:
    """Device memory the split-K few-token tiles may take here (their partial-sum scratch, allocated
    on first use): CF_SPLIT_BYTES where the tiles can run, else 0 — for the memory plan."""
    return CF_SPLIT_BYTES if cf_refusal(dev, "Q4_0", CF_KSTEP, "cmf1hr_k4", False) is None else 0


def int8_tile(kernel_name: str, geglu: bool) -> tuple[int, int, int]:
    """(tokens, weight rows, K step in values) of an int8 tile (ops_table.I8_TILES, CM8_TILES)."""
    if kernel_name in CM8F_TILES:
        return 16 * CM8F_TILES[kernel_name][0], 16, 64
    if kernel_name in CM8_TILES:
        gm, gn, tm, tn, kc, _pf2 = CM8_TILES[kernel_name]
        return 16 * gm * tm, 16 * gn * (max(1, tn // 2) if geglu else tn), 32 * kc
    rt, tt, kc = I8_TILES[kernel_name]
    if geglu and rt > 4:
        rt //= 2
    return 16 * tt, 16 * rt, 32 * kc


def int8_shared_bytes(kernel_name: str, geglu: bool) -> int:
    """Shared memory of an int8 tile: two buffers of 48-byte records, one per row and per token
    chunk (the matrix-core tiles: + 8 bytes of scales each, + the 1 KiB layout probe)."""
    tm, tn, kstep = int8_tile(kernel_name, geglu)
    records = ((2 if geglu else 1) * tn + tm) * (kstep // 32)
    if kernel_name in CM8F_TILES:  # per subgroup: its records and its partial sums
        split = CM8F_TILES[kernel_name][1]
        return split * (records * (48 + 8) + (2 if geglu else 1) * tm * 8 * 32 * 4 // 16) + 1024
    if kernel_name in CM8_TILES:
        return 2 * records * (48 + 8) + 1024
    return 2 * records * 48


def cm8_subgroups(kernel_name: str) -> int:
    if kernel_name in CM8F_TILES:
        return CM8F_TILES[kernel_name][1]
    gm, gn, _tm, _tn, _kc, _pf2 = CM8_TILES[kernel_name]
    return gm * gn


def int8_refusal(dev: Device, wtype: str, k: int, kernel_name: str, geglu: bool) -> str | None:
    """Why the int8 tile `kernel_name` cannot run this product here (None: it can)."""
    c = dev.caps
    if not c.int_dot:
        return c.refused.get("int_dot", "no int8 dot product")
    if wtype.upper() not in INT8_TYPES:
        return f"{wtype} has no int8 unpacking"
    if kernel_name in CM8_KERNELS:
        if not c.coopmat_int8_k:
            return c.refused.get("cooperative_matrix_int8", "no int8 cooperative matrices")
        if os.environ.get("PHOENIX_VULKAN_CM8", "0") != "1":
            return CM8_OPT_IN
        if coopmat_refusal(dev) is not None:
            return coopmat_refusal(dev)
        if wtype.upper() not in CM8_TYPES:
            return f"{wtype}: the int8 matrix-core tiles are built for {', '.join(CM8_TYPES)}"
        if (c.subgroup_size, c.coopmat_int8_k) != CM8_SHAPE:
            return (
                f"subgroup size {c.subgroup_size} and int8 products of K {c.coopmat_int8_k}: the int8 matrix-core "
                f"tiles are compiled for {CM8_SHAPE[0]} lanes and K {CM8_SHAPE[1]}"
            )
        if cm8_subgroups(kernel_name) * c.subgroup_size > c.max_workgroup_invocations:
            return f"{cm8_subgroups(kernel_name)} subgroups of {c.subgroup_size} exceed maxComputeWorkGroupInvocations"
    _tm, _tn, kstep = int8_tile(kernel_name, geglu)
    if k % kstep:
        return f"k = {k} is not a multiple of the tile's K step {kstep}"
    if int8_shared_bytes(kernel_name, geglu) > c.shared_memory:
        return f"needs {int8_shared_bytes(kernel_name, geglu)} B of shared memory"
    return None


def coopmat_refusal(dev: Device) -> str | None:
    """Why the prefill GEMM does not take gemm_coopmat.comp here (None: it does)."""
    c = dev.caps
    if not c.cooperative_matrix:
        return c.refused.get("cooperative_matrix_f16", "no cooperative matrices")
    if os.environ.get("PHOENIX_VULKAN_COOPMAT", "1") == "0":
        return "disabled by PHOENIX_VULKAN_COOPMAT=0"
    if CM_SUBGROUPS * c.subgroup_size > c.max_workgroup_invocations:
        return (
            f"{CM_SUBGROUPS} subgroups of {c.subgroup_size} exceed maxComputeWorkGroupInvocations "
            f"{c.max_workgroup_invocations}"
        )
    if c.shared_memory < 40 << 10:
        return f"{c.shared_memory >> 10} KiB of shared memory, the coopmat tiles need 40 KiB"
    return None


def coopmat_ok(dev: Device) -> bool:
    return coopmat_refusal(dev) is None


def kernel(dev: Device) -> str:
    """The GEMM a device gets: "coopmat", "lanes" (CPU devices) or "tiled"."""
    if coopmat_ok(dev):
        return "coopmat"
    return "lanes" if dev.caps.is_software else "tiled"


def path(dev: Device) -> str:
    return {"coopmat": "coopmat f16 x f16 -> f32", "lanes": "register-tiled f32 (CPU device)", "tiled": "tiled f32"}[
        kernel(dev)
    ]


def is_coopmat(kernel_name: str) -> bool:
    return kernel_name in CM_TILES


def int8_input(cl: CommandList, dev: Device, kernel_name: str, x: Binding, xq: Binding, n: int) -> Binding | None:
    """For a GEMM recorded on its own (the load-time timing, the sweep): an int8 tile's input —
    x's n values quantized into `xq`, a barrier after — or None for the other kernels. (A forward
    quantizes x once for all the products that share it: Gemma3Graph.mv.)"""
    if kernel_name not in INT8_KERNELS:
        return None
    record_quantize(cl, dev, x, xq, n)
    cl.barrier()
    return xq


def _ranges(w: Tensor | Binding, n: int) -> list[tuple[Binding, int, int]]:
    """(binding, row_start, rows): a memory.Tensor's row ranges, or all n rows of a plain binding."""
    if isinstance(w, Tensor):
        return [(r.binding, r.row_start, r.rows) for r in w.ranges]
    return [(w, 0, n)]


def tile_pipeline(dev: Device, wtype: str, kernel_name: str, geglu: bool) -> Pipeline:
    """The pipeline of GEMM kernel `kernel_name` (one of KERNELS) for weight type `wtype`, with the
    workgroup and specialization constants `gemm` runs it with (bench/pipeline_stats.py builds the
    same). No refusal checks: `gemm` makes them first."""
    name = f"gemm_{wtype.lower()}_f32_f32" + ("_geglu" if geglu else "")
    if kernel_name == "tiled":
        return dev.pipeline(name)
    if kernel_name == "lanes":
        wg = max(1, min(64, dev.caps.subgroup_size))
        return dev.pipeline(name + "_lanes", WG=wg, RN=LANES_RN // 2 if geglu else LANES_RN, TM=LANES_TM)
    spec: dict[str, int] = {}
    if kernel_name in CM_TILES:
        spec["WG"] = CM_TILE_SUBGROUPS.get(kernel_name, CM_SUBGROUPS) * dev.caps.subgroup_size
    elif kernel_name in CF_TILES:
        spec["WG"] = CF_TILES[kernel_name][1] * CF_SUBGROUP
        lanes = cf_subgroup(dev)
        if isinstance(lanes, str):
            raise ValueError(f"gemm: tile {kernel_name} cannot run here: {lanes}")
        spec.update(lanes)
        if kernel_name in CF_DIRECT_TILES:
            layout = cf_direct_layout(dev)
            if isinstance(layout, str):
                raise ValueError(f"gemm: tile {kernel_name} cannot run here: {layout}")
            spec["CF_PR"], spec["CF_PK"] = layout
    elif kernel_name in CM8_KERNELS:
        spec["WG"] = cm8_subgroups(kernel_name) * dev.caps.subgroup_size
    return dev.pipeline(name + "_" + kernel_name, **spec)


@dataclass
class SplitKGroup:
    """Split-K products recorded one after another (the fused QKV's q, k and v): each writes its
    partial sums to its own part of the scratch, and one barrier separates all of them from all
    their reduces, where a product alone has a barrier before it (an earlier reduce may still read
    the scratch) and one before its reduce — q, k and v of 16 tokens on split-K tiles were six
    barriers a layer. The caller starts a group after a barrier (no reduce still reads the scratch)
    and records `finish` after its last product."""

    used: int = 0  # bytes of the scratch its products' partial sums take
    reduces: list[tuple[Pipeline, list[Binding], tuple[int, int, int], bytes]] = field(default_factory=list)

    def finish(self, cl: CommandList) -> None:
        """The barrier, then every reduce of the group."""
        if self.reduces:
            cl.barrier()
            for p, binds, groups, push in self.reduces:
                cl.dispatch(p, binds, groups=groups, push=push)
        self.used, self.reduces = 0, []


def gemm(
    cl: CommandList,
    dev: Device,
    x: Binding,
    w: Tensor | Binding,
    y: Binding,
    *,
    wtype: str,
    m: int,
    n: int,
    k: int,
    x_stride: int | None = None,
    y_stride: int | None = None,
    w_up: Tensor | Binding | None = None,
    kernel_name: str | None = None,
    xq: Binding | None = None,
    group: SplitKGroup | None = None,
) -> None:
    """y = x @ W.T (or gelu_tanh(x @ Wg.T) * (x @ Wu.T) when `w_up` is given: `w` is then the gate).

    `w` / `w_up`: a memory.Tensor (one dispatch per bound row range) or a plain binding of all n rows.
    kernel_name: one of KERNELS, or None for the device's own (`kernel`).
    xq: the int8 kernels' input, x's q8_1 blocks (matvec.record_quantize of x's m x k values, a
    barrier after it), written by the caller so that products sharing x quantize it once.
    group: a split-K tile's partial sums go to the group's own part of the scratch and its reduce
    waits for `group.finish` (where the scratch has room; else the product pays its barriers).
    """
    wt = wtype.upper()
    if k % 32:
        raise ValueError(f"gemm: k = {k} is not a multiple of 32 (the kernels stage K in steps of 32)")
    if wt not in GEMM_TYPES:
        raise ValueError(f"gemm: weight type {wtype} unsupported (have {', '.join(GEMM_TYPES)})")
    kn = kernel(dev) if kernel_name is None else kernel_name
    geglu = w_up is not None
    if kn in CM_TILES:
        if cm_shared_bytes(kn, geglu) > dev.caps.shared_memory:
            raise ValueError(
                f"gemm: tile {kn} needs {cm_shared_bytes(kn, geglu)} B of shared memory, "
                f"the device has {dev.caps.shared_memory}"
            )
        p = tile_pipeline(dev, wt, kn, geglu)
        tm, tn = CM_TILES_GEGLU.get(kn, CM_TILES[kn]) if geglu else CM_TILES[kn]
    elif kn in CF_TILES:
        why = cf_refusal(dev, wt, k, kn, geglu, m, n)
        if why is not None:
            raise ValueError(f"gemm: the gemm_coopmat_few.comp tile {kn} cannot run this product: {why}")
        p = tile_pipeline(dev, wt, kn, geglu)
        tm, tn = cf_tile(kn)
    elif kn in INT8_KERNELS:
        why = int8_refusal(dev, wt, k, kn, geglu)
        if why is not None:
            raise ValueError(f"gemm: the int8 tile {kn} cannot run this product: {why}")
        if xq is None:
            raise ValueError("gemm: the int8 kernels read x's q8_1 blocks: pass xq")
        if x_stride not in (None, k):
            raise ValueError("gemm: the int8 kernels read x quantized as m x k contiguous values")
        p = tile_pipeline(dev, wt, kn, geglu)
        tm, tn, _kstep = int8_tile(kn, geglu)
    elif kn == "lanes":
        p = tile_pipeline(dev, wt, kn, geglu)
        tm, tn = LANES_TM, p.spec_values["WG"] * p.spec_values["RN"]
    elif kn == "tiled":
        p = tile_pipeline(dev, wt, kn, geglu)
        tm = tn = TILE
    else:
        raise ValueError(f"gemm: kernel {kernel_name!r} is not one of {KERNELS}")
    xs = k if x_stride is None else x_stride
    if (kn in CM_TILES or kn in CF_TILES or kn == "lanes") and (xs % 4 or (isinstance(x, tuple) and x[1] % 16)):
        raise ValueError(f"gemm: the {kn} kernel reads x 16 bytes at a time (x_stride % 4, offset % 16)")
    ys = n if y_stride is None else y_stride
    if kn in INT8_KERNELS:
        assert xq is not None
        x, xs = xq, k // 32  # q8_1 blocks, x_stride in blocks
    gate = _ranges(w, n)
    up = _ranges(w_up, n) if w_up is not None else None
    if up is not None and [(s, r) for _, s, r in up] != [(s, r) for _, s, r in gate]:
        raise ValueError("gemm: gate and up must be bound in the same row ranges")
    splits = CF_TILES[kn][3] if kn in CF_TILES else 1
    for i, (binding, row_start, rows) in enumerate(gate):
        push = p.push.pack(m=m, n=rows, k=k, x_stride=xs, y_stride=ys, y_off=row_start)
        binds = [x, y, binding] + ([up[i][0]] if up is not None else [])
        if splits == 1:
            cl.dispatch(p, binds, groups=(-(-rows // tn), -(-m // tm), 1), push=push)
            continue
        # split K: partial sums into the device's scratch, then added in a fixed order into y
        part = dev.scratch("few-token GEMM partial sums", CF_SPLIT_BYTES)
        red = dev.pipeline("gemm_splitk_reduce" + ("_geglu" if up is not None else ""), WG=256)
        red_push = red.push.pack(m=m, n=rows, k=splits, x_stride=0, y_stride=ys, y_off=row_start)
        red_groups = (-(-(m * rows) // 256), 1, 1)
        need = splits * (2 if up is not None else 1) * m * rows * 4
        if group is not None and group.used + need <= CF_SPLIT_BYTES:
            part_b: Binding = (part, group.used, need)
            group.used += -(-need // 256) * 256  # the next part at an offset every device allows
            cl.dispatch(p, [x, part_b, *binds[2:]], groups=(-(-rows // tn), -(-m // tm), splits), push=push)
            group.reduces.append((red, [part_b, y], red_groups, red_push))
            continue
        # alone, the barrier first: an earlier reduce (this product's previous row range, or a
        # group's) may still read the scratch
        cl.barrier()
        cl.dispatch(p, [x, part, *binds[2:]], groups=(-(-rows // tn), -(-m // tm), splits), push=push)
        cl.barrier()
        cl.dispatch(red, [part, y], groups=red_groups, push=red_push)
