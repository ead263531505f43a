"""The prefill GEMM's tile per weight shape, chosen at load by timing (GPUs with matrix cores or
the int8 dot).

Which matrix-core tile (ops_gemm.CM_TILES) is fastest depends on the matrix: on an H100 a
27B-shaped QKV or down product ran fastest in the 128 x 128 tile filled through registers
("coopmat_p"), the GEGLU's gate/up pair in 4 subgroups of 64 x 64 ("coopmat_wp", 1.37x the
former) — and a narrow matrix (a 2,048-row k or v) fills few workgroups in any big tile. So each
distinct shape of the model — (weight type, rows, columns, GEGLU or not) — times every tile on
one of the model's own matrices for a full prefill chunk, and the graph looks its shape up
(`Tuning.gemm_kernel_for`). The int8-dot tiles (gemm_int8.comp) compete on GPUs with the int8
dot, timed with the quantize of x they need: on the H100 they lose to the matrix cores (0.5-0.64x),
and win over the f32 tiled GEMM a GPU without matrix cores ran before (2.5-3.5x).
The same per shape for 8, 16 and FEW_TOKENS tokens (a batched decode step's GEMMs, a short turn:
a forward takes the smallest timed count >= its tokens), where
the 32-token tiles and, when asked for (PHOENIX_VULKAN_CM8=1), the int8 matrix-core tiles made for
a few tokens (gemm_coopmat_int8_few.comp) compete: on the H100 those ran the 27B shapes' products
of 8-32 tokens 1.3-3.6x faster than the f16 tiles, but an LM head of 262,144 rows slower — one
tile for every shape could not have picked them. On GPUs with f16 matrix cores and 32-lane
subgroups the few-token timing also takes the tiles made for it (gemm_coopmat_few.comp, split-K
ones included where their partial sums fit the scratch): on the H100 they won most 27B / 4B
products of 32 tokens. The prefill chunk's timing takes that kernel's prefill tiles
(ops_gemm.CF_PREFILL_KERNELS, Q4_0 and Q4_K): on the H100 they won every 27B / 4B Q4_0 product of
512 tokens, 1.4-1.6x prefill end to end (a 4B Q4_K file 1.3x).
A shape not timed (the LM head of a perplexity run) takes the tile
most shapes chose (`most_chosen`); a device where nothing was timed, the whole-forward choice
(`autotune.choose_gemm_tile`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from phoenix_chat.engine.backends.vulkan import ops_gemm
from phoenix_chat.engine.backends.vulkan.autotune import TUNE_LAYERS
from phoenix_chat.engine.backends.vulkan.matvec import q8_1_bytes
from phoenix_chat.engine.backends.vulkan.timing import time_many
from phoenix_chat.engine.errors import OutOfMemoryError

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.autotune import Tuning
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.gemma3_graph import Gemma3Graph
    from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList


def shape_key(wtype: str, rows: int, cols: int, geglu: bool) -> str:
    """The lookup key of a GEMM's weight shape: "Q4_0 21504x5376 geglu"."""
    return f"{wtype.upper()} {rows}x{cols}" + (" geglu" if geglu else "")


def model_shapes(graph: Gemma3Graph, lm_head: bool = False) -> dict[str, tuple[list[WeightMatrix], int]]:
    """key -> (the matrices of its first occurrence: one, or gate and up; their column count),
    over every layer's prefill products (q, k, v each their own GEMM; o; gate/up; down) and, with
    `lm_head`, the LM head: a batched step's rows each need their logits (a prefill chunk only
    its last position's, a matvec), and with the forward's tile the 4B's 262,144-row Q8_0 head
    took 2.6 of a 32-row step's 11.7 ms on the H100."""
    return {key: (rotation[0], cols) for key, (rotation, cols) in shape_rotations(graph, lm_head).items()}


def shape_rotations(
    graph: Gemma3Graph, lm_head: bool = False, most: int = TUNE_LAYERS
) -> dict[str, tuple[list[list[WeightMatrix]], int]]:
    """key -> (the matrices of up to `most` of its occurrences, one list per layer; their column
    count): the timing cycles through them so that each repeat reads its weights from memory, as
    a forward does. Timed on one matrix, a product small enough for the L2 (the 4B's 29.5 MB
    gate/up pair in an H100's 50 MB) ran from it: 43.5 us timed against 77 us a layer in a real
    32-row step, which ranked the tiles as memory never would."""
    out: dict[str, tuple[list[list[WeightMatrix]], int]] = {}
    for layer in graph.weights.layers:
        groups = [[m] for m in layer.qkv] + [[layer.o], [layer.gate, layer.up], [layer.down]]
        for mats in groups:
            m = mats[0]
            key = shape_key(m.qtype.name, m.rows, m.cols, len(mats) == 2)
            rotation = out.setdefault(key, ([], m.cols))[0]
            if len(rotation) < most:
                rotation.append(mats)
    if lm_head:
        m = graph.weights.lm_head
        out.setdefault(shape_key(m.qtype.name, m.rows, m.cols, False), ([[m]], m.cols))
    return out


def int8_candidates(dev: Device, int_dot: bool = True) -> bool:
    """Whether the int8-dot tiles (gemm_int8.comp) are timed here: a GPU with the integer dot
    product whose backend allows int8 activations (`int_dot`: VulkanOptions.int_dot resolved —
    False keeps every activation f32 or f16, prefill included); a CPU device such as lavapipe
    keeps its register-tiled f32 kernel untimed."""
    return int_dot and dev.caps.int_dot and not dev.caps.is_software


