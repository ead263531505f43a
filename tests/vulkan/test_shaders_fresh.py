"""The committed SPIR-V matches its sources: `make shaders` was run after the last shader edit."""
from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _build_tool():
    spec = importlib.util.spec_from_file_location("build_shaders", REPO / "tools" / "build_shaders.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_variant_has_a_fresh_spv():
    tool = _build_tool()
    stale = tool.stale_variants()
    assert not stale, f"stale or missing SPIR-V (run `make shaders`): {stale}"


def test_step_struct_is_generated_from_the_host_layout():
    """shaders/include/step.glsl's `struct Step` is the text `ops_common.STEP` generates (the
    host packs the same layout), so the two cannot drift apart."""
    tool = _build_tool()
    assert not tool.stale_generated(), "run `make shaders`: step.glsl differs from ops_common.STEP"
    from engine.backends.vulkan.ops_common import STEP
    assert STEP.struct_glsl() in (REPO / "shaders" / "include" / "step.glsl").read_text()


def test_hash_covers_includes_and_defines():
    tool = _build_tool()
    v = tool.VARIANTS["matvec_q4_0_f32_f32"]
    names = {p.name for p in tool.sources(REPO / "shaders" / v.shader)}
    assert {"matvec.comp", "common.glsl", "matvec_dot.glsl"} <= names
    other = tool.VARIANTS["matvec_q8_0_f32_f32"]
    assert tool.variant_hash(v) != tool.variant_hash(other)
