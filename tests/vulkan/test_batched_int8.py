"""The batched decode step and few-token forwards through the multi-column int8 matvec
(engine/backends/vulkan/matvec_cols.py), forced on lavapipe (`few_token_int8=True`, int8
activations on): every matrix of a batched step takes it (and stats() says so), each row's
logits are its sequence's alone (the lone decode also reads q8_1 activations), greedy draws are
equal; a device without int8 activations refuses the option, and the default path on such a
device is named in stats() (no silent fallback).
"""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.base import SeqStep
from phoenix_chat.engine.sampling import SamplingParams

CTX = 64
SLOTS = 4


@pytest.fixture(scope="module")
def tiny_int8(tmp_path_factory, vk_device):
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    if not vk_device.caps.int_dot:
        pytest.skip(f"{vk_device.name} has no shaderIntegerDotProduct")
    path = write(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=1)
    w = open_weights(path)
    opts = VulkanOptions(int_dot=True, few_token_int8=True)
    vk = VulkanBackend(w, CTX, opts, device=vk_device, slots=SLOTS)
    yield CpuBackend(w, CTX), vk
    vk.close()
    w.close()


def _ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 4096, n).tolist()


def test_batched_rows_take_the_int8_matvec_and_match_each_alone(tiny_int8):
    """Three sequences (5, 20 and 40 tokens: the last past the 32-token window) in a bucket of 4
    rows: every matrix runs the int8 multi-column matvec; each row's logits are what its
    sequence's lone int8 decode step gives (same q8_1 activations, other summation order) and
    near the f32 CPU reference, with the same argmax."""
    cpu, vk = tiny_int8
    seqs = {2: _ids(1, 5), 0: _ids(2, 20), 3: _ids(3, 40)}
    for slot, ids in seqs.items():
        vk.forward_slot(slot, ids[:-1], 0)
    for _ in range(3):
        out = vk.decode_batch([SeqStep(s, ids[-1], len(ids) - 1) for s, ids in seqs.items()])
        for row, (s, ids) in zip(out, seqs.items(), strict=True):
            alone = vk.decode_batch([SeqStep(s, ids[-1], len(ids) - 1)])[0]  # rewrites the same position
            scale = np.abs(alone).max()
            np.testing.assert_allclose(row, alone, atol=2e-2 * scale)
            ref = cpu.forward(ids, 0)
            np.testing.assert_allclose(row, ref, atol=5e-2 * np.abs(ref).max())
            assert int(row.argmax()) == int(alone.argmax()) == int(ref.argmax())
            ids.append(int(row.argmax()))
    paths = vk.stats()["few_token_paths"][4]
    assert len(paths) == 5, paths  # fused QKV, o-proj, gate/up, down, LM head
    assert set(paths.values()) == {"int8"}, paths


def test_batched_greedy_draws_equal_each_alone(tiny_int8):
    """Greedy ids on the device sampler: batched (int8 multi-column) = alone (int8 decode)."""
    _cpu, vk = tiny_int8
    greedy = SamplingParams(temperature=0.0)
    prompts = [_ids(10 + i, n) for i, n in enumerate((6, 12, 35))]
    alone = [list(vk.generate_tokens(p, 0, greedy, 6)) for p in prompts]
    got = [[vk.prefill_sampled(slot, p, 0, greedy, 0)] for slot, p in enumerate(prompts)]
    for _ in range(5):
        steps = [SeqStep(i, g[-1], len(p) + len(g) - 1, greedy, 0) for i, (p, g) in enumerate(zip(prompts, got))]
        for g, tid in zip(got, vk.decode_batch_sampled(steps), strict=True):
            g.append(tid)
    assert got == alone


def test_few_token_forward_through_the_int8_matvec(tiny_int8):
    """A 5-token forward (all logits) after a prefill: the int8 multi-column path, near the CPU."""
    cpu, vk = tiny_int8
    ids = _ids(20, 37)
    vk.forward(ids[:32], 0)
    got = vk.forward(ids[32:], 32, all_logits=True)
    # on a GPU the 5-token chunk runs in its prefill bucket's recording (8 tokens)
    assert set(vk.stats()["few_token_paths"][vk._recorded_count(5, vk.prefill_chunk)].values()) == {"int8"}
    cpu.forward(ids[:32], 0)
    want = cpu.forward(ids[32:], 32, all_logits=True)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert np.abs(got - want).max() < 5e-2 * np.abs(want).max()


