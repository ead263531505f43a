"""The prefill GEMM's tile per weight shape (engine/backends/vulkan/gemm_tuning.py): every
shape of the model timed on a matrix-core device and looked up by the graph; a device without
matrix cores says why nothing was timed. The matrix-core half runs on GPUs that have them
(checked on an NVIDIA H100, docs/PERFORMANCE.md); on lavapipe only the refusal and the lookup."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan import gemm_tuning, ops_gemm
from phoenix_chat.engine.backends.vulkan.autotune import FEW_TOKENS, Tuning


@pytest.fixture(scope="module")
def tiny_weights(open_tiny):
    return open_tiny("q4_0", seed=5)


def test_lookup_prefers_the_shape_then_the_forward_then_few():
    t = Tuning(gemm_kernel="coopmat_l", gemm_kernel_few="coopmat_s")
    key = gemm_tuning.shape_key("q4_0", 96, 64, geglu=False)
    assert key == "Q4_0 96x64"
    assert gemm_tuning.shape_key("Q6_K", 128, 64, geglu=True) == "Q6_K 128x64 geglu"
    t.gemm_kernels[key] = "coopmat_p"
    assert t.gemm_kernel_for(512, key) == "coopmat_p"
    assert t.gemm_kernel_for(512, "Q8_0 1x1") == "coopmat_l"  # not timed: the forward's tile
    assert t.gemm_kernel_for(FEW_TOKENS, key) == "coopmat_s"  # a few tokens: the few-token tile
    t.gemm_kernels_few[FEW_TOKENS] = {key: "cm8f2"}
    assert t.gemm_kernel_for(FEW_TOKENS, key) == "cm8f2"  # ... the shape's own where one was timed
    assert t.gemm_kernel_for(5, key) == "cm8f2"  # (the only timed count: the largest)
    assert t.gemm_kernel_for(FEW_TOKENS, "Q8_0 1x1") == "coopmat_s"
    assert t.gemm_kernel_for(FEW_TOKENS + 1, key) == "coopmat_p"
    # per timed count: a forward of T tokens takes the smallest count >= T
    t.gemm_kernels_few[8] = {key: "cmw1_4"}
    t.gemm_kernels_few[16] = {key: "cmd2_4"}
    assert [t.few_count(T) for T in (2, 8, 9, 16, 17, 32, 33)] == [8, 8, 16, 16, 32, 32, None]
    assert [t.gemm_kernel_for(T, key) for T in (2, 8, 9, 17)] == ["cmw1_4", "cmw1_4", "cmd2_4", "cm8f2"]
    assert t.gemm_kernel_for(5, "Q8_0 1x1") == "coopmat_s"  # a shape not timed at that count
    assert gemm_tuning.most_chosen(t) == "coopmat_p"
    assert gemm_tuning.most_chosen(Tuning()) is None


def test_each_shape_is_timed_across_layers_not_on_one_matrix(tiny_weights, vk_device):
    """The shape timing cycles through the shape's occurrences in successive layers (as a forward
    reads them, from memory): one matrix timed again and again ran from a big GPU's L2."""
    from phoenix_chat.engine.backends.vulkan.autotune import TUNE_LAYERS
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    be = VulkanBackend(tiny_weights, 64, device=vk_device)
    try:
        layers = be.graph.weights.layers
        rotations = gemm_tuning.shape_rotations(be.graph, lm_head=True)
        firsts = gemm_tuning.model_shapes(be.graph, lm_head=True)
        assert set(rotations) == set(firsts)
        gate_up = next(k for k in rotations if k.endswith("geglu"))
        rotation, cols = rotations[gate_up]
        assert [mats[0] for mats in rotation] == [L.gate for L in layers][:TUNE_LAYERS]
        assert [mats[1] for mats in rotation] == [L.up for L in layers][:TUNE_LAYERS]
        assert len(rotation) == min(len(layers), TUNE_LAYERS) > 1 and cols == layers[0].gate.cols
        for key, (rotation, _) in rotations.items():
            assert rotation[0] == firsts[key][0]  # the first occurrence leads
            assert len({id(mats[0]) for mats in rotation}) == len(rotation)  # each from its own layer
            assert all(
                gemm_tuning.shape_key(m[0].qtype.name, m[0].rows, m[0].cols, len(m) == 2) == key for m in rotation
            )
        lm = be.graph.weights.lm_head
        assert rotations[gemm_tuning.shape_key(lm.qtype.name, lm.rows, lm.cols, False)][0] == [[lm]]
        assert all(len(r) <= 2 for r, _ in gemm_tuning.shape_rotations(be.graph, most=2).values())
    finally:
        be.close()


