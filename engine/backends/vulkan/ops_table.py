"""Pipeline variants of the non-matvec kernel families: norm, rope, attention, embedding,
sampling, prefill GEMM. Merged into the one table in `pipelines.py`.

Each push layout is defined once here; the `ops_*.py` wrappers pack them by field name.
Binding lists and dispatch shapes are documented at the top of each shader and in the wrapper.
"""

from __future__ import annotations

from phoenix_chat.engine.backends.vulkan.ops_norm import NORM_MAXE
from phoenix_chat.engine.backends.vulkan.variants import PushLayout, Variant

_BLOCK_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
EMBED_TYPES = ("F32", "F16", "BF16", *_BLOCK_TYPES)
# the codebook types (shaders/include/gguf_bytes.glsl: the grid is the start of the matrix's own
# buffer): the matvecs and the GEMM read them; the embedding and the multi-column int8 matvec do
# not (an embedding of these types is re-quantized to Q8_0; few-token forwards and batched steps
# take the f32 multi-column matvec for them)
CODEBOOK_TYPES = ("IQ3_XXS", "IQ3_S", "IQ2_XS", "IQ2_S")
GEMM_TYPES = ("F32", "F16", "BF16", *_BLOCK_TYPES, *CODEBOOK_TYPES)
QUANTIZE_WEIGHT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_1", "F16")  # targets of --quant, made on the device
# matrix-core GEMM tiles whose GEGLU kernel has half the columns: its two accumulators and three
# shared tiles would not fit the registers or 48 KiB of shared memory (ops_gemm.CM_TILES_GEGLU)
CM_GEGLU_HALF_N = ("_p", "_pm", "_w", "_wp")
# int8-dot GEMM tiles (shaders/gemm_int8.comp): name -> (I8_RT, I8_TT, I8_KC): 16 RT weight rows x
# 16 TT tokens per workgroup, KC 32-wide chunks per K step; the GEGLU kernels halve an RT of 8
# (two matrices' rows in registers, and 48 KiB of shared memory)
I8_TILES = {"int8": (4, 4, 2), "int8_r": (8, 4, 2), "int8_t": (4, 8, 2), "int8_1": (8, 8, 1)}
# the types those tiles read: the block types, which the int8 matvecs' chunk decoder unpacks
INT8_GEMM_TYPES = _BLOCK_TYPES
# int8 matrix-core GEMM tiles (shaders/gemm_coopmat_int8.comp): name -> (CM8_GM, CM8_GN, CM8_TM,
# CM8_TN, CM8_KC, CM8_PF2): a GM (tokens) x GN (rows) grid of subgroups, each TM x TN 16 x 16
# fragments, KC 32-wide chunks per barrier, PF2: loads issued two steps ahead (else one); the GEGLU
# kernels halve TN (two matrices' sums in registers). A few tokens take CM8F_TILES instead
CM8_TILES = {
    "cm8_8": (2, 4, 2, 2, 1, False),  # 64 tokens x 128 rows, 8 subgroups
    "cm8_k2": (2, 4, 2, 2, 2, True),  # the same, two chunks per barrier, loads two steps ahead
}
# the int8 matrix-core GEMM of a few tokens (shaders/gemm_coopmat_int8_few.comp): name -> (CFW_TM,
# CFW_SPLIT): 16 rows x 16 TM tokens per workgroup, K split between SPLIT subgroups
CM8F_TILES = {"cm8f1": (1, 4), "cm8f2": (2, 4)}
# the types they are built for: most of a Q4_0 / Q4_K_M / Q8_0 file (the kernel folds one scale and
# min per 32-weight chunk, so Q2_K, Q3_K and Q6_K, which scale each half, cannot take them; the other
# one-scale types could, but the tiles are opt-in and each type is ~0.5 MB of SPIR-V)
CM8_TYPES = ("Q8_0", "Q4_0", "Q4_K", "Q5_K")
# the f16 matrix-core GEMM of a few tokens with weights streamed through registers
# (shaders/gemm_coopmat_few.comp): name -> (CF_FT, CF_NSG, CF_RAW, splits, CF_KC): 16 FT tokens x
# 16 NSG rows per workgroup, K in slabs of 64 KC, RAW: Q4_0 / Q8_0 loaded as whole words (the
# CF_DIRECT tiles below load their own way and ignore it), splits > 1:
# K split between that many workgroups (CF_SPLITK), their partial sums added by
# gemm_splitk_reduce.comp. The few-token tiles kept won some 27B / 4B product of 8-32 tokens on the
# H100; the "cpd" ones (CF_PREFILL_TILES) some product of a 512-token prefill chunk.
CF_TILES = {
    "cmf1h": (1, 2, False, 1, 1),
    "cmf2h": (2, 2, False, 1, 1),
    "cmf1r": (1, 4, True, 1, 1),
    "cmf2r": (2, 4, True, 1, 1),
    "cmf1hr": (1, 2, True, 1, 1),
    "cmf2hr": (2, 2, True, 1, 1),
    "cmf1hr_k4": (1, 2, True, 4, 1),
    "cmf2hr_k2": (2, 2, True, 2, 1),
    "cmf1hr_c2": (1, 2, True, 1, 2),
    "cmd2_4": (2, 4, True, 1, 1),
    "cmw1_4": (1, 4, True, 1, 4),
    "cmw1_4_k4": (1, 4, True, 4, 4),
    "cmw2_8_k2": (2, 8, True, 2, 4),
    "cmw2_4": (2, 4, True, 1, 4),  # 27B LM head (Q8_0) of 32 tokens: the weights read once, not twice
    # the down of a 32-row step: 128 rows a workgroup (x staged once for all of them), K split
    # further; H200, 2026-11-28, µs against the best tile before (docs/PERFORMANCE.md)
    "cmw2_8_k4": (2, 8, True, 4, 4),  # 4B down of 32 tokens: 31.1 against 37.9
    "cmw2_8_k8": (2, 8, True, 8, 4),  # 27B down of 32 tokens: 87.7 against 101.5
    # 8-16 tokens: won products alone (27B down 67 -> 62) yet slowed whole 8-row steps 5-6 %
    # where a load picked them, so a step keeps them only where it runs faster (step_tiles.py)
    "cmw1_4_k8": (1, 4, True, 8, 4),
    "cmw1_8_k2": (1, 8, True, 2, 4),
    "cmw1_8_k4": (1, 8, True, 4, 4),
    "cpd2_8": (2, 8, True, 1, 1),  # 27B q: 175 us against coopmat_p's 187
    "cpd2_16": (2, 16, True, 1, 1),  # 27B k / v: 83 against 152
    "cpd3_8": (3, 8, True, 1, 1),
    "cpd3_16": (3, 16, True, 1, 1),  # 27B o 226 against 338, down 934 against 1 533
    "cpd4_8_c2": (4, 8, True, 1, 2),  # 27B gate/up + GEGLU: 1 511 against coopmat_wp's 2 209
}
# the prefill tiles among them (CF_DIRECT, built in registers): timed with a prefill chunk's tiles
# (gemm_tuning.candidates_for), not with the few-token ones
CF_PREFILL_TILES = frozenset(kn for kn in CF_TILES if kn.startswith("cpd"))
# the tiles of them that build the weight fragments in registers, no shared copy (CF_DIRECT), for
# the types cf_direct_types names (Q4_0 and Q4_K; the CF_WIDE ones Q4_0 and Q8_0); they run where the
# driver's fragment layout is the one checked for (ops_gemm.cf_direct_layout)
CF_WIDE_TILES = frozenset(kn for kn in CF_TILES if kn.startswith("cmw"))  # CF_WIDE: a lane loads whole block pairs
CF_DIRECT_TILES = frozenset({"cmd2_4"}) | CF_WIDE_TILES | CF_PREFILL_TILES
CF_DIRECT_TYPES = ("Q4_0", "Q4_K")
CF_WIDE_TYPES = ("Q4_0", "Q8_0")  # the whole-block-pair loads of CF_WIDE: 36 / 68 bytes a pair, word-aligned


