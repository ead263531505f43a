"""The Vulkan backend on the embedded Gemma 3 270M vs the CPU reference (lavapipe in CI).

Slow on lavapipe (a CPU pretending to be a GPU, seconds per token): positions are few.
"""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.profiling import profile_step
from phoenix_chat.engine.errors import OutOfMemoryError
from phoenix_chat.engine.sampling import SamplingParams

TEXT = "The quick brown fox jumps over the lazy dog. Paris is the capital of"
CTX = 96
N_GREEDY = 8  # decode_tokens on the recorded step; test_model_quality holds 16 tokens of three prompts to transformers


@pytest.fixture(scope="module")
def weights():
    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    w = open_weights(embedded_model_path())
    yield w
    w.close()


@pytest.fixture(scope="module")
def backends(weights, vk_device):
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    vk = VulkanBackend(weights, CTX, device=vk_device)
    cpu = CpuBackend(weights, CTX)
    yield cpu, vk
    vk.close()


@pytest.fixture(scope="module")
def text_ids(weights):
    return weights.tokenizer().encode(TEXT)[:16]


def test_teacher_forced_logits_match_cpu(backends, text_ids, record_property):
    cpu, vk = backends
    ref = cpu.forward(text_ids, 0, all_logits=True)
    got = vk.forward(text_ids, 0, all_logits=True)
    assert got.shape == ref.shape and np.isfinite(got).all()
    agree = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
    diff = float(np.abs(ref - got).max())
    record_property("top1_agreement", agree)
    record_property("max_abs_diff", diff)
    print(f"\nteacher-forced {len(text_ids)} positions: top-1 agreement {agree:.3f}, max |diff| {diff:.4f}")
    assert agree >= 0.99
    assert diff < 0.5


def test_tuning_cycles_through_layers_of_the_same_types(backends, weights):
    """The load-time timing runs each candidate over several layers' matrices in turn (so they
    are read from memory, not a GPU's L2): only layers whose matrices match layer 0's types,
    which in the embedded Q4_K_M file skips the layers whose down-proj is Q4_K, not Q6_K."""
    from phoenix_chat.engine.backends.vulkan.autotune import TUNE_LAYERS, tuning_layers

    _cpu, vk = backends
    types = [weights.tensors[f"layers.{i}.mlp.down_proj"].qtype for i in range(vk.config.num_layers)]
    want = [i for i, t in enumerate(types) if t == types[0]][:TUNE_LAYERS]
    got = tuning_layers(vk.graph, lambda L: [L.down])
    assert got == want and len(got) == TUNE_LAYERS and got != list(range(TUNE_LAYERS))
    assert tuning_layers(vk.graph, lambda L: [L.o]) == list(range(TUNE_LAYERS))


def test_greedy_continuation_matches_cpu(backends, text_ids):
    cpu, vk = backends
    prompt = text_ids[:8]
    # CPU: plain greedy loop over forward()
    logits = cpu.forward(prompt, 0)
    want, pos = [], len(prompt)
    for _ in range(N_GREEDY):
        t = int(logits.argmax())
        want.append(t)
        logits = cpu.forward([t], pos)
        pos += 1
    # Vulkan: prefill, then the recorded token step with sampling on the GPU
    first = int(vk.forward(prompt, 0).argmax())
    assert first == want[0]
    gen = vk.decode_tokens(first, len(prompt), SamplingParams(temperature=0.0), N_GREEDY - 1)
    got = [first] + list(gen)
    print(f"\ngreedy cpu {want}\ngreedy vk  {got}")
    assert got == want
    assert "python_ms_per_token" in vk.stats()


def test_sampled_decode_is_seeded(backends, text_ids):
    cpu, vk = backends
    prompt = text_ids[:6]
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=1234)
    runs = []
    for _ in range(2):
        first = int(vk.forward(prompt, 0).argmax())
        runs.append(list(vk.decode_tokens(first, len(prompt), params, 4)))
    assert runs[0] == runs[1] and len(runs[0]) == 4
    assert all(0 <= t < vk.config.vocab_size for t in runs[0])
    # top_k 0 (off) is served on the GPU too (the full sampler), never handed back to the CPU
    off = vk.decode_tokens(1, 0, SamplingParams(temperature=0.8, top_k=0, seed=3), 4)
    assert off is not None and len([t for t in off if 0 <= t < vk.config.vocab_size]) == 4