def test_every_tile_fits_its_shared_memory_budget():
    # the largest tiles were sized to 48 KiB, the least a matrix-core GPU we target offers
    for kn in ops_gemm.COOPMAT_KERNELS:
        for geglu in (False, True):
            assert ops_gemm.cm_shared_bytes(kn, geglu) <= 48 << 10, (kn, geglu)


def test_without_matrix_cores_nothing_is_timed_and_it_says_why(tiny_weights, vk_device):
    if ops_gemm.coopmat_ok(vk_device):
        pytest.skip(f"{vk_device.name} has matrix cores")
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    be = VulkanBackend(tiny_weights, 64, device=vk_device)
    try:
        why = gemm_tuning.choose_gemm_kernels(be.graph, 32)
        if gemm_tuning.int8_candidates(vk_device, be.graph.int_dot):
            pytest.skip(f"{vk_device.name} times its int8 tiles")
        assert why and why.startswith(str(ops_gemm.coopmat_refusal(vk_device)))
        assert "int8" in why  # and why the int8 tiles were not timed either
        assert be.tuning.gemm_kernels == {}
    finally:
        be.close()


def test_every_model_shape_gets_a_timed_tile(tiny_weights, vk_device):
    if not ops_gemm.coopmat_ok(vk_device):
        pytest.skip(f"{vk_device.name} has no VK_KHR_cooperative_matrix f16 16x16x16")
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    be = VulkanBackend(tiny_weights, 64, device=vk_device)
    try:
        st = be.stats()
        shapes = gemm_tuning.model_shapes(be.graph)
        assert set(st["gemm_kernels"]) == set(shapes)  # q, k, v, o, gate/up, down of the tiny model
        for key, kn in st["gemm_kernels"].items():
            timed = st["gemm_shape_timing"][key]
            assert kn == min(timed, key=timed.__getitem__)
            allowed = set(ops_gemm.COOPMAT_KERNELS) | set(ops_gemm.INT8_KERNELS) | set(ops_gemm.CF_PREFILL_KERNELS)
            assert set(timed) <= allowed
            if vk_device.caps.int_dot:  # the int8 tiles compete (with the quantize of x they need)
                assert set(timed) & set(ops_gemm.INT8_KERNELS)
            wtype, cols = key.split()[0], int(key.split()[1].split("x")[1])
            if ops_gemm.cf_refusal(vk_device, wtype, cols, "cpd2_8", key.endswith("geglu")) is None:
                assert set(timed) >= set(ops_gemm.CF_PREFILL_KERNELS), key  # the register-built prefill tiles
        chosen = gemm_tuning.most_chosen(be.tuning)
        if chosen is not None:
            assert st["gemm_kernel"] == chosen
        else:  # every shape took a register-built tile: the tile of shapes not timed from a whole forward
            assert st["gemm_kernel"] == min(st["gemm_timing"], key=st["gemm_timing"].__getitem__)
        # the few-token tiles: every shape timed at 8, 16 and 32 tokens, the LM head's too (a
        # batched step's rows each need logits), the fastest kept — or the tile a batched step's
        # search kept in the whole step (step_tiles.py)
        assert sorted(st["gemm_kernels_few"]) == [8, 16, FEW_TOKENS]
        few_shapes = gemm_tuning.model_shapes(be.graph, lm_head=True)
        lm = be.graph.weights.lm_head
        assert set(few_shapes) - set(shapes) == {gemm_tuning.shape_key(lm.qtype.name, lm.rows, lm.cols, False)}
        for count, chosen in st["gemm_kernels_few"].items():
            assert set(chosen) == set(few_shapes), count
            search = st.get("batch_step_tiles", {}).get(count)
            kept = search["kept"] if isinstance(search, dict) else {}
            for key, kn in chosen.items():
                timed = st["gemm_shape_timing_few"][count][key]
                assert kn == kept.get(key, min(timed, key=timed.__getitem__)), (count, key, kept)
        key = next(iter(shapes))
        assert be.tuning.gemm_kernel_for(5, key) == st["gemm_kernels_few"][8][key]
        assert be.tuning.gemm_kernel_for(12, key) == st["gemm_kernels_few"][16][key]
        # the prefill through the chosen tiles is the CPU's (argmax of every position)
        from phoenix_chat.engine.backends.cpu import CpuBackend

        ids = np.random.default_rng(4).integers(3, 4096, 60).tolist()
        got = be.forward(ids, 0, all_logits=True)
        cpu_be = CpuBackend(tiny_weights, 64)
        cpu = cpu_be.forward(ids, 0, all_logits=True)
        assert np.mean(got.argmax(-1) == cpu.argmax(-1)) >= 0.98
        np.testing.assert_allclose(got, cpu, atol=2e-2 * np.abs(cpu).max())
        # ... and 5 then 12 more tokens through the GEMM path, each count's own tiles
        t = be.tuning
        t.few_token_int8, t.few_token_matvec = frozenset(), frozenset()
        t.cols_timing.clear()
        be.drop_recordings()
        for start, n in ((60 - 17, 5), (60 - 12, 12)):
            got = be.forward(ids[start : start + n], start, all_logits=True)
            # on a GPU each chunk runs in its prefill bucket's recording (8 and 16 tokens)
            assert set(be.stats()["few_token_paths"][be._recorded_count(n, be.prefill_chunk)].values()) == {"gemm"}
            np.testing.assert_allclose(got, cpu[start : start + n], atol=2e-2 * np.abs(cpu).max())
    finally:
        be.close()


