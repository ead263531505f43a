"""Probe kernels of the benchmarks: timing experiments, not engine kernels.

Their sources sit here, their SPIR-V in spv/ (with its own manifest.json), both built by
`python -m tools.build_shaders` like the product's. They are not in the product's pipeline table:
a benchmark calls `register(dev)` before `dev.pipeline("handoff_probe", ...)`.
"""

from __future__ import annotations

from pathlib import Path

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
        Variant(
            "int_dot_rate",
            "int_dot_rate.comp",
            1,
            PushLayout("int_dot_rate", [("iters", "u32"), ("seed", "u32")]),
            {},
            {"WG": (0, 256), "OP": (1, 0)},
            requires=("int_dot",),
            home=HOME,
        ),
    )
}


def register(dev) -> None:
    """Make the probe kernels available to `dev.pipeline()` on this device."""
    dev.register_variants(VARIANTS.values())