def candidates_for(
    dev: Device,
    wtype: str,
    cols: int,
    geglu: bool,
    int_dot: bool = True,
    few: bool = False,
    rows: int = 0,
    tokens: int = 0,
) -> list[str]:
    """The kernels timed on one shape: every matrix-core tile that fits (on devices with matrix
    cores; for a few tokens also the few-token tiles, gemm_coopmat_few.comp), every int8 tile that
    can run it (where `int8_candidates`), and the f32 tiled GEMM where there are no matrix cores —
    the int8 tiles must beat what would run without them."""
    out: list[str] = []
    if ops_gemm.coopmat_ok(dev):
        out += [kn for kn in ops_gemm.COOPMAT_KERNELS if ops_gemm.cm_shared_bytes(kn, geglu) <= dev.caps.shared_memory]
        if few:  # (rows, tokens: a split-K tile's partial sums must fit its scratch)
            out += [
                kn
                for kn in ops_gemm.CF_KERNELS
                if ops_gemm.cf_refusal(dev, wtype, cols, kn, geglu, tokens, rows) is None
            ]
        else:  # the prefill tiles that build their weight fragments in registers (Q4_0, Q4_K)
            out += [
                kn
                for kn in ops_gemm.CF_PREFILL_KERNELS
                if ops_gemm.cf_refusal(dev, wtype, cols, kn, geglu, tokens, rows) is None
            ]
    if int8_candidates(dev, int_dot):
        out += [kn for kn in ops_gemm.INT8_KERNELS if ops_gemm.int8_refusal(dev, wtype, cols, kn, geglu) is None]
        if not ops_gemm.coopmat_ok(dev):
            out.append("tiled")
    return out


def choose_gemm_kernels(graph: Gemma3Graph, tokens: int, reps: int = 3, few: bool = False) -> str | None:
    """Time every matrix-core and int8 tile on each of the model's GEMM shapes for `tokens`
    tokens (the int8 ones with the quantize dispatch of x they need); fill
    graph.tuning.gemm_kernels (key -> kernel) and gemm_shape_timing (key -> kernel -> µs) — with
    `few` (tokens <= FEW_TOKENS: a batched decode step, a short turn), gemm_kernels_few[tokens]
    and gemm_shape_timing_few[tokens], over the same candidates. Returns why nothing was timed (no
    matrix cores and no int8 dot, no memory for the scratch), else None."""
    dev = graph.dev
    if not ops_gemm.coopmat_ok(dev) and not int8_candidates(dev, graph.int_dot):
        why = (
            "int8 activations are off (VulkanOptions.int_dot, or the device's dot is emulated)"
            if not graph.int_dot
            else "the int8 tiles are timed only on GPUs with the int8 dot"
        )
        return f"{ops_gemm.coopmat_refusal(dev)}; {why}"
    shapes = shape_rotations(graph, lm_head=few)
    k_max = max(cols for _, cols in shapes.values())
    n_max = max(rotation[0][0].rows for rotation, _ in shapes.values())
    scratch = []
    try:
        for nbytes, name in ((tokens * k_max * 4, "x"), (tokens * n_max * 4, "y"), (q8_1_bytes(tokens * k_max), "xq")):
            scratch.append(dev.buffer(nbytes, name=f"gemm tuning {name}"))
    except OutOfMemoryError as exc:
        for b in scratch:
            b.destroy()
        return f"no memory for the timing scratch: {exc}"
    x, y, xq = scratch
    try:
        dev.upload(x, bytes(x.size))  # zeros: no NaN or inf slows a candidate
        tuning = graph.tuning
        for key, (rotation, cols) in shapes.items():
            mats = rotation[0]
            geglu = len(mats) == 2

            def recorder(
                kn: str, rotation: list[list[WeightMatrix]] = rotation, cols: int = cols
            ) -> Callable[[CommandList], None]:
                layers = itertools.cycle(rotation)  # each candidate the same sequence of layers

                def record(cl: CommandList) -> None:
                    mats = next(layers)
                    w, up = mats[0], (mats[1].tensor if len(mats) == 2 else None)
                    int8_x = ops_gemm.int8_input(cl, dev, kn, x, xq, tokens * cols)
                    ops_gemm.gemm(
                        cl,
                        dev,
                        x,
                        w.tensor,
                        y,
                        wtype=w.qtype.name,
                        m=tokens,
                        n=w.rows,
                        k=cols,
                        w_up=up,
                        kernel_name=kn,
                        xq=int8_x,
                    )

                return record

            kernels = candidates_for(dev, mats[0].qtype.name, cols, geglu, graph.int_dot, few, mats[0].rows, tokens)
            us = time_many(dev, {kn: recorder(kn) for kn in kernels}, reps=reps)
            timing = tuning.gemm_shape_timing_few.setdefault(tokens, {}) if few else tuning.gemm_shape_timing
            timing[key] = {kn: round(t, 1) for kn, t in us.items()}
            chosen = tuning.gemm_kernels_few.setdefault(tokens, {}) if few else tuning.gemm_kernels
            chosen[key] = min(us, key=us.__getitem__)
    finally:
        for b in scratch:
            b.destroy()
    return None


def most_chosen(tuning: Tuning) -> str | None:
    """The matrix-core tile most shapes chose (ties: the first timed), or None where none was:
    the kernel of shapes not timed, so one that reads every weight type (the int8 tiles do not)."""
    picks = [kn for kn in tuning.gemm_kernels.values() if kn in ops_gemm.COOPMAT_KERNELS]
    return max(picks, key=picks.count) if picks else None
