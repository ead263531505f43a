"""Every compute pipeline variant, described once as data.

A `Variant` names its shader file, the -D defines that pick the weight type and epilogue, how
many storage-buffer bindings it has (0..n-1), its push-constant layout and specialization
constants. `python -m tools.build_shaders` compiles each variant to `shaders/spv/<name>.spv`; the
`PipelineCache` turns a name (+ specialization values) into a VkPipeline at run time.

`PushLayout` and `Variant` live in `variants.py` (re-exported here). Variants of the other
kernel families (norm, rope, attention, embedding, sampling, GEMM) are declared in `ops_table.py`
(the vision tower's in `ops_vision.py`) as `VARIANTS: list[Variant]` and merged into the one
table below. The table holds product kernels only: `bench/` registers its probe kernels on a
device with `Device.register_variants`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from phoenix_chat.engine.backends.vulkan import ops_table, ops_vision
from phoenix_chat.engine.backends.vulkan.ops_norm import NORM_MAXE
from phoenix_chat.engine.backends.vulkan.ops_table import CODEBOOK_TYPES

# re-exported (`X as X`): the table's vocabulary lives in variants.py
from phoenix_chat.engine.backends.vulkan.variants import MAX_PUSH_BYTES as MAX_PUSH_BYTES
from phoenix_chat.engine.backends.vulkan.variants import PushLayout as PushLayout
from phoenix_chat.engine.backends.vulkan.variants import Variant as Variant

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device

# ---- the matvec family ------------------------------------------------------------------
#
# y[r] = sum_c W[r, c] * x[c]   for rows of up to three weight matrices of one type
# (fused QKV: the rows of Wq, Wk, Wv in one dispatch, written one after the other), with
# epilogues: plain, residual add (y = res + Wx), GEGLU (y = gelu_tanh(Wg x) * (Wu x)),
# norm (decode: y = Wx, then the last workgroup runs norm.comp's norm_add on y: `_norm`),
# GEGLU writing y's q8_1 blocks too (decode: `_geglu_q8_1`, for an int8 down matvec),
# fused QKV followed by QK-norm + RoPE + KV write per head (decode: `_rope`).
# Bindings: 0 x (f32 activations, or q8_1 blocks for the int8 path), 1 y (f32 out),
#           2 W0, 3 W1, 4 W2 (f32/u16/u32 views of the file's bytes), 5 residual (y's q8_1
#           blocks for `_geglu_q8_1`, 6 its per-block arrival counters);
#           `_rope` adds 6 step, 7 q_norm w, 8 k_norm w, 9 k cache, 10 v cache, 11 per-head arrival;
#           `_norm` adds 6 w_post, 7 w_next, 8 h (f32 out), 9 h's q8_1 blocks, 10 arrival counter.

QUANT_KERNEL_TYPES = (
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "IQ4_NL",
    "IQ4_XS",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)  # the block types every kernel family (matvec f32 and int8, GEMM, embedding, multi-column) reads
WEIGHT_TYPES = ("F32", "F16", "BF16", *QUANT_KERNEL_TYPES, *CODEBOOK_TYPES)
INT_DOT_TYPES = (*QUANT_KERNEL_TYPES, *CODEBOOK_TYPES)  # types with an int8 x int8 dot-product matvec
COLS_TYPES = QUANT_KERNEL_TYPES  # types the int8 multi-column matvec (matvec_cols.comp) reads
PAIR_TYPES = ("Q8_0", "Q4_0")  # block-pair kernels (n_cols % 64 == 0)
# (q/k type, v type) of a fused QKV whose v differs: what llama.cpp's Q4_K_M makes of Gemma 3
# (rows of 640 / 1152 are no whole K-quant super-blocks: Q5_0 q/k, Q8_0 v; else Q6_K v beside Q4_K)
MIXED_QKV_TYPES = (("Q5_0", "Q8_0"), ("Q4_K", "Q6_K"), ("Q5_K", "Q6_K"))

MATVEC_PUSH = PushLayout(
    "matvec",
    [
        ("n_cols", "u32"),  # K: length of x
        ("rows0", "u32"),  # rows taken from W0 (then W1, W2)
        ("rows1", "u32"),
        ("rows2", "u32"),
        ("x_off", "u32"),  # element offset of x (f32 path) / block offset (int8 path)
        ("y_off", "u32"),  # element offset of y
        ("res_off", "u32"),  # element offset of the residual
        ("x_stride", "u32"),  # per token (workgroup z): elements (f32) / blocks (q8_1) of x
        ("y_stride", "u32"),  # per token: elements of y and of the residual
    ],
)
MATVEC_NORM_PUSH = PushLayout(
    "matvec_norm",
    MATVEC_PUSH.fields
    + [
        ("eps", "f32"),  # RMSNorm epsilon of the norm tail
        ("q8", "u32"),  # 1: the tail also writes q8_1 blocks of h (binding 9)
    ],
)
MATVEC_ROPE_PUSH = PushLayout(
    "matvec_rope",
    MATVEC_PUSH.fields
    + [
        ("head_dim", "u32"),
        ("n_heads", "u32"),
        ("n_kv_heads", "u32"),
        ("cache_slots", "u32"),  # position p goes to slot p % cache_slots
        ("theta", "f32"),  # RoPE base of this layer
        ("pos_scale", "f32"),  # 1 / linear scaling factor
        ("eps", "f32"),  # QK-norm epsilon
    ],
)
# a prologue's push (`_pn` / `_pq` variants): the epilogue's layout and the norm_add's epsilon
MATVEC_PRO_PUSH = PushLayout("matvec_pro", MATVEC_PUSH.fields + [("pro_eps", "f32")])
MATVEC_ROPE_PRO_PUSH = PushLayout("matvec_rope_pro", MATVEC_ROPE_PUSH.fields + [("pro_eps", "f32")])
MATVEC_SPEC = {
    "WG": (0, 64),
    "ROWS": (1, 2),
    "THREAD_ROWS": (2, 0),
    "SUBGROUP_ROWS": (3, 0),
    "NCOLS": (4, 1),
    "MATS": (5, 3),
}

# the multi-column int8 matvec (matvec_cols.comp): n_vecs vectors of q8_1 blocks, NCOLS per workgroup
MATVEC_COLS_PUSH = PushLayout("matvec_cols", MATVEC_PUSH.fields + [("n_vecs", "u32")])
MATVEC_COLS_SPEC = {"WG": (0, 128), "ROWS": (1, 2), "SUBGROUP_ROWS": (2, 4), "NCOLS": (3, 8)}

QUANTIZE_PUSH = PushLayout("quantize_q8_1", [("n", "u32"), ("x_off", "u32")])


# epilogue suffix -> its defines (the norm tail's row length per invocation comes from ops_norm)
_EPILOGUES: tuple[tuple[str, Mapping[str, str | int | None]], ...] = (
    ("", {}),
    ("_add", {"EPI_ADD": None}),
    ("_geglu", {"EPI_GEGLU": None}),
    ("_geglu_q8_1", {"EPI_GEGLU": None, "OUT_Q8_1": None}),
    ("_norm", {"EPI_NORM": None, "NORM_MAXE": NORM_MAXE}),
    ("_rope", {"EPI_ROPE": None}),
)


def matvec_name(wtype: str, atype: str, suffix: str = "", v_type: str | None = None) -> str:
    """matvec_<weights>[_v<v weights>]_<activations>_f32<epilogue suffix>, e.g. matvec_q4_0_q8_1_f32_geglu.
    atype: "f32", "q8_1" (int8 from q8_1 blocks) or "f32q" (f32 x quantized in registers)."""
    v = f"_v{v_type.lower()}" if v_type is not None and v_type != wtype else ""
    return f"matvec_{wtype.lower()}{v}_{atype}_f32{suffix}"


def matvec_cols_name(wtype: str, epilogue: str = "", v_type: str | None = None) -> str:
    """matvec_cols_<weights>[_v<v weights>]_q8_1[_geglu], e.g. matvec_cols_q4_0_q8_1_geglu."""
    v = f"_v{v_type.lower()}" if v_type is not None and v_type != wtype else ""
    return f"matvec_cols_{wtype.lower()}{v}_q8_1{epilogue}"


def _matvec_cols_variants() -> list[Variant]:
    """Bindings: 0 x (q8_1 blocks), 1 y, 2 W0, 3 W1, 4 W2."""
    out = []
    for wt in COLS_TYPES:
        for suffix, extra in (("", {}), ("_geglu", {"EPI_GEGLU": None})):
            out.append(
                Variant(
                    matvec_cols_name(wt, suffix),
                    "matvec_cols.comp",
                    5,
                    MATVEC_COLS_PUSH,
                    {"WTYPE_" + wt: None, **extra},
                    MATVEC_COLS_SPEC,
                    requires=("int_dot",),
                )
            )
    for qk, v in MIXED_QKV_TYPES:
        out.append(
            Variant(
                matvec_cols_name(qk, "", v),
                "matvec_cols.comp",
                5,
                MATVEC_COLS_PUSH,
                {"WTYPE_" + qk: None, "MIXED_V": None, "V_WTYPE_" + v: None},
                MATVEC_COLS_SPEC,
                requires=("int_dot",),
            )
        )
    return out


# prologue kind -> its variant suffix and defines (int8 from q8_1 blocks only): the consumer of a
# decode norm_add (`_pn`: QKV, GEGLU) or of a quantize (`_pq`: down) makes its x itself
# (matvec.Prologue)
PRO_SUFFIX = {"norm_add": "_pn", "quant": "_pq"}
_PRO_DEFINES: dict[str, Mapping[str, str | int | None]] = {
    "norm_add": {"PRO_NORM_ADD": None},
    "quant": {"PRO_QUANT": None},
}
PRO_EPILOGUES = ("", "_geglu", "_rope")  # the epilogues a prologue goes with
PRO_BINDINGS = 17  # 12 pin, 13 residual in, 14 w_post, 15 w_next, 16 residual out


def _matvec_pro_variants() -> list[Variant]:
    """The prologue variants, q8_1 x: per QUANT_KERNEL_TYPES type the norm_add prologue with the
    plain, GEGLU and rope epilogues and the quantize prologue plain; the mixed QKVs' norm_add
    prologue with the plain and rope epilogues."""
    out = []
    kinds: list[tuple[dict[str, None], str, str | None]] = [
        ({"WTYPE_" + wt: None}, wt, None) for wt in QUANT_KERNEL_TYPES
    ]
    kinds += [({"WTYPE_" + qk: None, "MIXED_V": None, "V_WTYPE_" + v: None}, qk, v) for qk, v in MIXED_QKV_TYPES]
    for base, wt, v in kinds:
        for suffix, extra in _EPILOGUES:
            if suffix not in PRO_EPILOGUES or (v is not None and suffix == "_geglu"):
                continue
            push = MATVEC_ROPE_PRO_PUSH if suffix == "_rope" else MATVEC_PRO_PUSH
            for kind, pdefs in _PRO_DEFINES.items():
                if kind == "quant" and (suffix or v is not None):
                    continue  # the quantize prologue is the down matvec's: plain, one type
                out.append(
                    Variant(
                        matvec_name(wt, "q8_1", suffix + PRO_SUFFIX[kind], v),
                        "matvec.comp",
                        PRO_BINDINGS,
                        push,
                        {**base, "INT_DOT": None, **extra, **pdefs},
                        MATVEC_SPEC,
                        requires=("int_dot",),
                    )
                )
    return out


def _matvec_layout(suffix: str) -> tuple[int, PushLayout]:
    """(bindings, push layout) of a matvec epilogue."""
    if suffix == "_norm":
        return 11, MATVEC_NORM_PUSH
    if suffix == "_rope":
        return 12, MATVEC_ROPE_PUSH
    return (7 if suffix == "_geglu_q8_1" else 6), MATVEC_PUSH


def _matvec_variants() -> list[Variant]:
    out = []
    for wt in WEIGHT_TYPES:
        base = {"WTYPE_" + wt: None}
        for suffix, extra in _EPILOGUES:
            nb, push = _matvec_layout(suffix)
            out.append(Variant(matvec_name(wt, "f32", suffix), "matvec.comp", nb, push, {**base, **extra}, MATVEC_SPEC))
        if wt in INT_DOT_TYPES:
            for suffix, extra in _EPILOGUES:
                nb, push = _matvec_layout(suffix)
                out.append(
                    Variant(
                        matvec_name(wt, "q8_1", suffix),
                        "matvec.comp",
                        nb,
                        push,
                        {**base, "INT_DOT": None, **extra},
                        MATVEC_SPEC,
                        requires=("int_dot",),
                    )
                )
                if wt in PAIR_TYPES:  # f32 x quantized in registers: no quantize dispatch
                    out.append(
                        Variant(
                            matvec_name(wt, "f32q", suffix),
                            "matvec.comp",
                            nb,
                            push,
                            {**base, "INT_DOT": None, "QUANT_IN_REGS": None, **extra},
                            MATVEC_SPEC,
                            requires=("int_dot",),
                        )
                    )
    for qk, v in MIXED_QKV_TYPES:  # fused QKV with v of its own type: plain and rope epilogues
        base = {"WTYPE_" + qk: None, "MIXED_V": None, "V_WTYPE_" + v: None}
        for suffix, extra in _EPILOGUES:
            if suffix not in ("", "_rope"):
                continue
            nb, push = _matvec_layout(suffix)
            out.append(
                Variant(matvec_name(qk, "f32", suffix, v), "matvec.comp", nb, push, {**base, **extra}, MATVEC_SPEC)
            )
            out.append(
                Variant(
                    matvec_name(qk, "q8_1", suffix, v),
                    "matvec.comp",
                    nb,
                    push,
                    {**base, "INT_DOT": None, **extra},
                    MATVEC_SPEC,
                    requires=("int_dot",),
                )
            )
    out += _matvec_pro_variants()
    out.append(Variant("quantize_q8_1", "quantize_q8_1.comp", 2, QUANTIZE_PUSH, {}, {"WG": (0, 32)}))
    out.append(Variant("copy_u32x4", "copy.comp", 2, PushLayout("copy", [("n", "u32")]), {}, {"WG": (0, 256)}))
    return out


def _all_variants() -> dict[str, Variant]:
    variants = _matvec_variants() + _matvec_cols_variants() + list(ops_table.VARIANTS) + list(ops_vision.VARIANTS)
    table: dict[str, Variant] = {}
    for v in variants:
        if v.name in table:
            raise ValueError(f"pipeline variant {v.name} is declared twice")
        table[v.name] = v
    return table


VARIANTS: dict[str, Variant] = _all_variants()


# ---- run-time pipelines ---------------------------------------------------------------------


class Pipeline:
    """A VkPipeline with its layouts; `push` is the variant's PushLayout."""

    def __init__(self, dev: Device, variant: Variant, spec_values: dict[str, int], subgroup_size: int = 0):
        vk = dev.vk
        self.dev = dev
        self.variant = variant
        self.name = variant.name
        self.push = variant.push
        self.n_bindings = variant.bindings
        self.spec_values = spec_values
        self.subgroup_size = subgroup_size  # required through VK_EXT_subgroup_size_control; 0: the driver's
        missing = [r for r in variant.requires if not getattr(dev.caps, r)]
        if missing:
            raise RuntimeError(f"{variant.name} needs {', '.join(missing)}, which {dev.name} lacks")
        try:
            code = variant.spv_path.read_bytes()
        except FileNotFoundError:
            raise RuntimeError(f"{variant.spv_path} is missing: run `make shaders`") from None
        self.module = vk.vkCreateShaderModule(
            dev.device, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None
        )
        binds = [
            vk.VkDescriptorSetLayoutBinding(
                binding=i,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                descriptorCount=1,
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            )
            for i in range(variant.bindings)
        ]
        self.set_layout = vk.vkCreateDescriptorSetLayout(
            dev.device, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=len(binds), pBindings=binds), None
        )
        ranges = (
            [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=variant.push.size)]
            if variant.push.size
            else []
        )
        self.layout = vk.vkCreatePipelineLayout(
            dev.device,
            vk.VkPipelineLayoutCreateInfo(
                setLayoutCount=1,
                pSetLayouts=[self.set_layout],
                pushConstantRangeCount=len(ranges),
                pPushConstantRanges=ranges or None,
            ),
            None,
        )
        entries, data = [], b""
        for sname, (cid, _default) in sorted(variant.spec.items(), key=lambda kv: kv[1][0]):
            entries.append(vk.VkSpecializationMapEntry(constantID=cid, offset=len(data), size=4))
            data += struct.pack("<I", int(spec_values[sname]))
        spec_info = None
        if entries:
            self._spec_data = vk.ffi.new("char[]", data)
            spec_info = vk.VkSpecializationInfo(
                mapEntryCount=len(entries), pMapEntries=entries, dataSize=len(data), pData=self._spec_data
            )
        required = (
            vk.VkPipelineShaderStageRequiredSubgroupSizeCreateInfo(requiredSubgroupSize=subgroup_size)
            if subgroup_size
            else None
        )
        stage = vk.VkPipelineShaderStageCreateInfo(
            pNext=required,
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            module=self.module,
            pName="main",
            pSpecializationInfo=spec_info,
        )
        flags = 0
        if dev.capture_statistics:  # bench/pipeline_stats.py's device
            flags = vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR
            flags |= vk.VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR
        self.handle = vk.vkCreateComputePipelines(
            dev.device,
            None,
            1,
            [vk.VkComputePipelineCreateInfo(flags=flags, stage=stage, layout=self.layout)],
            None,
        )[0]

    def destroy(self) -> None:
        vk, d = self.dev.vk, self.dev.device
        vk.vkDestroyPipeline(d, self.handle, None)
        vk.vkDestroyPipelineLayout(d, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(d, self.set_layout, None)
        vk.vkDestroyShaderModule(d, self.module, None)

    def __repr__(self) -> str:
        sg = f" subgroup {self.subgroup_size}" if self.subgroup_size else ""
        return f"<Pipeline {self.name} {self.spec_values}{sg}>"


SUBGROUP_SIZE = "SUBGROUP_SIZE"  # a spec key that requires a subgroup size (PipelineCache.get)


class PipelineCache:
    """The pipelines of one device, built on first use from `VARIANTS` and any registered extras."""

    def __init__(self, dev: Device):
        self.dev = dev
        self._variants: dict[str, Variant] = dict(VARIANTS)
        self._cache: dict[tuple[str, tuple[tuple[str, int], ...], int], Pipeline] = {}

    def register(self, variants: Iterable[Variant]) -> None:
        """Add variants that are not product kernels (bench probes); a name may not change meaning."""
        for v in variants:
            known = self._variants.get(v.name)
            if known is not None and known != v:
                raise ValueError(f"pipeline variant {v.name} is already registered differently")
            self._variants[v.name] = v

    def get(self, name: str, **spec: int) -> Pipeline:
        """The pipeline of variant `name` with these specialization constants; SUBGROUP_SIZE, where
        given and not 0, is no constant but the subgroup size the pipeline requires
        (VK_EXT_subgroup_size_control: RDNA's wave32 or wave64), one the device allows."""
        try:
            variant = self._variants[name]
        except KeyError:
            raise KeyError(f"no pipeline variant {name!r} in the table") from None
        sg = int(spec.pop(SUBGROUP_SIZE, 0))
        if sg and sg not in self.dev.caps.compute_subgroup_sizes:
            allowed = self.dev.caps.compute_subgroup_sizes or "none (no subgroup size control for compute)"
            raise ValueError(f"{name}: subgroup size {sg} cannot be required on {self.dev.name}: allowed {allowed}")
        unknown = set(spec) - set(variant.spec)
        if unknown:
            raise KeyError(f"{name}: unknown specialization constants {sorted(unknown)}")
        values = {k: int(spec.get(k, d)) for k, (_cid, d) in variant.spec.items()}
        key = (name, tuple(sorted(values.items())), sg)
        p = self._cache.get(key)
        if p is None:
            p = self._cache[key] = Pipeline(self.dev, variant, values, sg)
        return p

    def destroy(self) -> None:
        for p in self._cache.values():
            p.destroy()
        self._cache.clear()
