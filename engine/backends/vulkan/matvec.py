"""Host side of the matvec kernel family: weight matrices on the device and dispatch recording.

`WeightMatrix.upload` puts a GGUF tensor's bytes on the device unchanged (dequantized inside
the kernel). `record_matvec` records y = W x (or fused QKV, GEGLU gate/up, residual add, or a
decode matvec followed by norm_add in the same dispatch: `NormTail`) into a CommandList,
splitting a matrix bound in several row ranges into one dispatch per range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy.typing as npt
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.backends.vulkan.codebooks import grid_prefix
from phoenix_chat.engine.backends.vulkan.memory import Binding, Buffer, ByteProgress, Tensor
from phoenix_chat.engine.backends.vulkan.pipelines import (
    MIXED_QKV_TYPES,
    PAIR_TYPES,
    PRO_SUFFIX,
    VARIANTS,
    WEIGHT_TYPES,
    matvec_name,
)

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

SUPPORTED = {QType[t] for t in WEIGHT_TYPES}
# int8 activations: False (f32 x), True (q8_1 x from record_quantize), "regs" (f32 x quantized in registers)
IntDot: TypeAlias = bool | Literal["regs"]
# specialization constants by name (Device.pipeline's **spec); SUBGROUP_SIZE: a required subgroup size
Spec: TypeAlias = dict[str, int]
MAX_GROUPS_X = 65535


def row_bytes(qtype: QType, cols: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise ValueError(f"{qtype.name} rows need a multiple of {block} columns, got {cols}")
    return cols // block * size


def groups_2d(n: int) -> tuple[int, int, int]:
    """Workgroup counts for n groups within the 65535 per-dimension limit (kernels flatten y*X+x)."""
    if n <= MAX_GROUPS_X:
        return (max(n, 1), 1, 1)
    return (MAX_GROUPS_X, -(-n // MAX_GROUPS_X), 1)


def dummy(dev: Device) -> Buffer:
    """A small buffer for binding slots a variant declares but does not read."""
    d = getattr(dev, "_dummy_buffer", None)
    if d is None:
        with dev.owning(None):  # the device's, whichever backend asked first
            d = dev._dummy_buffer = dev.buffer(256, name="dummy")
    return d


def default_spec(dev: Device) -> Spec:
    """Workgroup shape. GPUs: each subgroup owns 2 rows, 4 subgroups per workgroup (measured on
    an H100: 1.4-2x the bandwidth of a whole workgroup per row on Gemma's short rows);
    CPU Vulkan gives each invocation 8 whole rows (THREAD_ROWS in matvec.comp), sharing each chunk
    of x among them (lavapipe, 270M shapes: 1.1-2.4x the speed of 4 rows each loading x, ~5%
    over 4 sharing it; 16 is slower on K-quants)."""
    if dev.caps.is_software:
        return {"WG": dev.caps.subgroup_size, "ROWS": 8, "THREAD_ROWS": 1, "SUBGROUP_ROWS": 0}
    return subgroup_rows_spec(dev, 2)


def subgroup_rows_spec(dev: Device, rows: int) -> Spec:
    """4 subgroups per workgroup, each owning `rows` rows."""
    sg = max(8, min(64, dev.caps.subgroup_size))
    return {"WG": 4 * sg, "ROWS": rows, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4}


# workgroup shape of the int8 path that quantizes x in registers ("regs") where no tuned
# shape of its own applies (the block-pair path lives in the cooperative kernels)
REGS_SPEC: Spec = {"WG": 32, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4}

MAX_COLUMNS = 8  # vectors one multi-column matvec takes (NCOLS in matvec.comp)
COLUMN_ROWS = 2  # rows per subgroup there: each load of x serves this many rows


def columns_spec(dev: Device, columns: int) -> Spec:
    """Workgroup shape of the multi-column matvec: subgroups owning COLUMN_ROWS rows each on
    every device (it has no whole-rows-per-invocation form), NCOLS vectors per weight read."""
    return {**subgroup_rows_spec(dev, COLUMN_ROWS), "NCOLS": columns}


def rows_per_group(spec: Spec) -> int:
    if spec.get("THREAD_ROWS"):
        return spec["ROWS"] * spec["WG"]
    return spec["ROWS"] * max(1, spec.get("SUBGROUP_ROWS", 0))


@dataclass
class WeightMatrix:
    tensor: Tensor
    qtype: QType
    rows: int
    cols: int
    name: str = ""

    @classmethod
    def upload(
        cls,
        dev: Device,
        raw: npt.NDArray[Any],
        qtype: QType,
        shape: tuple[int, int],
        name: str = "",
        progress: ByteProgress | None = None,
    ) -> WeightMatrix:
        qtype = QType(qtype)
        if qtype not in SUPPORTED:
            raise ValueError(f"{name}: weight type {qtype.name} has no matvec kernel")
        rows, cols = shape
        prefix = grid_prefix(qtype)  # a codebook type's grid goes first (shaders/include/gguf_bytes.glsl)
        t = Tensor.upload(dev, raw, row_bytes(qtype, cols), rows=rows, name=name, progress=progress, prefix=prefix)
        return cls(t, qtype, rows, cols, name)

    @property
    def nbytes(self) -> int:
        return self.tensor.nbytes


@dataclass
class NormTail:
    """The norm_add that follows a decode matvec, run by its last workgroup (epilogue "norm"):
    residual += rmsnorm(y) * w_post;  out = rmsnorm(residual) * w_next;  q <- q8_1 of out (if q).
    `arrival`: a uint32 counter at 0 (the kernel puts it back to 0); dispatches separated by a
    barrier may share it. residual / out / q start at element / block 0."""

    w_post: Binding
    residual: Binding
    w_next: Binding
    out: Binding
    arrival: Binding
    eps: float
    q: Binding | None = None


@dataclass
class RopeTail:
    """QK-norm + RoPE + KV-cache write after the decode fused QKV matvec, per head, by the last
    workgroup to finish the head's rows (epilogue "rope"; the maths of ops_rope.rope_kv).
    `arrival`: n_heads + 2 * n_kv_heads uint32 counters at 0 (the kernel leaves them 0)."""

    step: Binding
    q_norm: Binding
    k_norm: Binding
    k_cache: Binding
    v_cache: Binding
    arrival: Binding
    head_dim: int
    n_heads: int
    n_kv_heads: int
    cache_slots: int
    theta: float
    scale_factor: float
    eps: float

    def push_fields(self) -> dict[str, float]:
        """Its part of the rope epilogue's push constants (pipelines.MATVEC_ROPE_PUSH)."""
        return dict(
            head_dim=self.head_dim,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            cache_slots=self.cache_slots,
            theta=self.theta,
            pos_scale=1.0 / self.scale_factor,
            eps=self.eps,
        )


# the longest x each prologue makes in shared memory (matvec.comp's PRO_MAX_BLOCKS * 32): Gemma 3
# 27B's hidden size (the norm_add's x, staged in f32 too) and its 21504-wide down input
PRO_MAX_COLS = {"norm_add": 5376, "quant": 21504}


@dataclass
class Prologue:
    """The op before a decode matvec, run by each of its workgroups into shared memory instead
    of in a dispatch of its own (matvec.comp's PRO_*): kind "norm_add" (res_out = res_in +
    rmsnorm(pin) * w_post; x = q8_1 of rmsnorm(res_out) * w_next, workgroup 0 writing res_out)
    or "quant" (x = q8_1 of pin). `groups`: workgroups launched, each striding over the row
    groups (0: one per row group)."""

    kind: Literal["norm_add", "quant"]
    pin: Binding
    groups: int = 0
    res_in: Binding | None = None
    w_post: Binding | None = None
    w_next: Binding | None = None
    res_out: Binding | None = None
    eps: float = 0.0

    @property
    def suffix(self) -> str:
        return PRO_SUFFIX[self.kind]


def prologue_ok(mats: list[WeightMatrix], epilogue: str | None, kind: str) -> str:
    """Why a prologue of `kind` cannot go with this matvec ("" where it can)."""
    m = mats[0]
    if m.cols % 32 or m.cols > PRO_MAX_COLS[kind]:
        return f"x of {m.cols} values (a {kind} prologue makes at most {PRO_MAX_COLS[kind]}, in whole q8_1 blocks)"
    if any(len(w.tensor.ranges) > 1 for w in mats):
        return "a matrix bound in several row ranges"
    name = variant_name(m.qtype, epilogue, True, mats[2].qtype if len(mats) == 3 else None)
    if name + PRO_SUFFIX[kind] not in VARIANTS:
        return f"no {kind} prologue kernel for {m.qtype.name} with the {epilogue or 'plain'} epilogue"
    return ""


def rope_tail_ok(spec: Spec, head_dim: int) -> bool:
    """Every workgroup's rows lie in one head."""
    return head_dim % rows_per_group(spec) == 0


OUT_Q8_1_MAX_ROWS = 256  # rows one workgroup holds for the q8_1 step (matvec.comp)


def out_q8_1_ok(spec: Spec, rows: int) -> bool:
    """The GEGLU matvec can write y's q8_1 blocks itself: a workgroup's rows are whole blocks, or
    a whole number of workgroups makes a block (they count in the block's arrival counter)."""
    g = rows_per_group(spec)
    return rows % 32 == 0 and (g % 32 == 0 and g <= OUT_Q8_1_MAX_ROWS or 32 % g == 0)


def regs_ok(m: WeightMatrix, x_off: int = 0) -> bool:
    return m.qtype.name in PAIR_TYPES and m.cols % 64 == 0 and x_off % 4 == 0


def fusable(mats: list[WeightMatrix]) -> bool:
    """One dispatch can run these matrices: a shared column count and one type, or a QKV whose
    v alone has another type that has a kernel (MIXED_QKV_TYPES)."""
    if len({m.cols for m in mats}) != 1:
        return False
    types = [m.qtype.name for m in mats]
    return len(set(types)) == 1 or (len(mats) == 3 and types[0] == types[1] and (types[0], types[2]) in MIXED_QKV_TYPES)


def variant_name(qtype: QType, epilogue: str | None, int_dot: IntDot, v_qtype: QType | None = None) -> str:
    """int_dot: False (f32 x), True (q8_1 x from record_quantize) or "regs" (f32 x, int8 dot).
    v_qtype: the third matrix's type where it differs (a mixed QKV)."""
    atype = "f32q" if int_dot == "regs" else ("q8_1" if int_dot else "f32")
    return matvec_name(qtype.name, atype, f"_{epilogue}" if epilogue else "", None if v_qtype is None else v_qtype.name)


def record_quantize(cl: CommandList, dev: Device, x: Binding, xq: Binding, n: int, x_off: int = 0) -> None:
    """xq <- q8_1 blocks of x[x_off : x_off + n] (n a multiple of 32)."""
    wg = 32  # one invocation per block of 32 values
    p = dev.pipeline("quantize_q8_1", WG=wg)
    cl.dispatch(p, [x, xq], groups_2d(-(-n // (32 * wg))), p.push.pack(n=n, x_off=x_off))


def q8_1_bytes(n: int) -> int:
    return -(-n // 32) * 40


def record_matvec(
    cl: CommandList,
    dev: Device,
    mats: list[WeightMatrix],
    x: Binding,
    y: Binding,
    *,
    x_off: int = 0,
    y_off: int = 0,
    epilogue: str | None = None,
    res: Binding | None = None,
    res_off: int = 0,
    int_dot: IntDot = False,
    tokens: int = 1,
    x_stride: int = 0,
    y_stride: int = 0,
    spec: Spec | None = None,
    tail: NormTail | None = None,
    y_q8_1: Binding | None = None,
    arrival: Binding | None = None,
    rope: RopeTail | None = None,
    columns: int = 1,
    pro: Prologue | None = None,
) -> None:
    """Record y[y_off + r] = (W x)[r] for the rows of `mats` concatenated (fused QKV when 3).

    epilogue: None | "add" (y = res + Wx) | "geglu" (mats = [gate, up]: y = gelu(gate x) * up x)
    | "norm" (y = Wx, then `tail`, the norm_add over all of y, in the same dispatch: one matrix
    in one binding, one token; the last workgroup to finish runs it)
    | "rope" (fused [q, k, v] at y_off 0, one token, then `rope` per head: see RopeTail)
    | "geglu_q8_1" (geglu that also writes y's q8_1 blocks into `y_q8_1`, for an int8 down matvec:
    one token, y_off 0, a workgroup shape per `out_q8_1_ok`; `arrival`: rows / 32 uint32 counters
    at 0, which the kernel leaves at 0, needed where several workgroups share a block).
    int_dot: x is a q8_1 buffer from `record_quantize` and x_off counts its blocks;
    int_dot="regs": x is f32 and quantized in registers (Q4_0/Q8_0 with n_cols % 64 == 0 only).
    tokens > 1: the same product for `tokens` vectors (workgroup z), x and y (and the residual)
    advancing by x_stride / y_stride per token (prefill without a GEMM kernel).
    columns > 1 (instead of tokens; f32 x, plain or geglu, up to MAX_COLUMNS): the product for
    `columns` vectors in one pass over the weights (a few tokens: speculative verify, short prompts).
    pro (decode, one token, int_dot True, epilogue None / "geglu" / "rope"): x is made by each
    workgroup from `pro` (see Prologue; `x` is not read), the row groups strided over
    `pro.groups` workgroups.
    Every matrix must share one type and column count. No barrier is recorded.
    """
    if not 1 <= len(mats) <= 3:
        raise ValueError("1 to 3 matrices")
    qtype, cols = mats[0].qtype, mats[0].cols
    if not fusable(mats):
        raise ValueError(
            "fused matrices must share column count and type (or be a QKV whose v type "
            f"has a kernel: {MIXED_QKV_TYPES}), not {[m.qtype.name for m in mats]}"
        )
    v_qtype = mats[2].qtype if len(mats) == 3 else None
    if v_qtype not in (None, qtype) and (epilogue not in (None, "rope") or int_dot == "regs"):
        raise ValueError(
            f"a mixed-type QKV has the plain and rope epilogues, int8 from q8_1 blocks or f32 x; "
            f"not {epilogue!r} with int_dot={int_dot!r}"
        )
    if epilogue in ("geglu", "geglu_q8_1") and (len(mats) != 2 or mats[0].rows != mats[1].rows):
        raise ValueError("geglu takes [gate, up] of equal shape")
    spec = spec or default_spec(dev)
    if columns > 1:
        if not columns <= MAX_COLUMNS or int_dot or epilogue not in (None, "geglu") or tokens != 1:
            raise ValueError(
                f"columns: 2..{MAX_COLUMNS} vectors of f32 x, plain or geglu, one token each "
                f"(not {columns} with int_dot={int_dot!r}, epilogue {epilogue!r}, tokens {tokens})"
            )
        spec = columns_spec(dev, columns)
    if epilogue == "geglu_q8_1":
        if y_q8_1 is None or tokens != 1 or y_off or not out_q8_1_ok(spec, mats[0].rows):
            raise ValueError(
                "geglu_q8_1 takes one token at y_off 0, a y_q8_1 buffer and row groups that make "
                f"whole q8_1 blocks (rows {mats[0].rows}, {rows_per_group(spec)} per workgroup)"
            )
        if arrival is None and rows_per_group(spec) < 32:
            raise ValueError("geglu_q8_1 with workgroups sharing a block needs block arrival counters")
        res = y_q8_1
    if int_dot == "regs" and not regs_ok(mats[0], x_off):
        raise ValueError("in-register quantization needs Q4_0/Q8_0, n_cols % 64 == 0 and x_off % 4 == 0")
    if pro is not None:
        _record_with_prologue(cl, dev, mats, y, epilogue=epilogue, int_dot=int_dot, spec=spec, rope=rope, pro=pro)
        return
    if spec.get("THREAD_ROWS") and len(mats) == 1 and not int_dot:
        spec = {**spec, "MATS": 1}  # one matrix: the kernel compiles without W1's and W2's decoders
    p = dev.pipeline(variant_name(qtype, epilogue, int_dot, v_qtype), **spec)
    d = dummy(dev)
    resb = res if res is not None else d
    if epilogue == "rope":
        if (
            rope is None
            or len(mats) != 3
            or tokens != 1
            or y_off
            or any(len(m.tensor.ranges) > 1 for m in mats)
            or not rope_tail_ok(spec, rope.head_dim)
        ):
            raise ValueError(
                "the rope epilogue takes fused [q, k, v] in one binding each, one token at y_off 0, "
                f"a RopeTail and workgroups within one head ({rows_per_group(spec)} rows per group, "
                f"head_dim {None if rope is None else rope.head_dim})"
            )
        r = rope
        push = p.push.pack(
            n_cols=cols,
            rows0=mats[0].rows,
            rows1=mats[1].rows,
            rows2=mats[2].rows,
            x_off=x_off,
            y_off=0,
            res_off=0,
            x_stride=0,
            y_stride=0,
            **r.push_fields(),
        )
        binds = [
            x,
            y,
            *(m.tensor.ranges[0] for m in mats),
            d,
            r.step,
            r.q_norm,
            r.k_norm,
            r.k_cache,
            r.v_cache,
            r.arrival,
        ]
        cl.dispatch(p, binds, groups_2d(-(-sum(m.rows for m in mats) // rows_per_group(spec))), push)
        return
    if epilogue == "norm":
        # one dispatch must produce all of y: its last workgroup normalizes the whole row
        if tail is None or len(mats) != 1 or len(mats[0].tensor.ranges) > 1 or tokens != 1:
            raise ValueError("the norm epilogue takes one matrix in one binding, one token and a NormTail")
        m = mats[0]
        push = p.push.pack(
            n_cols=cols,
            rows0=m.rows,
            rows1=0,
            rows2=0,
            x_off=x_off,
            y_off=y_off,
            res_off=0,
            x_stride=0,
            y_stride=0,
            eps=tail.eps,
            q8=int(tail.q is not None),
        )
        binds = [
            x,
            y,
            m.tensor.ranges[0],
            d,
            d,
            tail.residual,
            tail.w_post,
            tail.w_next,
            tail.out,
            tail.q if tail.q is not None else d,
            tail.arrival,
        ]
        cl.dispatch(p, binds, groups_2d(-(-m.rows // rows_per_group(spec))), push)
        return
    if len(mats) == 1 and len(mats[0].tensor.ranges) > 1:
        for rr in mats[0].tensor.ranges:  # one dispatch per bound row range
            push = p.push.pack(
                n_cols=cols,
                rows0=rr.rows,
                rows1=0,
                rows2=0,
                x_off=x_off,
                y_off=y_off + rr.row_start,
                res_off=res_off + rr.row_start,
                x_stride=x_stride,
                y_stride=y_stride,
            )
            gx, gy, _ = groups_2d(-(-rr.rows // rows_per_group(spec)))
            cl.dispatch(p, [x, y, rr, d, d, resb], (gx, gy, tokens), push)
        return
    if any(len(m.tensor.ranges) > 1 for m in mats):
        raise ValueError("fused matrices must each fit one binding")
    w_binds = [m.tensor.ranges[0] for m in mats] + [d] * (3 - len(mats))
    rows = [m.rows for m in mats] + [0] * (3 - len(mats))
    total = rows[0] if epilogue in ("geglu", "geglu_q8_1") else sum(rows)
    push = p.push.pack(
        n_cols=cols,
        rows0=rows[0],
        rows1=rows[1],
        rows2=rows[2],
        x_off=x_off,
        y_off=y_off,
        res_off=res_off,
        x_stride=x_stride,
        y_stride=y_stride,
    )
    gx, gy, _ = groups_2d(-(-total // rows_per_group(spec)))
    extra = [arrival if arrival is not None else d] if epilogue == "geglu_q8_1" else []
    cl.dispatch(p, [x, y, *w_binds, resb, *extra], (gx, gy, tokens), push)


def _record_with_prologue(
    cl: CommandList,
    dev: Device,
    mats: list[WeightMatrix],
    y: Binding,
    *,
    epilogue: str | None,
    int_dot: IntDot,
    spec: Spec,
    rope: RopeTail | None,
    pro: Prologue,
) -> None:
    """record_matvec with a Prologue: bindings 0-11 as the epilogue's (x unread), 12-16 the
    prologue's; row groups strided over min(pro.groups, row groups) workgroups."""
    if int_dot is not True or epilogue not in (None, "geglu", "rope"):
        raise ValueError(f"a prologue makes q8_1 x for the plain, geglu or rope matvec, not {epilogue!r} / {int_dot!r}")
    if pro.kind == "norm_add" and None in (pro.res_in, pro.w_post, pro.w_next, pro.res_out):
        raise ValueError("the norm_add prologue needs res_in, w_post, w_next and res_out")
    if pro.res_in is not None and pro.res_in is pro.res_out:
        raise ValueError("the norm_add prologue reads the residual from one buffer and writes another")
    why = prologue_ok(mats, epilogue, pro.kind)
    if why:
        raise ValueError(f"no {pro.kind} prologue here: {why}")
    if epilogue == "rope" and (rope is None or len(mats) != 3 or not rope_tail_ok(spec, rope.head_dim)):
        raise ValueError("the rope epilogue takes fused [q, k, v], a RopeTail and workgroups within one head")
    d = dummy(dev)
    v_qtype = mats[2].qtype if len(mats) == 3 else None
    p = dev.pipeline(variant_name(mats[0].qtype, epilogue, True, v_qtype) + pro.suffix, **spec)
    rows = [m.rows for m in mats] + [0] * (3 - len(mats))
    fields = dict(
        n_cols=mats[0].cols,
        rows0=rows[0],
        rows1=rows[1],
        rows2=rows[2],
        x_off=0,
        y_off=0,
        res_off=0,
        x_stride=0,
        y_stride=0,
        pro_eps=pro.eps,
    )
    w_binds = [m.tensor.ranges[0] for m in mats] + [d] * (3 - len(mats))
    if rope is not None and epilogue == "rope":
        r = rope
        fields.update(r.push_fields())
        binds = [d, y, *w_binds, d, r.step, r.q_norm, r.k_norm, r.k_cache, r.v_cache, r.arrival]
    else:
        binds = [d, y, *w_binds] + [d] * 7
    binds += [pro.pin, *(b if b is not None else d for b in (pro.res_in, pro.w_post, pro.w_next, pro.res_out))]
    total = rows[0] if epilogue == "geglu" else sum(rows)
    n_groups = -(-total // rows_per_group(spec))
    launched = min(pro.groups, n_groups) if pro.groups else n_groups
    cl.dispatch(p, binds, groups_2d(launched), p.push.pack(**fields))