def test_memory_budget_names_the_numbers(weights, vk_device, monkeypatch):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    monkeypatch.setattr(vk_device.caps, "heaps", [(64 << 20, True)])
    with pytest.raises(OutOfMemoryError, match=r"needs [\d.]+ GiB .*weights [\d.]+.*KV cache"):
        VulkanBackend(weights, CTX, device=vk_device)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, vk_device):
    """A 6-layer synthetic Gemma 3 (random Q4_0 weights): fast, and has a global layer and a
    32-token sliding window, so 48 positions exercise the ring buffer and the window."""
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    path = write(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=1)
    w = open_weights(path)
    # autotune on: lavapipe times its one candidate per shape, the code path GPUs take
    vk, cpu = VulkanBackend(w, 64, VulkanOptions(autotune=True), device=vk_device), CpuBackend(w, 64)
    yield cpu, vk
    vk.close()
    w.close()


def test_tiny_model_past_the_window_matches_cpu(tiny):
    cpu, vk = tiny
    ids = np.random.default_rng(0).integers(3, 4096, 48).tolist()
    ref = cpu.forward(ids, 0, all_logits=True)
    got = vk.forward(ids, 0, all_logits=True)
    agree = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
    print(f"\ntiny: top-1 agreement {agree:.3f}, max |diff| {np.abs(ref - got).max():.5f}")
    assert agree >= 0.99
    # decode one token at a time past the window, and roll back: same logits as the CPU
    for pos in (48, 49):
        np.testing.assert_allclose(
            vk.forward([ids[pos - 48]], pos), cpu.forward([ids[pos - 48]], pos), atol=2e-2 * np.abs(ref).max()
        )
    np.testing.assert_allclose(vk.forward([7], 40), cpu.forward([7], 40), atol=2e-2 * np.abs(ref).max())


@pytest.mark.parametrize("tail", [{"o": False, "down": False}, {"o": True, "down": False}], ids=["split", "mixed"])
def test_tiny_model_decode_norm_add_paths_match_cpu(tiny, tail):
    """Decode with the norm_add as its own many-workgroup dispatch (the residual moving between
    x and x_alt, an odd number of moves per layer in the mixed case) against the CPU, token by
    token past the prompt."""
    cpu, vk = tiny
    saved = dict(vk.tuning.norm_tail)
    try:
        vk.tuning.norm_tail = dict(tail)
        vk.drop_recordings()
        ids = [2, 9, 311, 4000, 12, 99, 7, 1234]
        ref = cpu.forward(ids, 0, all_logits=True)
        vk.forward(ids[:3], 0)
        got = np.stack([vk.forward([t], p) for p, t in enumerate(ids[3:], start=3)])
        assert (got.argmax(-1) == ref[3:].argmax(-1)).all()
        np.testing.assert_allclose(got, ref[3:], atol=2e-3 * np.abs(ref).max())
        assert profile_step(vk)["norm_add"] > 0
    finally:
        vk.tuning.norm_tail = saved
        vk.drop_recordings()


def test_tiny_model_profile_and_tuning(tiny):
    _cpu, vk = tiny
    assert set(vk.stats()["matvec_tuning"]) >= {"qkv", "o", "geglu", "down"}
    prof = profile_step(vk)
    assert prof["total"] > 0 and prof["gate_up_geglu"] > 0 and prof["attention"] > 0


def test_tiny_model_int8_paths_match_cpu(tiny, vk_device):
    """The int8-activation kernels (forced, whichever the autotuner picks per shape) in a whole model:
    decode token by token (norms writing h's q8_1 blocks for qkv/geglu/lm, attention writing its
    output's for the o-proj, o-proj/down with the norm tail) and a prefill whose last position
    goes through the int8 lm head."""
    if not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    from phoenix_chat.engine.backends.vulkan.autotune import MatvecChoice
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    cpu, vk = tiny
    vk8 = VulkanBackend(vk.weights_source, 64, VulkanOptions(int_dot=True, autotune=True), device=vk_device)
    keys = ("qkv", "o", "geglu", "down", "lm")
    mixed = dict(zip(keys, (True, "regs", False, True, True)))
    try:
        assert vk8.int_dot
        # the decode fusions across ops (rope in the QKV matvec, GEGLU writing down's q8_1 input)
        # are chosen by timing and have their own tests: off here, so the dispatch count below
        # says only what the int8 mode of each matvec does
        vk8.tuning.qkv_rope = vk8.tuning.geglu_q8_1 = None
        vk8.tuning.matvec = {k: MatvecChoice(0.0, False, None) for k in keys}
        vk8.drop_recordings()
        f32_dispatches = profile_step(vk8)["dispatches"]
        for name, modes in (
            ("regs", dict.fromkeys(keys, "regs")),
            ("q8_1", dict.fromkeys(keys, True)),
            ("mixed", mixed),
        ):
            vk8.tuning.matvec = {k: MatvecChoice(0.0, m, None) for k, m in modes.items()}
            vk8.drop_recordings()
            ids = [5, 17, 300, 4000, 12, 99]
            ref = cpu.forward(ids, 0, all_logits=True)
            got = np.stack([vk8.forward([t], i) for i, t in enumerate(ids)])
            assert np.mean(ref.argmax(-1) == got.argmax(-1)) >= 0.99, name
            assert np.abs(ref - got).max() < 0.1 * np.abs(ref).max(), name
            last = vk8.forward(ids, 0)  # prefill: the lm head reads the last row of h
            assert last.argmax() == ref[-1].argmax(), name
            assert np.abs(last - ref[-1]).max() < 0.1 * np.abs(ref).max(), name
            # a quantize dispatch is left only before down (its input comes from the GEGLU matvec;
            # the norms write h's blocks, attention the o-proj's)
            extra = (modes["down"] is True) * vk8.config.num_layers
            assert profile_step(vk8)["dispatches"] == f32_dispatches + extra, name
    finally:
        vk8.close()


