"""The kernels and the real 270M at whatever subgroup size the device runs, in the workgroup
shapes a GPU gets as well as the CPU device's own: test_subgroup_sizes.py re-runs this module
under lavapipe at 4, 32 and 64 lanes (LP_NATIVE_VECTOR_WIDTH; 64 is RADV's wave64), the normal
session runs it at the default (8 on lavapipe, 32 on NVIDIA). A short, representative slice of
each kernel file's tests (the full ones run at the default size), chosen so the three extra
runs stay within a few CI minutes.

GPU shapes forced on lavapipe: every matvec candidate the autotuner times on a GPU of this
subgroup size (subgroup-row, cooperative, multi-column), the tiled f32 GEMM beside the CPU
devices' lanes GEMM, split-K decode attention, device sampling; and the whole model on a
device that presents itself as an integrated GPU (so the backend takes every GPU default).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from phoenix_chat.engine.backends.vulkan.autotune import matvec_candidates
from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix, default_spec, subgroup_rows_spec
from tests.vulkan import (
    test_matvec,
    test_matvec_cols,
    test_ops_attention,
    test_ops_attention_prefill,
    test_ops_gemm,
    test_ops_norm,
    test_ops_rope,
    test_ops_sample,
)

EXPECTED_SIZE = os.environ.get("PHOENIX_EXPECT_SUBGROUP_SIZE")  # set by test_subgroup_sizes.py
CTX = 256
PPL_CTX = 64
GREEDY = 4  # tokens compared with transformers' (the module runs four times: each token counts)


def gpu_caps(dev):
    """The device's capabilities as an integrated GPU of the same subgroup size would report them."""
    return dataclasses.replace(dev.caps, device_type="integrated", name="an integrated GPU (shapes forced)")


@pytest.fixture(scope="module", autouse=True)
def _the_requested_size(vk_device):
    if EXPECTED_SIZE is not None:
        assert vk_device.caps.subgroup_size == int(EXPECTED_SIZE), "the device did not take LP_NATIVE_VECTOR_WIDTH"
    print(f"subgroup size {vk_device.caps.subgroup_size}")


def matvec_specs(dev):
    """The GPU autotuner's candidates at this subgroup size, then the CPU device's own shape."""
    return [*matvec_candidates(gpu_caps(dev)), default_spec(dev)]


N_SPECS = 7


def test_the_spec_count_is_current(vk_device):
    assert len(matvec_specs(vk_device)) == N_SPECS


@pytest.mark.parametrize("si", range(N_SPECS))
def test_matvec_every_shape(vk_device, si):
    """Each workgroup shape over the 270M's weight types, f32 and int8 activations, GEGLU."""
    check_matvec(vk_device, matvec_specs(vk_device)[si])


def check_matvec(dev, spec):
    rows, cols = 70, 1024
    x = np.random.default_rng(3).standard_normal(cols).astype(np.float32)
    for qtype in (Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K):
        raw, ref = test_matvec.make_weights(qtype, rows, cols, seed=int(qtype))
        m = WeightMatrix.upload(dev, raw, qtype, (rows, cols))
        want = ref @ x.astype(np.float64)
        assert test_matvec.nmse(test_matvec.run(dev, [m], x, spec=spec), want) < test_matvec.F32_NMSE, (qtype, spec)
        if qtype == Q.Q8_0:
            got = test_matvec.run(dev, [m], x, int_dot=True, spec=spec)
            assert test_matvec.nmse(got, want) < test_matvec.INT8_NMSE, (qtype, spec)
        m.tensor.buffer.destroy()
    test_matvec.test_geglu_gate_up(dev, False, spec)


def test_matvec_epilogues_in_gpu_shapes(vk_device):
    """The decode fusions (norm tail, QKV + rope, prologues) and the multi-column matvec, GPU-shaped;
    the multi-column one also on rows of 2048 columns (more chunks than lanes)."""
    dev = vk_device
    spec = subgroup_rows_spec(dev, 2)
    test_matvec.test_norm_tail_epilogue(dev, spec, False)
    test_matvec.test_qkv_rope_epilogue_matches_matvec_then_rope(dev, spec, False, Q.Q5_0)
    if dev.caps.int_dot:  # the prologues, strided over 3 workgroups
        test_matvec.test_prologue_matches_the_dispatch_it_replaces(dev, spec, 3, "norm_add", "geglu", Q.Q4_0)
        test_matvec.test_prologue_matches_the_dispatch_it_replaces(dev, spec, 3, "quant", None, Q.Q6_K)
    test_matvec.test_several_vectors_in_one_pass_over_the_weights(dev, Q.Q4_K)
    test_matvec.test_several_vectors_on_long_rows(dev, Q.Q8_0)


