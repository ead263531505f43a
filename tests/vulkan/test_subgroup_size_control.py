"""Required subgroup sizes (VK_EXT_subgroup_size_control): a matvec pipeline may ask for a wave
size (RDNA: 32 or 64), and the autotuner times the subgroup-row shapes in both of AMD's sizes
where the device lets it. lavapipe offers exactly its own size, which exercises the create-info
path; the candidate lists are checked on an RDNA-shaped copy of the capabilities."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from phoenix_chat.engine.backends.vulkan.autotune import matvec_candidates
from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix
from phoenix_chat.engine.backends.vulkan.ops_gemm import cf_refusal, cf_subgroup
from phoenix_chat.engine.backends.vulkan.pipelines import SUBGROUP_SIZE
from tests.vulkan import test_matvec


def rdna(caps, default: int):
    """The capabilities as RADV on an RDNA3 iGPU reports them: wave64 by default (32 with
    RADV_PERFTEST=cswave32), either size on request."""
    return dataclasses.replace(
        caps,
        name="AMD Radeon Graphics (RADV PHOENIX)",
        device_type="integrated",
        subgroup_size=default,
        subgroup_size_range=(32, 64),
        compute_subgroup_sizes=(32, 64),
    )


def test_lavapipe_offers_its_own_size(vk_device):
    caps = vk_device.caps
    lo, hi = caps.subgroup_size_range
    assert caps.compute_subgroup_sizes, "subgroup size control for compute (Vulkan 1.3 core) is off"
    assert caps.subgroup_size in caps.compute_subgroup_sizes
    assert all(lo <= s <= hi and s & (s - 1) == 0 for s in caps.compute_subgroup_sizes)


def test_a_required_size_builds_its_own_pipeline_and_computes_right(vk_device):
    dev = vk_device
    sg = dev.caps.compute_subgroup_sizes[-1]
    spec = {"WG": 4 * sg, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4}
    plain = dev.pipeline("matvec_q8_0_f32_f32", **spec)
    required = dev.pipeline("matvec_q8_0_f32_f32", **spec, SUBGROUP_SIZE=sg)
    assert required is not plain and required.subgroup_size == sg and plain.subgroup_size == 0
    assert dev.pipeline("matvec_q8_0_f32_f32", **spec, SUBGROUP_SIZE=sg) is required
    raw, ref = test_matvec.make_weights(Q.Q8_0, 19, 2048, seed=7)
    x = np.random.default_rng(8).standard_normal(2048).astype(np.float32)
    m = WeightMatrix.upload(dev, raw, Q.Q8_0, (19, 2048))
    got = test_matvec.run(dev, [m], x, spec={**spec, "SUBGROUP_SIZE": sg})
    assert test_matvec.nmse(got, ref @ x.astype(np.float64)) < test_matvec.F32_NMSE


def test_a_size_the_device_cannot_take_is_refused(vk_device):
    bad = 128 if 128 not in vk_device.caps.compute_subgroup_sizes else 2
    with pytest.raises(ValueError, match=f"subgroup size {bad} cannot be required"):
        vk_device.pipeline("matvec_q8_0_f32_f32", WG=128, SUBGROUP_SIZE=bad)


@pytest.mark.parametrize("default", [64, 32])
def test_rdna_candidates_cover_wave64_and_wave32(vk_device, default):
    specs = matvec_candidates(rdna(vk_device.caps, default))
    other = 96 - default
    # the default size's shapes, workgroups of up to 4 subgroups of it, no size required
    assert {s["WG"] for s in specs if "SUBGROUP_SIZE" not in s} >= {default, 2 * default, 4 * default}
    required = [s for s in specs if "SUBGROUP_SIZE" in s]
    assert required and all(s["SUBGROUP_SIZE"] == other and s["SUBGROUP_ROWS"] for s in required)
    assert {s["WG"] for s in required} == {other, 2 * other, 4 * other}
    # a device without the choice (NVIDIA: 32 only) keeps one size
    nv = dataclasses.replace(rdna(vk_device.caps, 32), subgroup_size_range=(32, 32), compute_subgroup_sizes=(32,))
    assert not any("SUBGROUP_SIZE" in s for s in matvec_candidates(nv))


def rdna_device(vk_device, default: int, sizes: tuple[int, ...] = (32, 64)):
    """A stand-in for a device on RADV (there is no RDNA GPU here): lavapipe's capabilities
    reshaped as RADV reports a 780M's (cooperative matrices, 64 KiB of shared memory), for the
    decisions that read only the capabilities."""
    caps = dataclasses.replace(
        rdna(vk_device.caps, default),
        cooperative_matrix=True,
        shared_memory=64 << 10,
        max_workgroup_invocations=1024,
        compute_subgroup_sizes=sizes,
    )
    return types.SimpleNamespace(caps=caps)


def test_the_few_token_matrix_core_tiles_ask_a_wave64_driver_for_wave32(vk_device):
    """gemm_coopmat_few.comp is compiled for 32-lane subgroups: RADV's wave64 default is asked for
    32 through VK_EXT_subgroup_size_control instead of refusing the tiles (as it did before)."""
    radv = rdna_device(vk_device, 64)
    assert cf_subgroup(radv) == {SUBGROUP_SIZE: 32}
    assert cf_refusal(radv, "Q4_0", 2048, "cmf1hr", False) is None  # a record tile: no layout to check
    assert cf_subgroup(rdna_device(vk_device, 32)) == {}  # RADV_PERFTEST=cswave32: nothing to ask
    # a driver that cannot be asked for 32 lanes still refuses them, and says so
    fixed64 = rdna_device(vk_device, 64, sizes=(64,))
    why = cf_refusal(fixed64, "Q4_0", 2048, "cmf1hr", False)
    assert why == cf_subgroup(fixed64) and "cannot be asked for" in why and "[64]" in why