def test_int8_tiles_compete_only_where_int8_activations_are_on(tiny_weights, vk_device, monkeypatch):
    """On a GPU with the int8 dot (lavapipe dressed as one) the per-shape timing includes the int8
    tiles and the f32 tiled GEMM they must beat; `VulkanOptions(int_dot=False)` keeps every
    activation unquantized, so then no int8 tile is timed or chosen, and the note says why."""
    import dataclasses

    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    if ops_gemm.coopmat_ok(vk_device) or not vk_device.caps.int_dot:
        pytest.skip(f"{vk_device.name}: this checks a GPU with the int8 dot and no matrix cores")
    forced = dataclasses.replace(vk_device.caps, device_type="integrated", name="an integrated GPU (shapes forced)")
    monkeypatch.setattr(vk_device, "caps", forced)
    for int_dot in (True, False):
        # few_token_matvec set: the load skips timing a short prompt's path (matvec or GEMM), 18-25 s
        # of lavapipe's ~30 a load, which this test does not read
        opts = VulkanOptions(int_dot=int_dot, autotune=False, few_token_matvec=False)
        be = VulkanBackend(tiny_weights, 64, opts, device=vk_device)
        try:
            st, note = be.stats(), be.tuning.gemm_kernels_note
            shapes = set(gemm_tuning.model_shapes(be.graph))
        finally:
            be.close()
        if int_dot:
            assert set(st["gemm_kernels"]) == shapes and not note
            for timed in st["gemm_shape_timing"].values():
                assert "tiled" in timed and set(timed) & set(ops_gemm.INT8_KERNELS)
        else:
            assert not st.get("gemm_kernels") and "int8 activations are off (VulkanOptions.int_dot" in note