def cf_direct_types(tile: str) -> tuple[str, ...]:
    """The weight types CF_DIRECT tile `tile` builds its fragments from."""
    return CF_WIDE_TYPES if tile in CF_WIDE_TILES else CF_DIRECT_TYPES


# the types it is built for: those of Q4_0, Q8_0 and Q4_K_M / Q5_K_M files (its decoder is the int8
# matvecs', which reads every block type; each type is ~0.25 MB of SPIR-V)
CF_TYPES = ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K")
CF_RAW_TYPES = ("Q4_0", "Q8_0")  # the types the RAW tiles load as whole words


# ---- RMSNorm (shaders/norm.comp) ----
NORM_PUSH = PushLayout("norm", [("n", "u32"), ("eps", "f32")])
# ---- QK-norm + RoPE + KV-cache write (shaders/rope.comp) ----
ROPE_PUSH = PushLayout(
    "rope",
    [
        ("head_dim", "u32"),
        ("n_heads", "u32"),
        ("n_kv_heads", "u32"),
        ("q_stride", "u32"),  # floats from one token's q to the next
        ("kv_stride", "u32"),  # same for k and v
        ("q_offset", "u32"),
        ("k_offset", "u32"),
        ("v_offset", "u32"),  # floats
        ("cache_slots", "u32"),  # position p goes to slot p % cache_slots
        ("theta", "f32"),  # RoPE base of this layer
        ("pos_scale", "f32"),  # 1 / linear scaling factor
        ("eps", "f32"),
    ],
)
# ---- attention (shaders/attention.comp, attention_prefill.comp) ----
ATTN_PUSH = PushLayout(
    "attention",
    [
        ("head_dim", "u32"),
        ("n_heads", "u32"),
        ("n_kv_heads", "u32"),
        ("q_offset", "u32"),  # floats
        ("cache_slots", "u32"),
        ("window", "u32"),  # 0: global layer (no window)
        ("scale", "f32"),  # 1 / sqrt(query_pre_attn_scalar)
        ("n_splits", "u32"),
    ],
)
ATTN_PREFILL_PUSH = PushLayout(
    "attention_prefill",
    [
        ("head_dim", "u32"),
        ("n_heads", "u32"),
        ("n_kv_heads", "u32"),
        ("q_stride", "u32"),  # floats from one token's q to the next
        ("q_offset", "u32"),
        ("cache_slots", "u32"),
        ("window", "u32"),
        ("scale", "f32"),
    ],
)
# attention_prefill_combine.comp: the split flash attention's partial records merged into out
ATTN_COMBINE_PUSH = PushLayout("attention_combine", [("head_dim", "u32"), ("n_heads", "u32")])
# attention_prefill_coopmat.comp: head_dim -> keys per tile (shared memory: a 64-row block's S
# in f32 and P in f16, one K/V tile of BC keys; 31 KiB at 256 x 32, 43 KiB at 128 x 64)
ATTN_CM_HEAD_DIMS = {64: 64, 128: 64, 256: 32}
# ---- embedding (shaders/embed.comp) ----
EMBED_PUSH = PushLayout(
    "embed",
    [
        ("hidden", "u32"),
        ("row_start", "u32"),
        ("rows", "u32"),  # the table rows this binding holds
        ("row_bytes", "u32"),
        ("scale", "f32"),
    ],
)
# the last real token's row moved to row 0 for the LM head (shaders/last_row.comp)
LAST_ROW_PUSH = PushLayout("last_row", [("row_words", "u32")])
# ---- sampling (shaders/sample.comp) ----
SAMPLE_PUSH = PushLayout(
    "sample",
    [
        ("vocab", "u32"),
        ("n_blocks", "u32"),
        ("n_draws", "u32"),  # ids written to tokens[pos + n_tokens ...]; 1 when decoding
        ("advance", "u32"),  # 1: step.pos += step.n_tokens after writing
    ],
)
# ---- prefill GEMM (shaders/gemm.comp, gemm_coopmat.comp, gemm_lanes.comp) ----
GEMM_PUSH = PushLayout(
    "gemm",
    [
        ("m", "u32"),  # tokens (rows of x)
        ("n", "u32"),  # output columns = weight rows in this binding
        ("k", "u32"),  # reduction length
        ("x_stride", "u32"),
        ("y_stride", "u32"),  # floats between rows
        ("y_off", "u32"),  # column of y where this binding's rows land
    ],
)
# ---- weights re-quantized on load (shaders/quantize_weights.comp) ----
QUANTIZE_WEIGHTS_PUSH = PushLayout(
    "quantize_weights",
    [
        ("n", "u32"),  # source values in this dispatch
        ("src_kind", "u32"),  # 0 f32, 1 f16, 2 bf16
        ("dst_off", "u32"),  # 16-bit words into the destination binding
    ],
)


