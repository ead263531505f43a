"""Probe kernels of the benchmarks: timing experiments, not engine kernels.

Their sources sit here, their SPIR-V in spv/ (with its own manifest.json), both built by
`python -m tools.build_shaders` like the product's. They are not in the product's pipeline table:
a benchmark calls `register(dev)` before `dev.pipeline("handoff_probe", ...)`.
"""

from __future__ import annotations

from pathlib import Path

from phoenix_chat.engine.backends.vulkan.ops_table import GEMM_PUSH
from phoenix_chat.engine.backends.vulkan.variants import PushLayout, Variant

HOME = Path(__file__).resolve().parent

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "handoff_probe",
            "handoff_probe.comp",
            4,
            PushLayout("handoff", [("n", "u32"), ("m", "u32"), ("producers", "u32"), ("reps", "u32")]),
            {},
            {"WG": (0, 256), "ROLE": (1, 0), "WAIT": (2, 0)},
            home=HOME,
        ),
        Variant(
            "persistent_probe",
            "persistent_probe.comp",
            7,
            PushLayout(
                "persistent",
                [
                    ("n_qkv", "u32"),
                    ("n_o", "u32"),
                    ("n_gu", "u32"),
                    ("n_down", "u32"),
                    ("layers", "u32"),
                    ("m", "u32"),
                    ("phase", "u32"),
                ],
            ),
            {},
            {"WG": (0, 512), "PERSIST": (1, 0), "PRE": (2, 4), "NORM_IN_STREAM": (3, 0)},
            home=HOME,
        ),
    )
}

# The matrix-core GEMM's register-filled tiles reading x as f16 (CM_XH), against the product's
# f32 x: does halving the activation bytes each workgroup loads pay for a conversion pass?
# (bench/gemm_sweep.py --probe-xh)
XH_TILES = {"p": {"CM_TM": "4"}, "wp": {"CM_TM": "4", "CM_TN": "4", "CM_GN": "2"}}
for _wt in ("Q4_0", "Q4_K"):
    for _tile, _defs in XH_TILES.items():
        for _epi, _nb in (("", 3), ("_geglu", 4)):
            _d: dict[str, str | None] = {"WTYPE_" + _wt: None, "CM_PF": None, "CM_XH": None, **_defs}
            if _epi:
                _d["GEMM_GEGLU"] = None
                _d["CM_TN"] = str(int(_defs.get("CM_TN") or 2) // 2)
            _v = Variant(
                f"gemm_probe_xh_{_wt.lower()}{_epi}_{_tile}",
                "../../shaders/gemm_coopmat.comp",
                _nb,
                GEMM_PUSH,
                _d,
                {"WG": (0, 256)},
                requires=("cooperative_matrix",),
                home=HOME,
            )
            VARIANTS[_v.name] = _v


def register(dev) -> None:
    """Make the probe kernels available to `dev.pipeline()` on this device."""
    dev.register_variants(VARIANTS.values())
