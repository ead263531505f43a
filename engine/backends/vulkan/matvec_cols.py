"""Host side of the multi-column int8 matvec (shaders/matvec_cols.comp): Y[v] = W X[v] for n
vectors in one pass over the weights, X as q8_1 blocks (`matvec.record_quantize`, or a norm that
writes them), each weight block unpacked once for a tile of NCOLS vectors.

The batched decode step and forwards of a few tokens run their matrices through it where the
load-time timing says so (autotune.choose_few_token_path); the f32 multi-column matvec of
matvec.comp (`record_matvec(..., columns=n)`) is the path for devices without the int8 dot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix, dummy, fusable, groups_2d
from phoenix_chat.engine.backends.vulkan.pipelines import COLS_TYPES, matvec_cols_name

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Binding
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

Spec = dict[str, int]

COLS_TILES = (4, 8, 16)  # NCOLS values the timing picks among (vectors one workgroup takes)


def cols_spec(dev: Device, n_vecs: int, rows: int = 2, tile: int | None = None) -> Spec:
    """Workgroup shape: 4 subgroups, each owning `rows` rows; NCOLS = the tile (default: 4 up to
    4 vectors, else 8: several tiles then share a row group's weights through L2; on the H100 wider
    tiles were slower, bench.cols_sweep). Tuned devices time shapes at load (autotune)."""
    sg = max(8, min(64, dev.caps.subgroup_size))
    if tile is None:
        tile = 4 if n_vecs <= 4 else 8
    return {"WG": 4 * sg, "ROWS": rows, "SUBGROUP_ROWS": 4, "NCOLS": tile}


def cols_ok(dev: Device, mats: list[WeightMatrix]) -> bool:
    """The int8 multi-column kernel takes these matrices on this device: it has the int8 dot
    and every matrix a type with an int8 decoder (else the f32 multi-column matvec runs)."""
    return bool(dev.caps.int_dot) and all(m.qtype.name in COLS_TYPES for m in mats) and fusable(mats)


def record_matvec_cols(
    cl: CommandList,
    dev: Device,
    mats: list[WeightMatrix],
    xq: Binding,
    y: Binding,
    *,
    n_vecs: int,
    x_stride: int,
    y_stride: int,
    x_off: int = 0,
    y_off: int = 0,
    epilogue: str | None = None,
    spec: Spec | None = None,
) -> None:
    """Record y[y_off + v * y_stride + r] = (W xq[v])[r] for v < n_vecs and the rows of `mats`
    concatenated (fused QKV when 3; epilogue "geglu": mats = [gate, up], y = gelu(gate x) * up x).
    xq: q8_1 blocks; x_off / x_stride count blocks. A lone matrix may span several bound row
    ranges (one dispatch each). No barrier."""
    if not 1 <= len(mats) <= 3 or n_vecs < 1:
        raise ValueError("1 to 3 matrices and at least one vector")
    if epilogue not in (None, "geglu"):
        raise ValueError(f"the multi-column int8 matvec has the plain and geglu epilogues, not {epilogue!r}")
    if epilogue == "geglu" and (len(mats) != 2 or mats[0].rows != mats[1].rows):
        raise ValueError("geglu takes [gate, up] of equal shape")
    if not cols_ok(dev, mats):
        raise ValueError(
            f"no int8 multi-column kernel for {[m.qtype.name for m in mats]} on {dev.name} "
            f"(int dot: {dev.caps.int_dot}): use the f32 one (record_matvec columns=)"
        )
    if len(mats) > 1 and any(len(m.tensor.ranges) > 1 for m in mats):
        raise ValueError("fused matrices must each fit one binding")
    qtype, cols = mats[0].qtype, mats[0].cols
    v_qtype = mats[2].qtype if len(mats) == 3 else None
    if v_qtype not in (None, qtype) and epilogue is not None:
        raise ValueError("a mixed-type QKV has the plain epilogue only")
    spec = spec or cols_spec(dev, n_vecs)
    p = dev.pipeline(
        matvec_cols_name(qtype.name, "_geglu" if epilogue else "", None if v_qtype is None else v_qtype.name), **spec
    )
    d = dummy(dev)
    parts: list[tuple[list[Binding], list[int], int]]
    if len(mats) == 1:  # one dispatch per bound row range (an LM head beyond one binding)
        parts = [([rr, d, d], [rr.rows, 0, 0], rr.row_start) for rr in mats[0].tensor.ranges]
    else:
        parts = [
            (
                [*(m.tensor.ranges[0] for m in mats), *[d] * (3 - len(mats))],
                [m.rows for m in mats] + [0] * (3 - len(mats)),
                0,
            )
        ]
    for w_binds, rows, row_start in parts:
        total = rows[0] if epilogue == "geglu" else sum(rows)
        row_groups = -(-total // (spec["ROWS"] * spec["SUBGROUP_ROWS"]))
        tiles = -(-n_vecs // spec["NCOLS"])
        push = p.push.pack(
            n_cols=cols,
            rows0=rows[0],
            rows1=rows[1],
            rows2=rows[2],
            x_off=x_off,
            y_off=y_off + row_start,
            res_off=0,
            x_stride=x_stride,
            y_stride=y_stride,
            n_vecs=n_vecs,
        )
        cl.dispatch(p, [xq, y, *w_binds], groups_2d(row_groups * tiles), push)
