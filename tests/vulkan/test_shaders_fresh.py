"""The committed SPIR-V matches its sources: `make shaders` was run after the last shader edit."""

from __future__ import annotations

from pathlib import Path

from tools import build_shaders as tool

REPO = Path(__file__).resolve().parents[2]


def test_every_variant_has_a_fresh_spv():
    """The product's table and the benchmarks' probes (bench/shaders/) alike."""
    assert {"matvec_q4_0_f32_f32", "handoff_probe", "persistent_probe"} <= set(tool.VARIANTS)
    stale = tool.stale_variants()
    assert not stale, f"stale or missing SPIR-V (run `make shaders`): {stale}"


def test_probes_are_not_product_kernels():
    """The product table (what the wheel's shaders/spv holds) has no bench probe."""
    from bench.shaders import VARIANTS as PROBES
    from phoenix_chat.engine.backends.vulkan.pipelines import VARIANTS

    assert not set(PROBES) & set(VARIANTS)
    assert all(v.spv_path.parent == REPO / "bench" / "shaders" / "spv" for v in PROBES.values())


def test_step_struct_is_generated_from_the_host_layout():
    """shaders/include/step.glsl's `struct Step` is the text `ops_common.STEP` generates (the
    host packs the same layout), so the two cannot drift apart."""
    assert not tool.stale_generated(), "run `make shaders`: step.glsl differs from ops_common.STEP"
    from phoenix_chat.engine.backends.vulkan.ops_common import STEP

    assert STEP.struct_glsl() in (REPO / "shaders" / "include" / "step.glsl").read_text()


def test_hash_covers_includes_and_defines():
    v = tool.VARIANTS["matvec_q4_0_f32_f32"]
    names = {p.name for p in tool.sources(REPO / "shaders" / v.shader)}
    assert {"matvec.comp", "common.glsl", "matvec_dot.glsl"} <= names
    other = tool.VARIANTS["matvec_q8_0_f32_f32"]
    assert tool.variant_hash(v) != tool.variant_hash(other)