def test_without_int8_activations_the_option_is_refused_and_the_path_named(tmp_path, vk_device):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    w = open_weights(write(tmp_path / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=1))
    with pytest.raises(ValueError, match="int8 activations"):
        VulkanBackend(w, CTX, VulkanOptions(int_dot=False, few_token_int8=True), device=vk_device)
    vk = VulkanBackend(w, CTX, VulkanOptions(int_dot=False, few_token_matvec=True), device=vk_device, slots=2)
    try:
        vk.forward_slot(0, _ids(1, 5), 0)
        vk.forward_slot(1, _ids(2, 7), 0)
        vk.decode_batch([SeqStep(0, 9, 5), SeqStep(1, 9, 7)])
        assert set(vk.stats()["few_token_paths"][2].values()) == {"f32"}
    finally:
        vk.close()
        w.close()


def test_load_time_choice_of_the_multi_column_shapes(tiny_int8):
    """choose_cols_specs times each multi-column shape per matvec and token count on the model's
    own matrices and keeps the fastest; a count between timed ones takes the next timed count's
    shape; the batched step then records with the chosen shapes and still matches the CPU."""
    from phoenix_chat.engine.backends.vulkan.autotune import choose_cols_specs, spec_label

    cpu, vk = tiny_int8
    choose_cols_specs(vk.graph, counts=(4,), reps=1)  # as the backend's own load-time call on a GPU
    choose_cols_specs(vk.graph, counts=(2, 8), reps=1)  # a later call replaces that choice
    try:
        stats = vk.stats()
        assert set(stats["cols_specs"]) == {"qkv", "o", "geglu", "down", "lm"}
        for key, by_T in stats["cols_timing"].items():
            assert set(by_T) == {2, 8}
            assert set(by_T[2]) == {"r1t4", "r2t4"}  # tiles beyond twice the count are not timed
            for T, t in by_T.items():
                assert stats["cols_specs"][key][T] == min(t, key=t.__getitem__)
        tuning, dev = vk.tuning, vk.dev
        assert spec_label(tuning.cols_spec_for(dev, "down", 5)) == stats["cols_specs"]["down"][8]
        assert spec_label(tuning.cols_spec_for(dev, "down", 20)) == stats["cols_specs"]["down"][8]
        vk.drop_recordings()
        seqs = {0: _ids(30, 9), 1: _ids(31, 14), 2: _ids(32, 6)}
        for slot, ids in seqs.items():
            vk.forward_slot(slot, ids[:-1], 0)
        out = vk.decode_batch([SeqStep(s, ids[-1], len(ids) - 1) for s, ids in seqs.items()])
        for row, ids in zip(out, seqs.values(), strict=True):
            ref = cpu.forward(ids, 0)
            np.testing.assert_allclose(row, ref, atol=5e-2 * np.abs(ref).max())
    finally:
        vk.tuning.cols_specs.clear()
        vk.tuning.cols_timing.clear()
        vk.drop_recordings()


def test_a_matrix_whose_matvec_beat_its_gemm_leaves_the_gemm_path(tiny_int8):
    """Where a few-token forward takes the GEMM path as a whole, a matrix whose int8 multi-column
    timing at load (cols_timing) beat its shapes' few-token GEMM tiles (gemm_shape_timing_few)
    still takes the matvec; the others keep the GEMM, stats() names each, and the mixed forward
    (f32 x into the GEMMs, q8_1 x quantized for the matvec) matches the CPU. The timings are set
    here (lavapipe times neither): down's matvec faster, o's slower, q+k+v's never timed."""
    from phoenix_chat.engine.backends.vulkan import ops_gemm
    from phoenix_chat.engine.backends.vulkan.gemm_tuning import model_shapes

    cpu, vk = tiny_int8
    t = vk.tuning
    saved = (t.few_token_int8, dict(t.gemm_kernels_few), dict(t.gemm_shape_timing_few), dict(t.cols_timing))
    gemm = ops_gemm.kernel(vk.dev)  # a GEMM this device runs
    try:
        t.few_token_int8 = frozenset()
        t.gemm_kernels_few.clear()
        t.gemm_shape_timing_few.clear()
        for key in model_shapes(vk.graph):
            t.gemm_kernels_few.setdefault(32, {})[key] = gemm
            t.gemm_shape_timing_few.setdefault(32, {})[key] = {gemm: 100.0}
        t.cols_timing = {"down": {8: {"r1t4": 50.0}}, "o": {8: {"r1t4": 150.0}}}
        vk.drop_recordings()
        L = vk.graph.weights.layers[0]
        assert vk.graph.few_token_path([L.down], 5, "down") == "int8"
        assert vk.graph.few_token_path([L.o], 5, "o") == "gemm"
        assert vk.graph.few_token_path(L.qkv, 5, "qkv") == "gemm"
        assert vk.graph.few_token_path([L.down], 9, "down") == "gemm"  # no timed count >= 9
        ids = _ids(40, 37)
        vk.forward(ids[:32], 0)
        got = vk.forward(ids[32:], 32, all_logits=True)
        paths = vk.stats()["few_token_paths"][vk._recorded_count(5, vk.prefill_chunk)]  # 8 on a GPU: its bucket
        assert paths["mlp.down_proj"] == "int8" and paths["self_attn.o_proj"] == "gemm", paths
        cpu.forward(ids[:32], 0)
        want = cpu.forward(ids[32:], 32, all_logits=True)
        assert (got.argmax(-1) == want.argmax(-1)).all()
        assert np.abs(got - want).max() < 5e-2 * np.abs(want).max()
    finally:
        t.few_token_int8 = saved[0]
        t.gemm_kernels_few.clear()
        t.gemm_kernels_few.update(saved[1])
        t.gemm_shape_timing_few.clear()
        t.gemm_shape_timing_few.update(saved[2])
        t.cols_timing = saved[3]
        vk.drop_recordings()