@pytest.mark.parametrize(
    "groups,rope,geglu_q8_1,big,down",
    [
        (0, True, False, False, True),
        (2, True, False, True, True),
        (3, False, False, False, True),
        (2, True, True, False, True),
        (2, True, False, False, False),
    ],
    ids=["one_per_group", "strided_big_workgroups", "qkv_without_rope", "geglu_writes_q8_1", "down_apart"],
)
def test_tiny_model_decode_with_prologues_matches_cpu(tiny, vk_device, groups, rope, geglu_q8_1, big, down):
    """Decode with each norm_add and the down's quantize run by the matvec after them
    (tuning.prologue_groups: the QKV (with or without the rope epilogue) and the GEGLU make h
    from the norm_add, the down its q8_1 input) matches the CPU and the same backend with the
    separate dispatches, token by token past the prompt; the step has 3 dispatches a layer
    fewer, the last layer's norm_add kept (2 where the separate path's GEGLU wrote down's
    q8_1 input: with prologues the down quantizes it instead). `big`: the prologue matvecs in
    autotune.prologue_specs' shape (the biggest workgroup, up to 64 subgroups) instead of their tuned shapes;
    `down` False: the down's quantize stays a dispatch (2 fewer a layer)."""
    if not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    from phoenix_chat.engine.backends.vulkan import autotune
    from phoenix_chat.engine.backends.vulkan.autotune import MatvecChoice
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.backends.vulkan.matvec import default_spec

    cpu, vk = tiny
    vk8 = VulkanBackend(vk.weights_source, 64, VulkanOptions(int_dot=True, autotune=True), device=vk_device)
    try:
        t = vk8.tuning
        t.matvec = {k: MatvecChoice(0.0, True, None) for k in ("qkv", "o", "geglu", "down", "lm")}
        t.norm_tail = {"o": False, "down": False}
        t.qkv_rope = (True, default_spec(vk_device)) if rope else None
        t.geglu_q8_1 = (True, default_spec(vk_device)) if geglu_q8_1 else None
        t.prologue_spec = autotune.prologue_specs(vk_device.caps)[0] if big else None
        t.prologue_down = down
        ids = [2, 9, 311, 4000, 12, 99, 7, 1234]
        ref = cpu.forward(ids, 0, all_logits=True)
        runs, profiles = [], []
        for g in (None, groups):
            t.prologue_groups = g
            vk8.drop_recordings()
            assert vk8.graph.prologues() == (g is not None)
            vk8.forward(ids[:3], 0)
            runs.append(np.stack([vk8.forward([tok], p) for p, tok in enumerate(ids[3:], start=3)]))
            profiles.append(profile_step(vk8))
        off, on = runs
        assert (on.argmax(-1) == ref[3:].argmax(-1)).all()
        np.testing.assert_allclose(on, ref[3:], atol=0.1 * np.abs(ref).max())
        np.testing.assert_allclose(on, off, atol=2e-3 * np.abs(off).max())
        layers = vk8.config.num_layers
        fewer = (2 if geglu_q8_1 or not down else 3) * layers - 1
        assert profiles[0]["dispatches"] - profiles[1]["dispatches"] == fewer
        assert profiles[1]["norm_add+gate_up_geglu"] > 0 and profiles[1]["norm_add"] > 0  # the last layer's
        assert vk8.stats()["prologue_groups"] == groups
    finally:
        vk8.close()


