"""test_any_subgroup_size.py again under lavapipe at 4, 32 and 64 lanes (the session runs it at
the default, 8): lavapipe takes its subgroup size from LP_NATIVE_VECTOR_WIDTH, read when the
Vulkan instance is made, so each size is a pytest of its own in a subprocess. 64 is the
Radeon 780M's compute default under RADV (wave64), 32 NVIDIA's and RDNA's wave32, 4 the
narrowest a driver reports. The real 270M's tests run at the default size only; at 4, 32 and 64
the kernel tests.

What lavapipe can and cannot stand in for: above 16 lanes it reports the size asked for
(subgroupSize and gl_SubgroupSize = width / 32) but runs compute subgroups of at most 16
invocations (Mesa's lp_state_cs.c caps the SIMD vector at 16: `MIN2(lp_native_vector_width / 32,
16)`), so a 32-invocation workgroup has gl_NumSubgroups 2 and lane ids 0..15. The 32 and 64 runs
therefore check the host's shapes for those sizes and kernels under partial subgroups (which
wave64 meets in a 32-wide workgroup), not 64 lanes executing together.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vulkan.test_any_subgroup_size import N_SPECS

ROOT = Path(__file__).resolve().parents[2]
MODULE = Path(__file__).resolve().with_name("test_any_subgroup_size.py")
WIDTH_BITS = {4: 128, 32: 1024, 64: 2048}  # subgroup size -> LP_NATIVE_VECTOR_WIDTH
# The kernels run at every size, each in the GPU shapes of that size; the whole 270M only at the
# session's own size (its GPU shapes included): its three tests were ~140 s of each size's ~155 on a
# 2-core machine, and the CI run that ran them at every size ran out of its 90 minutes.
MODEL_TESTS = "test_270m_"
# The CPU device's own shapes (the matvec's whole-rows shape, the last of the specs, and the lanes
# GEMM) run at 4 lanes too (lavapipe on a CPU without AVX) but not at 32 or 64: no CPU Vulkan
# device runs those, and compiling them for 1024- and 2048-bit vectors took ~190 s of CI.
CPU_SHAPE_TESTS = (f"test_matvec_every_shape[{N_SPECS - 1}]", "test_gemm[lanes]")


@pytest.mark.parametrize("size", sorted(WIDTH_BITS))
def test_kernels_at_subgroup_size(vk_device, size):
    if not vk_device.caps.is_software or "llvmpipe" not in vk_device.name:
        pytest.skip(f"{vk_device.name} is not lavapipe: its subgroup size is the hardware's")
    env = {
        **os.environ,
        "LP_NATIVE_VECTOR_WIDTH": str(WIDTH_BITS[size]),
        "PHOENIX_EXPECT_SUBGROUP_SIZE": str(size),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
    cmd.append(str(MODULE))
    cmd += ["-k", f"not {MODEL_TESTS}"]
    if size > 16:
        for test in CPU_SHAPE_TESTS:
            cmd += ["--deselect", f"{MODULE.relative_to(ROOT)}::{test}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"subgroup size {size}:\n{tail}"
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)\b", tail)}
    bad = {k: v for k, v in counts.items() if k in ("failed", "skipped", "xfailed", "xpassed", "error", "errors")}
    assert counts.get("passed") and not bad, tail