def test_each_buckets_step_is_timed_both_ways_and_the_faster_kept(tmp_path, vk_device):
    """batch_tuning (run at load on GPUs; called here on lavapipe, int8 activations on): every
    bucket's whole step is recorded with every matrix on the int8 multi-column matvec and with
    each matrix's own choice ("mixed": the GEMM here, nothing else timed), both timed; the faster
    way is the bucket's tuning, its time the bucket's step time, its recording the one a batch of
    that size replays — and the step then runs the chosen path (stats' few_token_paths)."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.backends.vulkan.batch_tuning import set_way, way_of
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    if not vk_device.caps.int_dot:
        pytest.skip(f"{vk_device.name} has no shaderIntegerDotProduct")
    w = open_weights(write(tmp_path / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=1))
    vk = VulkanBackend(w, CTX, VulkanOptions(int_dot=True), device=vk_device, slots=SLOTS)
    try:
        if vk_device.caps.is_software:  # nothing timed at load; a GPU timed it all at load
            assert vk.stats()["batch_step_ways"] == {} and way_of(vk.tuning, 4) == "mixed"
        vk.time_batch_steps()
        ways = vk.stats()["batch_step_ways"]
        assert sorted(ways) == [2, 4]
        for B, t in ways.items():
            # the way the forward timing chose first ("f32" on a GPU where it won), then the others
            assert {"int8", "mixed"} <= set(t) <= {"int8", "mixed", "f32"} and min(t.values()) > 0, (B, t)
            win = min(t, key=t.__getitem__)
            assert way_of(vk.tuning, B) == win and vk.batch_step_us[B] == t[win]
            key = (B, "sample", ("argmax",), False, 0)
            assert key in vk._batch_lists
            before = set(vk._batch_lists)
            params = SamplingParams(temperature=0.0)
            steps = [SeqStep(s, 5 + s, 10, params) for s in range(B)]
            assert len(vk.decode_batch_sampled(steps)) == B
            assert set(vk._batch_lists) == before  # the timed recording replayed, none new
            paths = set(vk.stats()["few_token_paths"][B].values())
            assert paths == {"int8"} if win == "int8" else "gemm" in paths, (B, win, paths)
        # forced by the options: each bucket keeps the forced way, timed alone
        forced = VulkanBackend(w, CTX, VulkanOptions(int_dot=True, few_token_int8=True), device=vk_device, slots=SLOTS)
        try:
            forced.time_batch_steps(both_ways=False)
            assert {B: set(t) for B, t in forced.stats()["batch_step_ways"].items()} == {2: {"int8"}, 4: {"int8"}}
            assert set(forced.stats()["few_token_paths"][4].values()) == {"int8"}
        finally:
            forced.close()
        set_way(vk.tuning, 4, "f32")
        assert way_of(vk.tuning, 4) == "f32" and 4 not in vk.tuning.few_token_int8
        set_way(vk.tuning, 4, "int8")
        assert way_of(vk.tuning, 4) == "int8" and 4 not in vk.tuning.few_token_matvec
    finally:
        vk.close()
        w.close()
