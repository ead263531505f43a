"""The prefill GEMM's tile per weight shape, chosen at load by timing (matrix-core devices).

Which matrix-core tile (ops_gemm.CM_TILES) is fastest depends on the matrix: on an H100 a
27B-shaped QKV or down product ran fastest in the 128 x 128 tile filled through registers
("coopmat_p"), the GEGLU's gate/up pair in 4 subgroups of 64 x 64 ("coopmat_wp", 1.37x the
former) — and a narrow matrix (a 2,048-row k or v) fills few workgroups in any big tile. So each
distinct shape of the model — (weight type, rows, columns, GEGLU or not) — times every tile on
one of the model's own matrices for a full prefill chunk, and the graph looks its shape up
(`Tuning.gemm_kernel_for`). A shape not timed (the LM head of a perplexity run) takes the tile
most shapes chose (`most_chosen`); a device where nothing was timed, the whole-forward choice
(`autotune.choose_gemm_tile`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from phoenix_chat.engine.backends.vulkan import ops_gemm
from phoenix_chat.engine.backends.vulkan.timing import time_many
from phoenix_chat.engine.errors import OutOfMemoryError

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.autotune import Tuning
    from phoenix_chat.engine.backends.vulkan.gemma3_graph import Gemma3Graph
    from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList


def shape_key(wtype: str, rows: int, cols: int, geglu: bool) -> str:
    """The lookup key of a GEMM's weight shape: "Q4_0 21504x5376 geglu"."""
    return f"{wtype.upper()} {rows}x{cols}" + (" geglu" if geglu else "")


def model_shapes(graph: Gemma3Graph) -> dict[str, tuple[list[WeightMatrix], int]]:
    """key -> (the matrices of its first occurrence: one, or gate and up; their column count),
    over every layer's prefill products (q, k, v each their own GEMM; o; gate/up; down)."""
    out: dict[str, tuple[list[WeightMatrix], int]] = {}
    for layer in graph.weights.layers:
        groups = [[m] for m in layer.qkv] + [[layer.o], [layer.gate, layer.up], [layer.down]]
        for mats in groups:
            m = mats[0]
            key = shape_key(m.qtype.name, m.rows, m.cols, len(mats) == 2)
            out.setdefault(key, (mats, m.cols))
    return out


def choose_gemm_kernels(graph: Gemma3Graph, tokens: int, reps: int = 3) -> str | None:
    """Time every matrix-core tile on each of the model's GEMM shapes for `tokens` tokens; fill
    graph.tuning.gemm_kernels (key -> kernel) and gemm_shape_timing (key -> kernel -> µs).
    Returns why nothing was timed (no matrix cores, no memory for the scratch), else None."""
    dev = graph.dev
    refusal = ops_gemm.coopmat_refusal(dev)
    if refusal is not None:
        return refusal
    shapes = model_shapes(graph)
    k_max = max(cols for _, cols in shapes.values())
    n_max = max(mats[0].rows for mats, _ in shapes.values())
    try:
        x = dev.buffer(tokens * k_max * 4, name="gemm tuning x")
    except OutOfMemoryError as exc:
        return f"no memory for the timing scratch: {exc}"
    try:
        y = dev.buffer(tokens * n_max * 4, name="gemm tuning y")
    except OutOfMemoryError as exc:
        x.destroy()
        return f"no memory for the timing scratch: {exc}"
    try:
        dev.upload(x, bytes(x.size))  # zeros: no NaN or inf slows a candidate
        tuning = graph.tuning
        for key, (mats, cols) in shapes.items():
            geglu = len(mats) == 2
            candidates = [
                kn for kn in ops_gemm.COOPMAT_KERNELS if ops_gemm.cm_shared_bytes(kn, geglu) <= dev.caps.shared_memory
            ]

            def recorder(kn: str, mats: list[WeightMatrix] = mats, cols: int = cols) -> Callable[[CommandList], None]:
                w, up = mats[0], (mats[1].tensor if len(mats) == 2 else None)

                def record(cl: CommandList) -> None:
                    ops_gemm.gemm(
                        cl, dev, x, w.tensor, y, wtype=w.qtype.name, m=tokens, n=w.rows, k=cols, w_up=up, kernel_name=kn
                    )

                return record

            us = time_many(dev, {kn: recorder(kn) for kn in candidates}, reps=reps)
            tuning.gemm_shape_timing[key] = {kn: round(t, 1) for kn, t in us.items()}
            tuning.gemm_kernels[key] = min(us, key=us.__getitem__)
    finally:
        x.destroy()
        y.destroy()
    return None


def most_chosen(tuning: Tuning) -> str | None:
    """The tile most shapes chose (ties: the first timed), or None where none was timed."""
    picks = list(tuning.gemm_kernels.values())
    return max(picks, key=picks.count) if picks else None