def test_multi_column_int8_matvec(vk_device):
    """The int8 multi-column matvec at this subgroup size (a slice: each shape is a pipeline that
    llvmpipe compiles slowly at 32 and 64 lanes): block-pair rows (Q4_0: 640 columns, 10 pairs)
    in two of the shapes the load-time timing picks among and chunk rows (Q4_K: 512 columns, 16
    chunks), plain and GEGLU, several column tiles each; a fused QKV with v of another type."""
    if not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    for qtype, rows, tile in ((Q.Q4_0, 1, 4), (Q.Q4_0, 2, 8), (Q.Q4_K, 2, 8)):
        test_matvec_cols.test_tiles_and_row_shapes(vk_device, qtype, tile, rows)
    test_matvec_cols.test_fused_qkv(vk_device, (Q.Q5_0, Q.Q8_0))


def test_multi_column_int8_matvec_long_rows(vk_device):
    """Rows of 2048 columns (32 block pairs: every lane of a 32-lane subgroup holds work)."""
    if not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    test_matvec_cols.test_rows_off_the_block_pair_path(vk_device, Q.Q4_0)


@pytest.mark.parametrize(
    "qtype",
    [Q.Q4_1, Q.Q5_1, Q.IQ4_NL, Q.IQ4_XS, Q.Q2_K, Q.Q3_K, Q.IQ3_XXS, Q.IQ3_S, Q.IQ2_XS, Q.IQ2_S],
    ids=lambda q: q.name,
)
def test_low_bit_types(vk_device, qtype):
    """Issue 25's types at this subgroup size: the subgroup-row matvec with f32 and int8
    activations on 70 odd rows of 768 columns (3 K-quant blocks: fewer chunks than lanes at 32
    and 64), and the tiled GEMM on an odd shape, against the `gguf` dequantizer in float64."""
    dev = vk_device
    rows, cols = 70, 768
    raw, ref = test_matvec.make_weights(qtype, rows, cols, seed=int(qtype))
    m = WeightMatrix.upload(dev, raw, qtype, (rows, cols))
    try:
        x = np.random.default_rng(5).standard_normal(cols).astype(np.float32)
        want = ref @ x.astype(np.float64)
        spec = subgroup_rows_spec(dev, 2)
        assert test_matvec.nmse(test_matvec.run(dev, [m], x, spec=spec), want) < test_matvec.F32_NMSE
        if dev.caps.int_dot:
            got = test_matvec.run(dev, [m], x, int_dot=True, spec=spec)
            assert test_matvec.nmse(got, want) < test_matvec.INT8_NMSE
    finally:
        m.tensor.buffer.destroy()
    test_ops_gemm.check_gemm(dev, qtype.name, 13, 37, 512, "tiled", int(qtype))


@pytest.mark.parametrize("kern", ["tiled", "lanes"])
def test_gemm(vk_device, kern):
    for seed, wtype in enumerate(("Q8_0", "Q4_K")):
        test_ops_gemm.check_gemm(vk_device, wtype, 37, 100, 512, kern, seed)
    test_ops_gemm.test_gemm_geglu_strides(vk_device, "Q4_0", kern)


@pytest.mark.parametrize("case", [0, 1, 7, 8])
def test_split_k_attention(vk_device, case):
    test_ops_attention.test_attention_decode(vk_device, *test_ops_attention.CASES[case])


def test_attention_q8_1_and_prefill(vk_device):
    test_ops_attention.test_attention_decode_writes_q8_1_bit_identical(vk_device, *test_ops_attention.CASES[2])
    for case in test_ops_attention_prefill.CASES[:2]:
        test_ops_attention_prefill.test_attention_prefill(vk_device, *case)


def test_norms_and_rope(vk_device):
    dev = vk_device
    test_ops_norm.test_norm(dev, 3, 1152)
    for wg in (None, 64):
        test_ops_norm.test_norm_add(dev, 4, 2560, wg)
        test_ops_norm.test_norm_add_split(dev, 640, wg)
    test_ops_norm.test_norm_writes_q8_1_bit_identical(dev, True, 3, 1152, None)
    test_ops_rope.test_rope_kv(dev, *test_ops_rope.CASES[1])


def test_device_sampling(vk_device):
    for vocab in (262144, 1000):
        test_ops_sample.test_greedy_is_argmax(vk_device, vocab)
    test_ops_sample.test_sampling_distribution(vk_device, 1.3, 10, 0.95, 0.1)
    test_ops_sample.test_gaussian_logits_radix_select(vk_device)
    for case in ("gaussian", "few_values", "ragged_vocab"):
        test_ops_sample.test_block_candidates_are_each_blocks_exact_top_kc(vk_device, case, "device")


# ---- the real 270M --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def weights():
    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    return open_weights(embedded_model_path())


@pytest.fixture(scope="module")
def golden():
    from tests.vulkan.test_model_quality import GOLDENS

    return np.load(GOLDENS / "transformers_270m.npz")


def _capital(golden) -> list[int]:
    """transformers' first GREEDY tokens after the capital prompt."""
    return golden["capital_greedy_ids"][:GREEDY].tolist()


def _greedy(backend, ids, n):
    from phoenix_chat.engine.generate import generate_step
    from phoenix_chat.engine.sampling import SamplingParams

    class _M:  # generate_step needs only `.backend`
        def __init__(self, backend):
            self.backend = backend

    return list(generate_step(_M(backend), ids, SamplingParams(temperature=0), n))