def _variants() -> list[Variant]:
    """Every variant of these families, in table order."""
    norm_spec = {"WG": (0, 256)}
    attn_spec = {"WG": (0, 128), "HD": (1, 256), "G": (2, 1)}
    sample_spec = {"WG": (0, 256), "BLOCK": (1, 1024), "KC": (2, 64)}
    maxe = {"NORM_MAXE": NORM_MAXE}
    v = [
        Variant("norm_f32", "norm.comp", 3, NORM_PUSH, {**maxe}, norm_spec),
        Variant("norm_add_f32", "norm.comp", 5, NORM_PUSH, {"NORM_ADD": None, **maxe}, norm_spec),
        # + q8_1 blocks of `out` for an int8 matvec: its quantize dispatch folded in
        Variant("norm_f32_q8_1", "norm.comp", 4, NORM_PUSH, {"NORM_Q8_1": None, **maxe}, norm_spec),
        Variant(
            "norm_add_f32_q8_1", "norm.comp", 6, NORM_PUSH, {"NORM_ADD": None, "NORM_Q8_1": None, **maxe}, norm_spec
        ),
        # decode (one row): spread over ceil(n / WG) workgroups, residual in -> residual out
        Variant("norm_add_split_f32", "norm.comp", 6, NORM_PUSH, {"NORM_ADD_SPLIT": None, **maxe}, norm_spec),
        Variant(
            "norm_add_split_f32_q8_1",
            "norm.comp",
            7,
            NORM_PUSH,
            {"NORM_ADD_SPLIT": None, "NORM_Q8_1": None, **maxe},
            norm_spec,
        ),
        Variant("rope_f32_f16", "rope.comp", 8, ROPE_PUSH, {}, {"WG": (0, 64)}),
        # a batched decode step's rows (batch.py): one Step per row, each its own slot and position
        Variant("rope_f32_f16_rows", "rope.comp", 8, ROPE_PUSH, {"STEP_ROWS": None}, {"WG": (0, 64)}),
        Variant("attention_decode_f16_f32", "attention.comp", 7, ATTN_PUSH, {}, attn_spec),
        Variant(
            "attention_decode_f16_f32_rows",
            "attention.comp",
            7,
            ATTN_PUSH,
            {"STEP_ROWS": None},
            {**attn_spec, "QROW": (3, 0)},
        ),
        # + q8_1 blocks of `out` for an int8 o-proj matvec: its quantize dispatch folded in
        Variant("attention_decode_f16_f32_q8_1", "attention.comp", 8, ATTN_PUSH, {"ATTN_Q8_1": None}, attn_spec),
        Variant(
            "attention_prefill_f16_f32",
            "attention_prefill.comp",
            5,
            ATTN_PREFILL_PUSH,
            {},
            {"WG": (0, 128), "BQ": (1, 8), "BC": (2, 32), "HD": (3, 256)},
        ),
    ]
    # the same on matrix cores (shaders/attention_prefill_coopmat.comp), one variant per head_dim
    # (constant trip counts, coopmat arrays sized at compile time); _spans: the picture mask
    for hd, bc in ATTN_CM_HEAD_DIMS.items():
        for spans, defs, nb in (("", {}, 5), ("_spans", {"ATTN_SPANS": None}, 6)):
            v.append(
                Variant(
                    f"attention_prefill_f16_f32{spans}_coopmat_d{hd}",
                    "attention_prefill_coopmat.comp",
                    nb,
                    ATTN_PREFILL_PUSH,
                    {"CM_HD": str(hd), "CM_BC": str(bc), **defs},
                    {"WG": (0, 256), "GW": (1, 1), "NSPLIT": (2, 1)},
                    requires=("cooperative_matrix",),
                )
            )
    v.append(
        Variant(
            "attention_prefill_combine_f32",
            "attention_prefill_combine.comp",
            3,
            ATTN_COMBINE_PUSH,
            {},
            {"WG": (0, 64), "NSPLIT": (1, 2)},
        )
    )
    for kind, nb in (("argmax_f32", 5), ("topk_f32", 5), ("full_f32", 5), ("penalty_f32", 3)):
        define = "SAMPLE_" + kind.replace("_f32", "").upper()
        v.append(Variant(f"sample_{kind}", "sample.comp", nb, SAMPLE_PUSH, {define: None}, sample_spec))
        if kind != "penalty_f32":  # a batched step's rows of one sampler in one dispatch (batch.py)
            rows_spec = {**sample_spec, "LROW": (3, 0), "CROW": (4, 0), "AROW": (5, 0)}
            v.append(
                Variant(
                    f"sample_{kind}_rows", "sample.comp", nb, SAMPLE_PUSH, {define: None, "STEP_ROWS": None}, rows_spec
                )
            )
    for wt in EMBED_TYPES:
        v.append(
            Variant(f"embed_{wt.lower()}_f32", "embed.comp", 4, EMBED_PUSH, {"WTYPE_" + wt: None}, {"WG": (0, 256)})
        )
    v.append(Variant("last_row_u32", "last_row.comp", 2, LAST_ROW_PUSH, {}, {"WG": (0, 256)}))
    # the fragment layout the CF_DIRECT tiles need (ops_gemm.cf_direct_layout)
    v.append(
        Variant(
            "coopmat_fragment_layout",
            "coopmat_fragment_layout.comp",
            1,
            PushLayout("none", []),
            {},
            requires=("cooperative_matrix",),
        )
    )
    # the second half of the split-K few-token tiles (gemm_coopmat_few.comp CF_SPLITK)
    for epi, epi_defs in (("", {}), ("_geglu", {"GEMM_GEGLU": None})):
        v.append(
            Variant(f"gemm_splitk_reduce{epi}", "gemm_splitk_reduce.comp", 2, GEMM_PUSH, epi_defs, {"WG": (0, 256)})
        )
    for wt in GEMM_TYPES:
        base = {"WTYPE_" + wt: None}
        v.append(Variant(f"gemm_{wt.lower()}_f32_f32", "gemm.comp", 3, GEMM_PUSH, base))
        v.append(Variant(f"gemm_{wt.lower()}_f32_f32_geglu", "gemm.comp", 4, GEMM_PUSH, {**base, "GEMM_GEGLU": None}))
        # the same on matrix cores (shaders/gemm_coopmat.comp), where VK_KHR_cooperative_matrix exists
        cm = {"WG": (0, 256)}
        # tokens x columns per workgroup and subgroups: ops_gemm.CM_TILES
        tiles: tuple[tuple[str, dict[str, str | None]], ...] = (
            ("", {}),
            ("_l", {"CM_TM": "4"}),
            ("_ld", {"CM_TM": "4", "CM_DB": None}),  # 128 x 128, double-buffered (not the GEGLU)
            ("_m", {"CM_TM": "1"}),
            ("_s", {"CM_TM": "1", "CM_TN": "1"}),
            ("_p", {"CM_TM": "4", "CM_PF": None}),  # 128 x 128 filled through registers
            ("_pm", {"CM_TM": "2", "CM_PF": None}),  # 64 x 128 filled through registers
            # 2 x 2 subgroups of 64 x 64
            ("_w", {"CM_TM": "4", "CM_TN": "4", "CM_GN": "2"}),
            ("_wp", {"CM_TM": "4", "CM_TN": "4", "CM_GN": "2", "CM_PF": None}),
        )
        for tile, tile_defs in tiles:
            for epi, epi_defs, nb in (("", {}, 3), ("_geglu", {"GEMM_GEGLU": None}, 4)):
                # the GEGLU's two accumulators and three shared tiles: half the columns where
                # either would not fit (ops_gemm.CM_TILES_GEGLU; 48 KiB of shared memory)
                tdefs = dict(tile_defs)
                if epi and tile in CM_GEGLU_HALF_N:
                    tdefs["CM_TN"] = str(int(tile_defs.get("CM_TN") or 2) // 2)
                v.append(
                    Variant(
                        f"gemm_{wt.lower()}_f32_f32{epi}_coopmat{tile}",
                        "gemm_coopmat.comp",
                        nb,
                        GEMM_PUSH,
                        {**base, **epi_defs, **tdefs},
                        cm,
                        requires=("cooperative_matrix",),
                    )
                )
        # the same on the packed int8 dot (shaders/gemm_int8.comp), x as q8_1 blocks: devices with
        # the integer dot product, matrix cores or not (types the int8 multi-column matvec reads)
        if wt in INT8_GEMM_TYPES:
            for tile, (rt, tt, kc) in I8_TILES.items():
                for epi, epi_defs, nb in (("", {}, 3), ("_geglu", {"GEMM_GEGLU": None}, 4)):
                    grt = rt // 2 if epi and rt > 4 else rt  # GEGLU: two matrices' rows in registers
                    v.append(
                        Variant(
                            f"gemm_{wt.lower()}_f32_f32{epi}_{tile}",
                            "gemm_int8.comp",
                            nb,
                            GEMM_PUSH,
                            {**base, **epi_defs, "I8_RT": str(grt), "I8_TT": str(tt), "I8_KC": str(kc)},
                            requires=("int_dot",),
                        )
                    )
        # the same on int8 matrix cores (shaders/gemm_coopmat_int8.comp), x as q8_1 blocks; compiled
        # for 32-lane subgroups and 16 x 16 x 32 products (ops_gemm.CM8_SHAPE)
        if wt in CM8_TYPES:
            for tile, (gm, gn, tm, tn, kc, pf2) in CM8_TILES.items():
                for epi, epi_defs, nb in (("", {}, 3), ("_geglu", {"GEMM_GEGLU": None}, 4)):
                    gtn = max(1, tn // 2) if epi else tn
                    cm8_defs: dict[str, str | None] = {
                        "CM8_GM": str(gm),
                        "CM8_GN": str(gn),
                        "CM8_TM": str(tm),
                        "CM8_TN": str(gtn),
                        "CM8_KC": str(kc),
                    }
                    if pf2:
                        cm8_defs["CM8_PF2"] = None
                    v.append(
                        Variant(
                            f"gemm_{wt.lower()}_f32_f32{epi}_{tile}",
                            "gemm_coopmat_int8.comp",
                            nb,
                            GEMM_PUSH,
                            {**base, **epi_defs, **cm8_defs},
                            {"WG": (0, 128)},
                            requires=("cooperative_matrix", "coopmat_int8_k"),
                        )
                    )
            for tile, (tm, split) in CM8F_TILES.items():
                for epi, epi_defs, nb in (("", {}, 3), ("_geglu", {"GEMM_GEGLU": None}, 4)):
                    v.append(
                        Variant(
                            f"gemm_{wt.lower()}_f32_f32{epi}_{tile}",
                            "gemm_coopmat_int8_few.comp",
                            nb,
                            GEMM_PUSH,
                            {**base, **epi_defs, "CFW_TM": str(tm), "CFW_SPLIT": str(split)},
                            {"WG": (0, 128)},
                            requires=("cooperative_matrix", "coopmat_int8_k"),
                        )
                    )
        # a few tokens on f16 matrix cores, weights streamed through registers (gemm_coopmat_few.comp)
        if wt in CF_TYPES:
            for tile, (ft, nsg, raw, splits, kc) in CF_TILES.items():
                direct = tile in CF_DIRECT_TILES
                if wt not in (cf_direct_types(tile) if direct else CF_RAW_TYPES if raw else CF_TYPES):
                    continue
                mode = {"CF_DIRECT": None} if direct else {"CF_RAW": None} if raw else {}
                if tile in CF_WIDE_TILES:
                    mode["CF_WIDE"] = None
                spec = {"WG": (0, 128), **({"CF_PR": (1, 12), "CF_PK": (2, 10)} if direct else {})}
                for epi, epi_defs, nb in (("", {}, 3), ("_geglu", {"GEMM_GEGLU": None}, 4)):
                    v.append(
                        Variant(
                            f"gemm_{wt.lower()}_f32_f32{epi}_{tile}",
                            "gemm_coopmat_few.comp",
                            nb,
                            GEMM_PUSH,
                            {
                                **base,
                                **epi_defs,
                                "CF_FT": str(ft),
                                "CF_NSG": str(nsg),
                                **mode,
                                **({"CF_SPLITK": None} if splits > 1 else {}),
                                "CF_KC": str(kc),
                            },
                            spec,
                            requires=("cooperative_matrix",),
                        )
                    )
        # the same on CPU Vulkan devices (shaders/gemm_lanes.comp): register tiles, no shared memory
        lanes = {"WG": (0, 8), "RN": (1, 16), "TM": (2, 16)}
        v.append(Variant(f"gemm_{wt.lower()}_f32_f32_lanes", "gemm_lanes.comp", 3, GEMM_PUSH, base, lanes))
        v.append(
            Variant(
                f"gemm_{wt.lower()}_f32_f32_geglu_lanes",
                "gemm_lanes.comp",
                4,
                GEMM_PUSH,
                {**base, "GEMM_GEGLU": None},
                lanes,
            )
        )
    for out in QUANTIZE_WEIGHT_TYPES:
        v.append(
            Variant(
                f"quantize_weights_{out.lower()}",
                "quantize_weights.comp",
                2,
                QUANTIZE_WEIGHTS_PUSH,
                {"OUT_" + out: None},
                {"WG": (0, 64)},
            )
        )
    return v


VARIANTS: list[Variant] = _variants()