def test_few_token_tiles_say_why_they_do_not_run(vk_device, monkeypatch):
    """gemm_coopmat_few.comp's tiles refuse, with the reason, a device without f16 matrix cores
    (lavapipe), other than 32-lane subgroups, a type they are not built for, K not a multiple of
    64, and PHOENIX_VULKAN_CF=0 (for comparisons); a refused tile is never timed."""
    why = ops_gemm.cf_refusal(vk_device, "Q4_0", 256, "cmf1h", False)
    if ops_gemm.coopmat_ok(vk_device) and vk_device.caps.subgroup_size == ops_gemm.CF_SUBGROUP:
        assert why is None
        assert "built for" in str(ops_gemm.cf_refusal(vk_device, "Q2_K", 256, "cmf1h", False))
        assert "whole words" in str(ops_gemm.cf_refusal(vk_device, "Q4_K", 256, "cmf1r", False))
        assert "K step 64" in str(ops_gemm.cf_refusal(vk_device, "Q4_0", 96, "cmf1h", False))
    else:
        assert why is not None
    # the memory plan counts their split-K scratch exactly where they can run
    assert ops_gemm.cf_scratch_bytes(vk_device) == (ops_gemm.CF_SPLIT_BYTES if why is None else 0)
    assert not set(gemm_tuning.candidates_for(vk_device, "Q4_0", 96, False, few=True)) & set(ops_gemm.CF_KERNELS)
    assert not set(gemm_tuning.candidates_for(vk_device, "Q4_0", 256, False, few=False)) & set(ops_gemm.CF_KERNELS)
    # the prefill tiles of the same kernel compete in the prefill timing alone, where they can run
    prefill = set(gemm_tuning.candidates_for(vk_device, "Q4_0", 256, False, few=False))
    direct = ops_gemm.cf_refusal(vk_device, "Q4_0", 256, "cpd2_8", False) is None
    assert prefill >= set(ops_gemm.CF_PREFILL_KERNELS) if direct else not prefill & set(ops_gemm.CF_PREFILL_KERNELS)
    assert not set(gemm_tuning.candidates_for(vk_device, "Q4_0", 256, False, few=True)) & set(
        ops_gemm.CF_PREFILL_KERNELS
    )
    assert not set(gemm_tuning.candidates_for(vk_device, "Q8_0", 256, False, few=False)) & set(
        ops_gemm.CF_PREFILL_KERNELS
    )
    monkeypatch.setenv("PHOENIX_VULKAN_CF", "0")
    assert ops_gemm.cf_refusal(vk_device, "Q4_0", 256, "cmf1h", False) == "disabled by PHOENIX_VULKAN_CF=0"
    assert ops_gemm.cf_scratch_bytes(vk_device) == 0
    assert not set(gemm_tuning.candidates_for(vk_device, "Q4_0", 256, False, few=True)) & set(ops_gemm.CF_KERNELS)
    assert not set(gemm_tuning.candidates_for(vk_device, "Q4_0", 256, False)) & set(ops_gemm.CF_PREFILL_KERNELS)


def test_every_few_token_tile_fits_its_shared_memory_budget():
    for kn in (*ops_gemm.CF_KERNELS, *ops_gemm.CF_PREFILL_KERNELS):
        for geglu in (False, True):
            assert ops_gemm.cf_shared_bytes(kn, geglu) <= 48 << 10, (kn, geglu)


def test_every_int8_tile_fits_its_shared_memory_budget():
    for kn in ops_gemm.CM8_KERNELS:
        for geglu in (False, True):
            assert ops_gemm.int8_shared_bytes(kn, geglu) <= 48 << 10, (kn, geglu)


def test_int8_matrix_core_tiles_are_opt_in(vk_device, monkeypatch):
    """Off unless PHOENIX_VULKAN_CM8=1, and saying why (they lost end to end on the H100)."""
    monkeypatch.delenv("PHOENIX_VULKAN_CM8", raising=False)
    why = ops_gemm.int8_refusal(vk_device, "Q4_0", 256, "cm8f2", False)
    if vk_device.caps.int_dot and vk_device.caps.coopmat_int8_k and ops_gemm.coopmat_ok(vk_device):
        assert why == ops_gemm.CM8_OPT_IN
        monkeypatch.setenv("PHOENIX_VULKAN_CM8", "1")
        assert ops_gemm.int8_refusal(vk_device, "Q4_0", 256, "cm8f2", False) is None
    else:  # a device without them says its own reason first
        assert why is not None and why != ops_gemm.CM8_OPT_IN


def test_few_token_tiles_per_shape_include_the_int8_matrix_core_tiles(tiny_weights, vk_device, monkeypatch):
    """Every weight shape also gets its own tile for FEW_TOKENS tokens (a batched decode step's
    GEMMs), timed on its own matrices; where the device has s8 cooperative matrices and int8
    activations are on, the int8 matrix-core tiles are among the candidates; with int8
    activations off, the f16 tiles alone."""
    if not ops_gemm.coopmat_ok(vk_device) or not vk_device.caps.coopmat_int8_k:
        pytest.skip(f"{vk_device.name}: {vk_device.caps.refused.get('cooperative_matrix_int8')}")
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.options import VulkanOptions

    monkeypatch.setenv("PHOENIX_VULKAN_CM8", "1")
    for int_dot in (True, False):
        be = VulkanBackend(tiny_weights, 64, device=vk_device, options=VulkanOptions(int_dot=int_dot))
        try:
            stats = be.stats()
            shapes = gemm_tuning.model_shapes(be.graph, lm_head=True)  # the few-token timing's shapes
            few = stats["gemm_kernels_few"][FEW_TOKENS]
            assert set(few) == set(shapes)
            for key, timed in stats["gemm_shape_timing_few"][FEW_TOKENS].items():
                assert few[key] == min(timed, key=timed.__getitem__)
                wtype, cols = key.split()[0], int(key.split()[1].split("x")[1])
                if ops_gemm.cf_refusal(vk_device, wtype, cols, "cmf1h", key.endswith("geglu")) is None:
                    assert set(timed) & set(ops_gemm.CF_KERNELS), key  # the f16 few-token tiles compete
                if int_dot:
                    assert set(timed) & set(ops_gemm.CM8_KERNELS), key
                else:
                    assert not set(timed) & set(ops_gemm.INT8_KERNELS), key
            key = next(iter(shapes))
            assert be.tuning.gemm_kernel_for(FEW_TOKENS, key) == few[key]
        finally:
            be.close()