def test_the_load_time_choice_times_decode_steps_with_and_without_prologues(tiny, vk_device, monkeypatch):
    """choose_prologue times whole decode steps, separate dispatches against the prologues at
    each grid size, and keeps the prologues only where a step was 2 % faster, saying why not
    otherwise; PHOENIX_VULKAN_PROLOGUE=0 refuses them untimed."""
    if not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    from phoenix_chat.engine.backends.vulkan import autotune
    from phoenix_chat.engine.backends.vulkan.autotune import MatvecChoice
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    _cpu, vk = tiny
    vk8 = VulkanBackend(vk.weights_source, 64, VulkanOptions(int_dot=True, autotune=True), device=vk_device)
    try:
        t = vk8.tuning
        t.matvec = {k: MatvecChoice(0.0, True, None) for k in ("qkv", "o", "geglu", "down", "lm")}
        t.norm_tail = {"o": True, "down": False}
        autotune.choose_prologue(vk8.graph)
        times = t.prologue_timing
        shapes = {
            f"{g}x{s['WG']}{'' if down else ',down apart'}": (g, s, down)
            for s in autotune.prologue_specs(vk_device.caps)
            for g in autotune.PROLOGUE_GROUPS
            for down in (True, False)
        }
        assert set(times) == {"off", *shapes} and len(shapes) >= 3 and min(times.values()) > 0
        best = min(shapes, key=times.__getitem__)
        if times[best] < times["off"] * autotune.PROLOGUE_MARGIN:
            assert (t.prologue_groups, t.prologue_spec, t.prologue_down) == shapes[best]
            assert t.norm_tail == {"o": False, "down": False}
            assert vk8.graph.prologues() and not t.prologue_note
        else:
            assert t.prologue_groups is None and "timed faster" in t.prologue_note
            assert t.norm_tail == {"o": True, "down": False}  # as it was
        assert vk8.stats()["prologue_timing"] == times
        monkeypatch.setenv("PHOENIX_VULKAN_PROLOGUE", "0")
        autotune.choose_prologue(vk8.graph)
        assert t.prologue_groups is None and not t.prologue_timing and "refused" in t.prologue_note
        # a reader of h off the q8_1 path: not applicable, and why
        monkeypatch.delenv("PHOENIX_VULKAN_PROLOGUE")
        t.matvec["geglu"] = MatvecChoice(0.0, False, None)
        autotune.choose_prologue(vk8.graph)
        assert t.prologue_groups is None and "geglu matvec does not read q8_1 blocks" in t.prologue_note
    finally:
        vk8.close()


def test_prologues_refused_where_a_norm_tail_runs(tiny):
    """A norm run as the o matvec's tail cannot also be the GEGLU's prologue: refused, saying so."""
    _cpu, vk = tiny
    saved = (vk.tuning.prologue_groups, dict(vk.tuning.norm_tail))
    try:
        vk.tuning.prologue_groups = 0
        vk.tuning.norm_tail = {"o": True, "down": False}
        assert not vk.graph.prologues()
        assert "norm tail" in vk.graph.prologue_refusal()
    finally:
        vk.tuning.prologue_groups, vk.tuning.norm_tail = saved


@pytest.mark.parametrize("quant", ["q8_0", "f16", "q4_0", "q4_1", "q5_1"])
def test_tiny_model_requantized_on_load(tiny, vk_device, quant):
    """--quant re-quantizes every matrix on load; Q8_0/F16 of Q4_0 weights are nearly lossless,
    Q4_0 of them is the same grid again, Q4_1/Q5_1 hold it within their min/max grids; the
    matvecs and GEMMs of the new type are the ones that run."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    cpu, vk = tiny
    vq = VulkanBackend(vk.weights_source, 64, VulkanOptions(quant=quant), device=vk_device)
    try:
        types = {m.qtype.name for m in vq.layers[0].qkv}
        assert types == {quant.upper()}
        ids = np.random.default_rng(3).integers(3, 4096, 12).tolist()
        ref = cpu.forward(ids, 0, all_logits=True)
        got = vq.forward(ids, 0, all_logits=True)
        assert np.mean(ref.argmax(-1) == got.argmax(-1)) >= 0.9
    finally:
        vq.close()


def test_tiny_model_greedy_decode_several_steps_per_submit(tiny):
    """Decode records 4 token steps per command buffer here (a small model): ids match the CPU,
    including a last submission that is only partly consumed, and context limits hold."""
    cpu, vk = tiny
    assert vk.steps_per_submit == 4
    prompt = [2, 100, 200, 300]
    logits = cpu.forward(prompt, 0)
    want, pos = [], len(prompt)
    for _ in range(11):
        t = int(logits.argmax())
        want.append(t)
        logits = cpu.forward([t], pos)
        pos += 1
    first = int(vk.forward(prompt, 0).argmax())
    got = [first] + list(vk.decode_tokens(first, len(prompt), SamplingParams(temperature=0.0), 10))
    assert got == want
    near_end = list(vk.decode_tokens(first, 60, SamplingParams(temperature=0.0), 10))
    assert len(near_end) == 3  # positions 61..63 of a 64-token context
