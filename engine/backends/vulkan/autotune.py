"""Every load-time choice made by timing, and its results in one record (`Tuning`).

On GPUs the matvec path (f32 / int8 / int8 quantized in registers) and workgroup shape are
chosen per matrix shape (`autotune_matvecs`), then the decode fusions across ops (the GEGLU
writing down's q8_1 input, the QKV matvec running the rope: `choose_geglu_q8_1`,
`choose_qkv_rope`) and the path of forwards of a few tokens and of the batched decode step
(`choose_few_token_path`: GEMM, f32 or int8 multi-column matvec), and whether decode's
norm_adds run as the next matvec's prologue (`choose_prologue`), each by
timing the candidates on the model's own matrices. Untuned devices (CPU Vulkan) keep the
defaults and take each fusion wherever it applies. The graph (gemma3_graph.py) reads the record;
these functions record candidates through the graph's public methods.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias

from phoenix_chat.engine.backends.vulkan import ops_gemm, ops_norm, timing
from phoenix_chat.engine.backends.vulkan.matvec import (
    MAX_COLUMNS,
    REGS_SPEC,
    NormTail,
    WeightMatrix,
    default_spec,
    fusable,
    out_q8_1_ok,
    record_quantize,
    regs_ok,
    rope_tail_ok,
)
from phoenix_chat.engine.backends.vulkan.matvec_cols import cols_ok, cols_spec, record_matvec_cols
from phoenix_chat.engine.backends.vulkan.memory import Buffer
from phoenix_chat.engine.backends.vulkan.ops_common import write_step
from phoenix_chat.engine.backends.vulkan.pipelines import INT_DOT_TYPES
from phoenix_chat.engine.backends.vulkan.recorder import CommandList

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.device import Capabilities, Device
    from phoenix_chat.engine.backends.vulkan.gemma3_graph import Gemma3Graph
    from phoenix_chat.engine.backends.vulkan.resident import Layer

FEW_TOKENS = 32  # forwards of at most this many tokens take tuning.gemm_kernel_few (a short turn, a batched step)
# token counts each weight shape's few-token tile is timed for (`few_tile_counts`): on the H100 the
# 27B gate/up tile chosen for 32 tokens took 135 µs for 8 where another took 98
FEW_TILE_COUNTS = (8, 16, FEW_TOKENS)
TUNE_LAYERS = 8  # layers the load-time timing cycles through (`tuning_layers`)

# a matvec workgroup shape: its specialization constants (matvec.default_spec)
Spec: TypeAlias = dict[str, int]
# a matvec's activations: f32 (False), q8_1 blocks (True) or f32 quantized in registers ("regs")
IntDot: TypeAlias = bool | Literal["regs"]


class MatvecChoice(NamedTuple):
    """The fastest candidate timed for one matvec key."""

    us: float
    int_dot: IntDot
    spec: Spec | None  # None: the default shape (matvec.default_spec)


# (key, use_tail, str(int_dot), spec index): one timed matvec candidate
_Candidate: TypeAlias = tuple[str, bool, str, int]


@dataclass
class Tuning:
    """The load-time choices. Empty timings: that choice was not timed (untuned device)."""

    matvec: dict[str, MatvecChoice] = field(default_factory=dict)  # key -> the fastest candidate
    # key -> run the following norm_add in the matvec's last workgroup
    norm_tail: dict[str, bool] = field(default_factory=dict)
    # (int_dot, spec) of a decode GEGLU that also writes mlp's q8_1 blocks for the int8 down
    # matvec (no quantize dispatch between them), or None
    geglu_q8_1: tuple[IntDot, Spec] | None = None
    geglu_q8_1_timing: dict[str, float] = field(default_factory=dict)
    # (int_dot, spec) of a decode QKV matvec whose last workgroup per head runs QK-norm +
    # RoPE + the KV write (no rope dispatch), or None
    qkv_rope: tuple[IntDot, Spec] | None = None
    qkv_rope_timing: dict[str, float] = field(default_factory=dict)
    # decode: the norm_adds and the down's quantize run by the matvecs after them (matvec.Prologue)
    # with this many workgroups striding over each such matvec's rows (0: one per row group),
    # or None: separate dispatches (`choose_prologue`)
    prologue_groups: int | None = None
    prologue_spec: Spec | None = None  # their workgroup shape (None: each matvec's tuned one)
    prologue_down: bool = True  # the down quantizes its input too (else a quantize dispatch)
    prologue_timing: dict[str, float] = field(default_factory=dict)  # "off" / "<groups>" -> µs a decode step
    prologue_note: str = ""  # why the prologues were not timed or not taken
    # token counts (2..MAX_COLUMNS) whose forwards take the f32 multi-column matvecs, not the GEMMs
    few_token_matvec: frozenset[int] = frozenset()
    # token counts (2..FEW_TOKENS) whose forwards (and batched decode steps of that many rows)
    # take the multi-column int8 matvecs (matvec_cols.py); before few_token_matvec
    few_token_int8: frozenset[int] = frozenset()
    # matvec key -> timed token count -> the int8 multi-column workgroup shape (rows per
    # subgroup, column tile: `choose_cols_specs`); a count between timed ones takes the next
    # timed count's; absent: matvec_cols.cols_spec's default
    cols_specs: dict[str, dict[int, Spec]] = field(default_factory=dict)
    cols_timing: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    few_token_timing: dict[int, dict[str, float]] = field(default_factory=dict)
    # the prefill GEMM kernel (ops_gemm.KERNELS) or None: the device's own (ops_gemm.kernel)
    gemm_kernel: str | None = None
    gemm_timing: dict[str, float] = field(default_factory=dict)  # kernel -> ms of one prefill chunk
    # the GEMM kernel of forwards of at most FEW_TOKENS tokens (a short turn, a batched decode
    # step) or None: gemm_kernel's
    gemm_kernel_few: str | None = None
    gemm_few_timing: dict[str, float] = field(default_factory=dict)  # kernel -> ms of a FEW_TOKENS forward
    # the same per weight shape, timed on the shape's own matrices for each count of
    # `few_tile_counts` (gemm_tuning.choose_gemm_kernels(few=True)): count -> key -> kernel,
    # count -> key -> kernel -> µs; a forward of T tokens takes the smallest count >= T
    gemm_kernels_few: dict[int, dict[str, str]] = field(default_factory=dict)
    gemm_shape_timing_few: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)

    # full prefill chunks per weight shape (gemm_tuning.shape_key -> kernel; gemm_tuning.py)
    gemm_kernels: dict[str, str] = field(default_factory=dict)
    gemm_shape_timing: dict[str, dict[str, float]] = field(default_factory=dict)  # key -> kernel -> µs
    gemm_kernels_note: str = ""  # why no shape was timed on a GPU (no matrix cores, no scratch memory)

    def few_count(self, tokens: int) -> int | None:
        """The timed count whose per-shape few-token tiles a forward of `tokens` tokens takes:
        the smallest >= tokens (the largest where none is); None above FEW_TOKENS or untimed."""
        counts = sorted(self.gemm_kernels_few)
        if tokens > FEW_TOKENS or not counts:
            return None
        return next((c for c in counts if c >= tokens), counts[-1])

    def few_shape_choice(self, tokens: int, shape: str) -> tuple[str | None, dict[str, float]]:
        """(the tile, its candidates' µs) timed for `shape` at few_count(tokens), or (None, {})."""
        c = self.few_count(tokens)
        if c is None:
            return None, {}
        return self.gemm_kernels_few[c].get(shape), self.gemm_shape_timing_few.get(c, {}).get(shape, {})

    def gemm_kernel_for(self, tokens: int, shape: str | None = None) -> str | None:
        """The GEMM kernel a forward of `tokens` tokens runs for a weight of `shape`
        (gemm_tuning.shape_key): the shape's own tile where one was timed (for a few tokens, at
        the count `few_count` picks), else the forward's."""
        kn = self.few_shape_choice(tokens, shape)[0] if shape is not None else None
        if kn is not None:
            return kn
        if tokens <= FEW_TOKENS and self.gemm_kernel_few is not None:
            return self.gemm_kernel_few
        if shape is not None and shape in self.gemm_kernels:
            return self.gemm_kernels[shape]
        return self.gemm_kernel

    def cols_spec_for(self, dev: Device, key: str | None, tokens: int) -> Spec:
        """The int8 multi-column matvec's workgroup shape for matvec `key` and `tokens` vectors."""
        timed = self.cols_specs.get(key or "", {})
        if not timed:
            return cols_spec(dev, tokens)
        above = [T for T in sorted(timed) if T >= tokens]
        return timed[above[0] if above else max(timed)]

    def stats(self) -> dict[str, Any]:
        """The choices (and their timings, where timed) as JSON-serialisable stats keys."""
        out: dict[str, Any] = {
            "matvec_tuning": {
                k: {
                    "us": round(v.us, 1),
                    "int8": v.int_dot,
                    **(v.spec or {}),
                    **({"norm_tail": self.norm_tail[k]} if k in self.norm_tail else {}),
                }
                for k, v in self.matvec.items()
            }
        }
        out["qkv_rope"] = None if self.qkv_rope is None else {"int8": self.qkv_rope[0], **self.qkv_rope[1]}
        if self.qkv_rope_timing:
            out["qkv_rope_timing"] = self.qkv_rope_timing
        out["prologue_groups"] = self.prologue_groups
        out["prologue_spec"] = self.prologue_spec
        out["prologue_down"] = self.prologue_down
        if self.prologue_timing:
            out["prologue_timing"] = self.prologue_timing
        if self.prologue_note:
            out["prologue_note"] = self.prologue_note
        out["geglu_q8_1"] = None if self.geglu_q8_1 is None else {"int8": self.geglu_q8_1[0], **self.geglu_q8_1[1]}
        if self.geglu_q8_1_timing:
            out["geglu_q8_1_timing"] = self.geglu_q8_1_timing
        out["gemm_kernel"] = self.gemm_kernel
        if self.gemm_timing:
            out["gemm_timing"] = self.gemm_timing
        if self.gemm_kernels:
            out["gemm_kernels"] = self.gemm_kernels
            out["gemm_shape_timing"] = self.gemm_shape_timing
        if self.gemm_kernels_note:
            out["gemm_kernels_note"] = self.gemm_kernels_note
        out["gemm_kernel_few"] = self.gemm_kernel_few
        if self.gemm_few_timing:
            out["gemm_few_timing"] = self.gemm_few_timing
        if self.gemm_kernels_few:
            out["gemm_kernels_few"] = self.gemm_kernels_few
            out["gemm_shape_timing_few"] = self.gemm_shape_timing_few
        out["few_token_matvec"] = sorted(self.few_token_matvec)
        out["few_token_int8"] = sorted(self.few_token_int8)
        if self.cols_specs:  # "r<rows per subgroup>t<column tile>"
            out["cols_specs"] = {
                k: {T: spec_label(s) for T, s in sorted(v.items())} for k, v in self.cols_specs.items()
            }
        if self.cols_timing:
            out["cols_timing"] = self.cols_timing
        if self.few_token_timing:
            out["few_token_timing"] = self.few_token_timing
        return out


def few_tile_counts(few: int) -> list[int]:
    """The token counts each weight shape's few-token tile is timed for, up to `few` (FEW_TOKENS,
    or less in a short context) and `few` itself: FEW_TILE_COUNTS, or the comma-separated
    PHOENIX_VULKAN_FEW_TILE_COUNTS (for comparisons: "32" times one count, as before)."""
    raw = os.environ.get("PHOENIX_VULKAN_FEW_TILE_COUNTS")
    counts: tuple[int, ...] = FEW_TILE_COUNTS
    if raw:
        try:
            counts = tuple(int(c) for c in raw.split(","))
        except ValueError:
            raise ValueError(f"PHOENIX_VULKAN_FEW_TILE_COUNTS={raw!r}: comma-separated token counts") from None
        if not all(2 <= c <= FEW_TOKENS for c in counts):
            raise ValueError(f"PHOENIX_VULKAN_FEW_TILE_COUNTS={raw!r}: counts from 2 to {FEW_TOKENS}")
    return sorted({c for c in counts if c < few} | {few})


def spec_label(spec: Spec) -> str:
    """A multi-column shape's short name: r<rows per subgroup>t<column tile>."""
    return f"r{spec['ROWS']}t{spec['NCOLS']}"


def tune(graph: Gemma3Graph, *, time_matvecs: bool) -> None:
    """Fill graph.tuning: matvec paths (where `time_matvecs`), then the decode fusions."""
    if time_matvecs:
        autotune_matvecs(graph)
    graph.tuning.geglu_q8_1 = choose_geglu_q8_1(graph)
    graph.tuning.qkv_rope = choose_qkv_rope(graph)
    choose_prologue(graph)


# workgroups a matvec with a prologue is launched with, timed at load: each workgroup redoes the
# norm over the whole row, so a few big ones striding over the rows (bench.persistent_chain on an
# H100: 132-528 of 512 invocations). On an H200 (27B) one per row group of the tuned
# 128-invocation shapes made a step 4.8x slower; of the 512- and 1024-invocation shapes at 64-512
# workgroups the 1024 ones at 128 came closest, 7-11 % slower than the separate dispatches.
PROLOGUE_GROUPS = (64, 128, 256)
PROLOGUE_MARGIN = 0.98  # taken where a decode step times at least 2 % faster


def prologue_specs(caps: Capabilities) -> list[Spec]:
    """The workgroup shape timed for the matvecs with a prologue: as many invocations as the
    device allows, up to 1024 and 64 subgroups, each subgroup owning its rows, 32 rows a group
    (64 at 8-lane subgroups)."""
    sg = max(8, min(64, caps.subgroup_size))
    wg = min(1024, caps.max_workgroup_invocations, 64 * sg)
    n_sg = wg // sg
    return [{"WG": wg, "ROWS": max(1, 32 // n_sg), "THREAD_ROWS": 0, "SUBGROUP_ROWS": n_sg}]


def choose_prologue(graph: Gemma3Graph) -> None:
    """Decode's norm_adds and the down's quantize as the prologues of the matvecs after them
    (matvec.Prologue: 3 dispatches and barriers a layer fewer) or as dispatches of their own:
    decode steps of TUNE_LAYERS layers (all 62 of a 27B cost seconds of recording at load) timed
    both ways, the prologues with each of PROLOGUE_GROUPS and `prologue_specs`, the down's
    quantize folded or not, on tuned devices. Sets tuning.prologue_groups (None: separate),
    prologue_spec and prologue_down, and says in prologue_note why none is taken. A norm run as
    a matvec's tail (tuning.norm_tail) gives way to the prologues where they win.
    PHOENIX_VULKAN_PROLOGUE=0 refuses them (for comparisons)."""
    tuning, dev = graph.tuning, graph.dev
    tuning.prologue_groups, tuning.prologue_timing = None, {}
    if os.environ.get("PHOENIX_VULKAN_PROLOGUE") == "0":
        tuning.prologue_note = "refused (PHOENIX_VULKAN_PROLOGUE=0)"
        return
    if "o" not in tuning.matvec:
        tuning.prologue_note = "not timed on an untuned device: separate dispatches"
        return
    tails = dict(tuning.norm_tail)
    folded = {**tails, "o": False, "down": False}
    tuning.norm_tail, tuning.prologue_groups = folded, 0
    why = graph.prologue_refusal()
    tuning.norm_tail, tuning.prologue_groups = tails, None
    if why:
        tuning.prologue_note = f"not applicable: {why}"
        return

    Shape = tuple[int | None, Spec | None, bool]  # groups, spec, down folded

    def step(shape: Shape, norm_tail: dict[str, bool]) -> Callable[[CommandList], None]:
        def record(cl: CommandList) -> None:
            tuning.prologue_groups, tuning.prologue_spec, tuning.prologue_down = shape
            tuning.norm_tail = norm_tail
            graph.record_decode_layers(cl, TUNE_LAYERS)

        return record

    shapes: dict[str, Shape] = {
        f"{g}x{s['WG']}{'' if down else ',down apart'}": (g, s, down)
        for s in prologue_specs(dev.caps)
        for g in PROLOGUE_GROUPS
        for down in (True, False)
    }
    records = {"off": step((None, None, True), tails), **{k: step(sh, folded) for k, sh in shapes.items()}}
    write_step(graph.buffers.step, pos=min(graph.context_length - 1, 512), n_tokens=1)
    try:
        times = timing.time_many(dev, records, reps=6)
    finally:
        tuning.prologue_groups, tuning.prologue_spec, tuning.prologue_down = None, None, True
        tuning.norm_tail = tails
    tuning.prologue_timing = {k: round(us, 1) for k, us in times.items()}
    best = min(shapes, key=times.__getitem__)
    if times[best] < times["off"] * PROLOGUE_MARGIN:
        tuning.prologue_groups, tuning.prologue_spec, tuning.prologue_down = shapes[best]
        tuning.norm_tail, tuning.prologue_note = folded, ""
    else:
        tuning.prologue_note = f"separate dispatches timed faster ({times['off']:.0f} against {times[best]:.0f} µs)"


def tuning_layers(graph: Gemma3Graph, pick: Callable[[Layer], list[WeightMatrix]]) -> list[int]:
    """Layers whose matrices `pick(L)` match layer 0's in type and shape, up to TUNE_LAYERS:
    the timed candidates cycle through them, so each repeat reads its weights from memory
    as a decode step does (one matrix repeated stays partly in a big GPU's L2: an H100 read
    a 27B QKV at 2.6 TB/s that way against 1.8 from memory, and ranked shapes differently)."""
    layers = graph.weights.layers
    sig = [(m.qtype, m.rows, m.cols) for m in pick(layers[0])]
    return [i for i, L in enumerate(layers) if [(m.qtype, m.rows, m.cols) for m in pick(L)] == sig][:TUNE_LAYERS]


class MatvecCase(NamedTuple):
    """One matvec shape the autotuner times (`matvec_cases`)."""

    rotation: list[list[WeightMatrix]]  # the matrices, one list per tuning layer
    x: Buffer
    y: Buffer
    x_cols: int
    y_cols: int
    epilogue: str | None


def matvec_cases(graph: Gemma3Graph) -> dict[str, MatvecCase]:
    """key -> (matrix lists, one per tuning layer, x, y, x_cols, y_cols, epilogue)."""
    cfg, b, layers = graph.config, graph.buffers, graph.weights.layers
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    picks: dict[str, Callable[[Layer], list[WeightMatrix]]] = {
        "o": lambda L: [L.o],
        "geglu": lambda L: [L.gate, L.up],
        "down": lambda L: [L.down],
    }
    if fusable(layers[0].qkv):
        picks["qkv"] = lambda L: L.qkv
    shapes: dict[str, tuple[Buffer, Buffer, int, int, str | None]] = {
        "o": (b.attn, b.o, cfg.q_dim, H, None),
        "geglu": (b.h, b.mlp, H, I, "geglu"),
        "down": (b.mlp, b.o, I, H, None),
        "qkv": (b.h, b.qkv, H, graph.qkv_dim, None),
    }
    cases = {
        k: MatvecCase([pick(layers[i]) for i in tuning_layers(graph, pick)], *shapes[k]) for k, pick in picks.items()
    }
    lm_head = graph.weights.lm_head
    if len(lm_head.tensor.ranges) == 1:
        cases["lm"] = MatvecCase([[lm_head]], b.h, b.logits, H, V, None)
    return cases


def matvec_candidates(caps: Capabilities) -> list[Spec]:
    """The matvec workgroup shapes timed at load, in the device's subgroup size: whole
    workgroups per row group (at least one full subgroup), and subgroups owning rows, 4, 2 or
    1 subgroups per workgroup. At wave64 (RADV's compute default) that is 64..256 lanes; at
    wave32 32..128. Where the device lets a pipeline require the other AMD wave size (RDNA:
    32 and 64), the subgroup-row shapes again in that size (SUBGROUP_SIZE). CPU devices: whole
    rows per invocation, one subgroup per workgroup."""
    if caps.is_software:
        return [{"WG": caps.subgroup_size, "ROWS": 4, "THREAD_ROWS": 1, "SUBGROUP_ROWS": 0}]
    sg = max(8, min(64, caps.subgroup_size))
    out = [
        {"WG": max(32, sg), "ROWS": 4, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 0},
        {"WG": max(128, 2 * sg), "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 0},
        *subgroup_row_shapes(sg),
    ]
    for wave in other_wave_sizes(caps):
        out += [{**s, "SUBGROUP_SIZE": wave} for s in subgroup_row_shapes(wave)]
    return out


def subgroup_row_shapes(sg: int) -> list[Spec]:
    """Subgroups owning rows, 4, 2 or 1 subgroups of `sg` lanes per workgroup."""
    return [
        {"WG": 4 * sg, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4},
        {"WG": 4 * sg, "ROWS": 1, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4},
        {"WG": 2 * sg, "ROWS": 4, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 2},
        {"WG": sg, "ROWS": 4, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 1},
    ]


def other_wave_sizes(caps: Capabilities) -> list[int]:
    """AMD's two wave sizes (RDNA: 32 and 64) that a pipeline may require
    (VK_EXT_subgroup_size_control), beside the driver's default: RADV runs compute in wave64
    unless told otherwise, and which is faster for a matvec shape is for the timing to say."""
    return [w for w in (32, 64) if w != caps.subgroup_size and w in caps.compute_subgroup_sizes]


def autotune_matvecs(graph: Gemma3Graph) -> None:
    """Pick, per matvec shape of this model, the fastest kernel path (f32 / int8 activations)
    and workgroup shape on this device, by timing candidates on the real weights (~1 s)."""
    dev, cfg, b, tuning = graph.dev, graph.config, graph.buffers, graph.tuning
    specs = matvec_candidates(dev.caps)
    cases = matvec_cases(graph)
    reps = 2 if dev.caps.is_software else 10
    # The matvecs reading h get its q8_1 blocks from the norm that writes h, the o-proj its
    # input's from attention (no quantize dispatch in decode), so their int8 path is timed
    # without one; hq and attnq hold real blocks.
    cl = dev.commands()
    record_quantize(cl, dev, b.h, b.hq, cfg.hidden_size)
    record_quantize(cl, dev, b.attn, b.attnq, cfg.q_dim)
    cl.submit()
    cl.destroy()
    # o-proj and down can run the following norm_add in their last workgroup (one dispatch and
    # barrier fewer, but one workgroup of the matvec's shape does the whole norm): timed both
    # ways, the tail with each workgroup shape, the plain matvec plus a norm_add dispatch.
    L0 = graph.weights.layers[0]
    tails = {
        "o": ("post_attention_layernorm", "pre_feedforward_layernorm"),
        "down": ("post_feedforward_layernorm", "input_layernorm"),
    }
    # every candidate of every matrix recorded first, then timed in one go (timing.time_many)
    candidates: dict[_Candidate, tuple[Callable[[CommandList], None], tuple[IntDot, Spec]]] = {}
    for key, (rotation, x, y, xc, yc, epi) in cases.items():
        mats = rotation[0]
        xq = b.hq if key in ("qkv", "geglu", "lm") else (b.attnq if key == "o" else None)
        tail: NormTail | None = None
        if key in tails and len(mats[0].tensor.ranges) == 1:
            w_post, w_next = (L0.norms[n] for n in tails[key])
            tail = NormTail(w_post, b.x, w_next, b.h, b.mv_arrival, cfg.rms_norm_eps, q=b.hq)
        paths: list[IntDot] = [False]
        if graph.int_dot and all(m.qtype.name in INT_DOT_TYPES for m in mats):
            paths.append(True)
            if all(regs_ok(m) for m in mats):
                paths.append("regs")
        for use_tail in [True, False] if tail is not None else [False]:
            for int_dot in paths:
                for si, spec in enumerate(specs if int_dot != "regs" or not dev.caps.is_software else [REGS_SPEC]):

                    def record(
                        cl: CommandList,
                        layers: Iterator[list[WeightMatrix]] = itertools.cycle(rotation),
                        x: Buffer = x,
                        y: Buffer = y,
                        xc: int = xc,
                        yc: int = yc,
                        epi: str | None = epi,
                        xq: Buffer | None = xq,
                        tail: NormTail | None = tail,
                        int_dot: IntDot = int_dot,
                        spec: Spec = spec,
                        use_tail: bool = use_tail,
                    ) -> None:
                        # each repeat on the next tuning layer's matrices (tuning_layers)
                        graph.mv(
                            cl,
                            next(layers),
                            x,
                            y,
                            T=1,
                            x_cols=xc,
                            y_cols=yc,
                            epilogue=epi,
                            force=(int_dot, spec),
                            xq=xq,
                            tail=tail if use_tail else None,
                        )
                        if tail is not None and not use_tail:
                            cl.barrier()
                            ops_norm.norm_add_split(
                                cl,
                                dev,
                                y,
                                tail.w_post,
                                b.x,
                                tail.w_next,
                                b.h,
                                b.x_alt,
                                n=yc,
                                eps=cfg.rms_norm_eps,
                                q=b.hq,
                            )

                    candidates[(key, use_tail, str(int_dot), si)] = (record, (int_dot, spec))
    times = timing.time_many(dev, {k: rec for k, (rec, _) in candidates.items()}, reps=reps)
    for (key, use_tail, _i, _s), us in sorted(times.items(), key=lambda kv: kv[1]):
        if key not in tuning.matvec:
            tuning.matvec[key] = MatvecChoice(us, *candidates[(key, use_tail, _i, _s)][1])
            if key in tails and len(cases[key].rotation[0][0].tensor.ranges) == 1:
                tuning.norm_tail[key] = use_tail


def geglu_q8_1_specs(graph: Gemma3Graph) -> list[Spec]:
    """Workgroup shapes that make whole q8_1 blocks (matvec.out_q8_1_ok): the GEGLU's tuned
    shape where it qualifies (its workgroups then share blocks through arrival counters),
    and shapes of 32 rows per workgroup (no counters, but fewer workgroups)."""
    I, caps = graph.config.intermediate_size, graph.dev.caps
    tuned = graph.tuning.matvec.get("geglu")
    if caps.is_software:
        wg = caps.subgroup_size
        specs: list[Spec] = [{"WG": wg, "ROWS": max(1, 32 // wg), "THREAD_ROWS": 1, "SUBGROUP_ROWS": 0}]
    else:
        sg = max(8, min(64, caps.subgroup_size))
        specs = ([tuned.spec] if tuned and tuned.spec else []) + [default_spec(graph.dev)]
        specs += [{"WG": 4 * sg, "ROWS": r, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 32 // r} for r in (2, 4, 8)]
    out: list[Spec] = []
    for s in specs:
        if out_q8_1_ok(s, I) and s not in out:
            out.append(s)
    return out


def choose_geglu_q8_1(graph: Gemma3Graph) -> tuple[IntDot, Spec] | None:
    """Where the down matvec reads q8_1 blocks, the GEGLU before it can write them (a
    quantize dispatch and a barrier fewer per layer). Tuned devices keep it only if timing
    says so (block arrival counting, or 32-row workgroups that stream worse, can cost more
    than the dispatch saved); untuned ones (CPU Vulkan) take it whenever it applies."""
    dev, b, layers = graph.dev, graph.buffers, graph.weights.layers
    L = layers[0]
    specs = geglu_q8_1_specs(graph)
    if not specs or graph.path([L.down], "down")[0] is not True:
        return None
    int_dot, tuned_spec = graph.path([L.gate, L.up], "geglu")
    if int_dot == "regs" and dev.caps.is_software:
        return None
    if "geglu" not in graph.tuning.matvec:
        return (int_dot, specs[0])
    cfg = graph.config
    H, I = cfg.hidden_size, cfg.intermediate_size

    rotation = tuning_layers(graph, lambda L: [L.gate, L.up])

    def separate(cl: CommandList, order: Iterator[int] = itertools.cycle(rotation)) -> None:
        L = layers[next(order)]
        graph.mv(
            cl,
            [L.gate, L.up],
            b.h,
            b.mlp,
            T=1,
            x_cols=H,
            y_cols=I,
            epilogue="geglu",
            force=(int_dot, tuned_spec),
            xq=b.hq,
        )
        cl.barrier()
        record_quantize(cl, dev, b.mlp, b.xq, I)

    records: dict[str | int, Callable[[CommandList], None]] = {"separate": separate}
    for i, spec in enumerate(specs):

        def fused(cl: CommandList, spec: Spec = spec, order: Iterator[int] = itertools.cycle(rotation)) -> None:
            L = layers[next(order)]
            graph.mv(
                cl,
                [L.gate, L.up],
                b.h,
                b.mlp,
                T=1,
                x_cols=H,
                y_cols=I,
                epilogue="geglu_q8_1",
                force=(int_dot, spec),
                xq=b.hq,
                y_q8_1=b.mlpq,
            )

        records[i] = fused
    times = timing.time_many(dev, records, reps=10)
    sep_us = times.pop("separate")
    fused_us = {i: us for i, us in times.items() if isinstance(i, int)}  # by index in specs
    i = min(fused_us, key=fused_us.__getitem__)
    best = (fused_us[i], specs[i])
    graph.tuning.geglu_q8_1_timing = {"fused_us": round(best[0], 1), "geglu_and_quantize_us": round(sep_us, 1)}
    return (int_dot, best[1]) if best[0] < sep_us else None


def choose_qkv_rope(graph: Gemma3Graph) -> tuple[IntDot, Spec] | None:
    """The decode QKV matvec can run each head's rope in its last workgroup (per-head arrival
    counters) where its workgroups' rows lie within one head. Tuned devices keep it only if
    timing says so (the fused kernel in the QKV's tuned shape and in subgroup-row shapes,
    whose workgroups hold more of a head, against the tuned matvec, a barrier and the rope
    dispatch); untuned ones take it whenever it applies."""
    dev, b, layers, cfg = graph.dev, graph.buffers, graph.weights.layers, graph.config
    L, H = layers[0], cfg.hidden_size
    if not graph.qkv_fused(L):
        return None
    int_dot, spec = graph.path(L.qkv, "qkv")
    if int_dot == "regs" and spec is None:
        spec = REGS_SPEC
    spec = spec or default_spec(dev)
    if "qkv" not in graph.tuning.matvec:
        return (int_dot, spec) if rope_tail_ok(spec, cfg.head_dim) else None
    hq = b.hq if int_dot is True else None
    sg = max(8, min(64, dev.caps.subgroup_size))
    fused_specs: list[Spec] = []
    for cand in (
        [spec]
        if int_dot == "regs"
        else [spec, default_spec(dev), {"WG": 4 * sg, "ROWS": 1, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4}]
    ):
        if rope_tail_ok(cand, cfg.head_dim) and cand not in fused_specs:
            fused_specs.append(cand)
    if not fused_specs:
        return None

    rotation = tuning_layers(graph, lambda L: L.qkv)

    def separate(cl: CommandList, order: Iterator[int] = itertools.cycle(rotation)) -> None:
        i = next(order)
        graph.mv(cl, layers[i].qkv, b.h, b.qkv, T=1, x_cols=H, y_cols=graph.qkv_dim, force=(int_dot, spec), xq=hq)
        cl.barrier()
        graph.rope_kv(cl, i, 1)

    records: dict[str | int, Callable[[CommandList], None]] = {"separate": separate}
    for k, fs in enumerate(fused_specs):

        def fused(cl: CommandList, fs: Spec = fs, order: Iterator[int] = itertools.cycle(rotation)) -> None:
            i = next(order)
            graph.mv(
                cl,
                layers[i].qkv,
                b.h,
                b.qkv,
                T=1,
                x_cols=H,
                y_cols=graph.qkv_dim,
                force=(int_dot, fs),
                xq=hq,
                rope=graph.rope_tail(i),
            )

        records[k] = fused
    write_step(b.step, pos=min(graph.context_length - 1, 512), n_tokens=1)
    times = timing.time_many(dev, records, reps=10)
    sep = times.pop("separate")
    fused_us = {k: us for k, us in times.items() if isinstance(k, int)}  # by index in fused_specs
    k = min(fused_us, key=fused_us.__getitem__)
    graph.tuning.qkv_rope_timing = {"fused_us": round(fused_us[k], 1), "qkv_and_rope_us": round(sep, 1)}
    return (int_dot, fused_specs[k]) if fused_us[k] < sep else None


def _best_forward_ms(backend: VulkanBackend, ids: list[int], repeats: int, *, all_logits: bool) -> float:
    """Best of `repeats` timed forwards of `ids` at position 0, after one that records the
    command list and builds its pipelines (not timed)."""
    backend.forward(ids, 0, all_logits=all_logits)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        backend.forward(ids, 0, all_logits=all_logits)
        times.append(time.perf_counter() - t)
    return round(1e3 * min(times), 2)


def choose_gemm_tile(backend: VulkanBackend, tokens: int, repeats: int = 2, few: bool = False) -> str | None:
    """Time a forward of `tokens` through each matrix-core GEMM tile (ops_gemm.CM_TILES) and
    return the fastest kernel name, or None where the device has no matrix-core GEMM (it keeps
    its own kernel). A bigger tile dequantizes each weight tile for more tokens but fills fewer
    workgroups, and for a few tokens computes mostly padding: which wins depends on the GPU, the
    model's shapes and the token count, so it is measured — for full prefill chunks
    (tuning.gemm_kernel) and, with `few`, for forwards of at most FEW_TOKENS (gemm_kernel_few)."""
    if not ops_gemm.coopmat_ok(backend.dev):
        return None
    tuning = backend.tuning
    ids = [backend.config.bos_token_id] * tokens
    ms: dict[str, float] = {}
    for name in ops_gemm.COOPMAT_KERNELS:
        if few:
            tuning.gemm_kernel_few = name
        else:
            tuning.gemm_kernel = name
        backend.drop_recordings()
        ms[name] = _best_forward_ms(backend, ids, repeats, all_logits=False)
    backend.drop_recordings()
    if few:
        tuning.gemm_few_timing = ms
    else:
        tuning.gemm_timing = ms
    return min(ms, key=ms.__getitem__)


TIMED_COUNTS = (2, 4, 8, 16, 32)  # token counts choose_few_token_path times (the batched step's buckets)
FEW_PATHS = ("gemm", "matvec", "int8")  # the GEMMs, the f32 and the int8 multi-column matvecs
# (rows per subgroup, column tile) shapes choose_cols_specs times: measured on the H100 (27B/4B
# shapes, bench.cols_sweep) the best was always one of these; 4 rows per subgroup never won
COLS_CANDIDATES = ((1, 4), (2, 4), (1, 8), (2, 8), (2, 16))


def choose_cols_specs(graph: Gemma3Graph, counts: Sequence[int] = TIMED_COUNTS, reps: int = 6) -> None:
    """Per matvec shape of this model (matvec_cases) and token count, the fastest workgroup
    shape of the int8 multi-column matvec (rows per subgroup x column tile; a tile wider than
    twice the count only idles registers, so it is skipped), by timing each on the model's own
    matrices (rotating through the tuning layers, as autotune_matvecs). Fills tuning.cols_specs
    and cols_timing (µs). Only where the graph runs int8 activations."""
    if not graph.int_dot:
        return
    dev, b = graph.dev, graph.buffers
    records: dict[tuple[str, int, str], Callable[[CommandList], None]] = {}
    specs: dict[tuple[str, int, str], Spec] = {}
    for key, (rotation, _x, y, xc, yc, epi) in matvec_cases(graph).items():
        if not all(cols_ok(dev, mats) for mats in rotation):
            continue
        for T in counts:
            for r, t in COLS_CANDIDATES:
                if t > max(4, 2 * T):
                    continue
                spec = cols_spec(dev, T, rows=r, tile=t)
                label = spec_label(spec)
                specs[(key, T, label)] = spec

                def record(
                    cl: CommandList,
                    layers: Iterator[list[WeightMatrix]] = itertools.cycle(rotation),
                    T: int = T,
                    spec: Spec = spec,
                    y: Buffer = y,
                    xc: int = xc,
                    yc: int = yc,
                    epi: str | None = epi,
                ) -> None:
                    record_matvec_cols(
                        cl,
                        dev,
                        next(layers),
                        b.xq,
                        y,
                        n_vecs=T,
                        x_stride=xc // 32,
                        y_stride=yc,
                        epilogue=epi,
                        spec=spec,
                    )

                records[(key, T, label)] = record
    times = timing.time_many(dev, records, reps=reps)
    us_by: dict[str, dict[int, dict[str, float]]] = {}
    for (key, T, label), us in times.items():
        us_by.setdefault(key, {}).setdefault(T, {})[label] = round(us, 1)
    graph.tuning.cols_timing = us_by  # this call's counts only: an earlier choice is replaced
    graph.tuning.cols_specs = {
        key: {T: specs[(key, T, min(t, key=t.__getitem__))] for T, t in sorted(by_T.items())}
        for key, by_T in us_by.items()
    }


# the GEMM path of a few-token forward must beat the matvec paths by this factor: its timing (a
# whole forward with every logit back, the GEMM tiles chosen for 32 tokens) favours it near a tie,
# where the real step then ran slower (H100, 4B, 16 rows: timed 17.2 vs 17.25 ms, a batched step
# 10.2 vs 8.9 ms)
GEMM_MARGIN = 1.05


def few_token_winner(times_ms: dict[str, float]) -> str:
    """The path of one token count from its forwards' times ("gemm_ms", "int8_ms", ...)."""
    best = min(times_ms, key=lambda k: times_ms[k] * (GEMM_MARGIN if k == "gemm_ms" else 1.0))
    return best[: -len("_ms")]


def choose_few_token_path(
    backend: VulkanBackend, counts: Sequence[int] = range(2, FEW_TOKENS + 1), repeats: int = 2, rounds: int = 2
) -> None:
    """Time forwards of a few tokens (all logits back, as a speculative verify pass and a
    batched decode step ask) through the GEMMs, the f32 multi-column matvecs (counts up to
    MAX_COLUMNS) and, where the backend has int8 activations, the int8 multi-column matvecs;
    set tuning.few_token_matvec / few_token_int8 to the counts where each won (the times go to
    tuning.few_token_timing as "<path>_ms"). The counts of TIMED_COUNTS and the two ends are
    timed; a count between takes the winner of the next timed count above it (each 27B trial
    is ~0.1-0.4 s). The paths are timed in `rounds` rounds, every other one in reverse order,
    and each keeps its best: in one order the first path ran while the clocks still rose (H100,
    4B: the int8 path took 32 rows in one load of four, and its steps were 15 ms against 10.3)."""
    # a context shorter than FEW_TOKENS holds no forward of more tokens (a 19-token context on
    # an H100 stopped the load here)
    counts = sorted(T for T in counts if T <= backend.context_length)
    if not counts:
        return
    timed = [T for T in counts if T in TIMED_COUNTS or T in (counts[0], counts[-1])]
    tuning = backend.tuning
    paths = ["gemm", "matvec"] + (["int8"] if backend.int_dot else [])
    ms: dict[int, dict[str, float]] = {}
    for r in range(rounds):
        for path in paths if r % 2 == 0 else paths[::-1]:
            todo = [T for T in timed if path != "matvec" or T <= MAX_COLUMNS]
            tuning.few_token_matvec = frozenset(todo) if path == "matvec" else frozenset()
            tuning.few_token_int8 = frozenset(todo) if path == "int8" else frozenset()
            backend.drop_recordings()
            for T in todo:
                ids = [backend.config.bos_token_id] * T
                t = _best_forward_ms(backend, ids, repeats, all_logits=True)
                row, key = ms.setdefault(T, {}), path + "_ms"
                row[key] = min(t, row.get(key, t))
    backend.drop_recordings()
    winner = {T: few_token_winner(t) for T, t in ms.items()}

    def won(T: int) -> str:
        return winner[next((t for t in timed if t >= T), timed[-1])]

    tuning.few_token_matvec = frozenset(T for T in counts if won(T) == "matvec")
    tuning.few_token_int8 = frozenset(T for T in counts if won(T) == "int8")
    tuning.few_token_timing = dict(sorted(ms.items()))