@pytest.fixture(scope="module")
def cpu_ppl(weights, golden) -> float:
    """The CPU reference's perplexity of the one window both model tests score, computed once."""
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.perplexity import perplexity_of_ids

    ids = golden["ppl_ids"][:PPL_CTX].tolist()
    return perplexity_of_ids(CpuBackend(weights, CTX), ids, PPL_CTX, 2, max_windows=1)["ppl"]


def test_270m_in_the_devices_own_shapes(weights, golden, cpu_ppl, vk_device):
    """Greedy tokens equal transformers' (which the CPU reference matches, test_model_quality);
    perplexity of one window within 1% of the CPU reference's."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.perplexity import perplexity_of_ids

    ids = golden["ppl_ids"][:PPL_CTX].tolist()
    backend = VulkanBackend(weights, CTX, VulkanOptions(int_dot=False), device=vk_device)
    try:
        assert _greedy(backend, golden["capital_prompt_ids"].tolist(), GREEDY) == _capital(golden)
        ppl = perplexity_of_ids(backend, ids, PPL_CTX, 2, max_windows=1)["ppl"]
    finally:
        backend.close()
    ref = cpu_ppl
    print(f"perplexity vulkan {ppl:.4f} cpu {ref:.4f}")
    assert abs(ppl / ref - 1) < 0.01


def test_270m_in_gpu_shapes(weights, golden, cpu_ppl, vk_device, monkeypatch):
    """The backend on a device that reports itself an integrated GPU: subgroup-row matvecs
    with their norm/rope fusions, the prompt through the multi-column matvecs, split-K
    attention, device greedy sampling — the same tokens as transformers — and one perplexity window
    through the GPU-shaped GEMM within 1% of the CPU reference's. The 262144-row output
    head keeps the CPU device's shapes: in subgroup rows its matvec is 32768 workgroups, which
    cost lavapipe 3 s a token, and the tiled GEMM over a window's 64 positions took ~80 of this
    test's ~95 s alone (its GPU shapes are checked above on 70 rows, test_matvec_every_shape,
    and the tiled GEMM on Q8_0 in test_gemm)."""
    from phoenix_chat.engine.backends.vulkan import matvec, ops_gemm
    from phoenix_chat.engine.backends.vulkan.autotune import MatvecChoice
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.backends.vulkan.gemm_tuning import shape_key
    from phoenix_chat.engine.perplexity import perplexity_of_ids

    cpu_spec, cpu_gemm = matvec.default_spec(vk_device), ops_gemm.kernel(vk_device)

    monkeypatch.setattr(vk_device, "caps", gpu_caps(vk_device))
    assert not vk_device.caps.is_software
    opts = VulkanOptions(int_dot=False, autotune=False, few_token_matvec=True)
    backend = VulkanBackend(weights, CTX, opts, device=vk_device)
    try:
        assert matvec.default_spec(vk_device)["SUBGROUP_ROWS"] > 0
        assert ops_gemm.kernel(vk_device) == "tiled" != cpu_gemm  # the layers' prefill GEMM
        assert backend.tuning.qkv_rope is not None and backend.plan.n_splits > 1
        backend.tuning.matvec["lm"] = MatvecChoice(0.0, False, cpu_spec)
        head = backend.device_weights.lm_head
        lm_shape = shape_key(head.qtype.name, head.rows, weights.config.hidden_size, geglu=False)
        backend.tuning.gemm_kernels[lm_shape] = cpu_gemm
        backend.drop_recordings()
        assert _greedy(backend, golden["capital_prompt_ids"].tolist(), GREEDY) == _capital(golden)
        ids = golden["ppl_ids"][:PPL_CTX].tolist()
        ppl = perplexity_of_ids(backend, ids, PPL_CTX, 2, max_windows=1)["ppl"]  # the window through the GEMM
    finally:
        backend.close()
    ref = cpu_ppl
    print(f"perplexity vulkan (GPU shapes) {ppl:.4f} cpu {ref:.4f}")
    assert abs(ppl / ref - 1) < 0.01


def test_270m_with_prologues(weights, golden, vk_device):
    """Decode with the norm_adds and the down's quantize run as the next matvecs' prologues
    (the int8 path of every reader of h, the row groups strided over 4 workgroups): the same
    greedy tokens as transformers."""
    if not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    from phoenix_chat.engine.backends.vulkan.autotune import MatvecChoice
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    backend = VulkanBackend(weights, CTX, VulkanOptions(int_dot=True, autotune=False), device=vk_device)
    try:
        t = backend.tuning
        t.matvec = {k: MatvecChoice(0.0, True, None) for k in ("qkv", "o", "geglu", "down")}
        t.norm_tail, t.prologue_groups = {"o": False, "down": False}, 4
        backend.drop_recordings()
        assert backend.graph.prologues(), backend.graph.prologue_refusal()
        assert _greedy(backend, golden["capital_prompt_ids"].tolist(), GREEDY) == _capital(golden)
    finally:
        backend.close()