def test_few_tile_counts(monkeypatch):
    """The counts each shape's few-token tile is timed for: 8, 16 and 32, those below a short
    context's limit and the limit itself; the variable picks others or is refused with a message."""
    from phoenix_chat.engine.backends.vulkan.autotune import few_tile_counts

    monkeypatch.delenv("PHOENIX_VULKAN_FEW_TILE_COUNTS", raising=False)
    assert few_tile_counts(FEW_TOKENS) == [8, 16, 32]
    assert few_tile_counts(12) == [8, 12]
    assert few_tile_counts(5) == [5]
    monkeypatch.setenv("PHOENIX_VULKAN_FEW_TILE_COUNTS", "32")
    assert few_tile_counts(FEW_TOKENS) == [32]
    monkeypatch.setenv("PHOENIX_VULKAN_FEW_TILE_COUNTS", "4,8")
    assert few_tile_counts(FEW_TOKENS) == [4, 8, 32]
    for bad in ("1", "33", "eight"):
        monkeypatch.setenv("PHOENIX_VULKAN_FEW_TILE_COUNTS", bad)
        with pytest.raises(ValueError, match="PHOENIX_VULKAN_FEW_TILE_COUNTS"):
            few_tile_counts(FEW_TOKENS)


def test_fused_qkv_on_split_k_tiles_reduces_after_one_barrier(tiny_weights, vk_device):
    """q, k and v of a few tokens on a split-K tile (gemm_coopmat_few.comp CF_SPLITK): their
    partial sums go to separate parts of the scratch and the three reduces follow one barrier
    (ops_gemm.SplitKGroup), a layer's QKV two barriers fewer than each product alone would cost
    ... and the logits are still the CPU's."""
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    be = VulkanBackend(tiny_weights, 64, device=vk_device)
    try:
        L = be.graph.weights.layers[0]
        qkv_keys = {gemm_tuning.shape_key(m.qtype.name, m.rows, m.cols, False) for m in L.qkv}
        split = [
            kn
            for kn, spec in ops_gemm.CF_TILES.items()
            if spec[3] > 1
            and all(ops_gemm.cf_refusal(vk_device, m.qtype.name, m.cols, kn, False, 5, m.rows) is None for m in L.qkv)
        ]
        if not split:
            pytest.skip(f"{vk_device.name} runs no split-K few-token tile (no f16 matrix cores or 32-lane subgroups)")
        t = be.tuning
        t.few_token_int8, t.few_token_matvec = frozenset(), frozenset()
        t.cols_timing.clear()
        barriers = {}
        for kn in (split[0], "coopmat"):  # split-K on q, k, v; then a tile without a split
            for count in (8, 16, FEW_TOKENS):
                chosen = t.gemm_kernels_few.setdefault(count, {})
                timed = t.gemm_shape_timing_few.setdefault(count, {})
                for key in qkv_keys:
                    chosen[key], timed[key] = kn, {kn: 1.0}
            be.drop_recordings()
            cl = be.graph.record(5, "last")
            barriers[kn] = cl.barriers
            cl.destroy()
            ids = np.random.default_rng(8).integers(3, 4096, 20).tolist()
            be.forward(ids[:15], 0)
            got = be.forward(ids[15:], 15, all_logits=True)
            assert set(be.stats()["few_token_paths"][be._recorded_count(5, be.prefill_chunk)].values()) == {"gemm"}
            cpu = CpuBackend(tiny_weights, 64).forward(ids, 0, all_logits=True)[15:]
            np.testing.assert_allclose(got, cpu, atol=2e-2 * np.abs(cpu).max(), err_msg=kn)
        # the split products add one barrier a layer (before the reduces), not two per product
        assert barriers[split[0]] - barriers["coopmat"] == len(be.graph.weights.layers)
    finally:
        be.close()
