"""A prefill chunk run in the recording of its bucket (plan.prefill_bucket): the same logits and
ids as a recording of its exact length, and a chat whose turns differ in length records a
handful of forwards instead of one per length (lavapipe runs a tiny synthetic Gemma 3)."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.plan import prefill_bucket
from phoenix_chat.engine.sampling import SamplingParams

CTX = 200


def test_the_bucket_ladder():
    assert [prefill_bucket(n, 512) for n in (1, 2, 3, 5, 9, 17, 33, 64, 65, 128, 129, 300, 448, 449, 512)] == [
        1, 2, 4, 8, 16, 32, 64, 64, 128, 128, 192, 320, 448, 512, 512,
    ]  # fmt: skip
    assert prefill_bucket(100, 128) == 128 and prefill_bucket(20, 24) == 24  # never past the chunk
    for bad in (0, 129):
        with pytest.raises(ValueError, match="outside"):
            prefill_bucket(bad, 128)


@pytest.fixture(scope="module", params=[False, True], ids=["f32", "int8"])
def vk(request, open_tiny, vk_device):
    """A tiny model with prefill buckets; `exact` runs it with them off, so both ways share one
    load-time tuning. int8: every matvec on q8_1 activations, so the LM head reads the q8_1
    blocks the last norm wrote (the row moved to the front in both buffers)."""
    from phoenix_chat.engine.backends.vulkan.autotune import MatvecChoice
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    int_dot = request.param
    if int_dot and not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    w = open_tiny("q4_0", 7)
    vk = VulkanBackend(w, CTX, VulkanOptions(prefill_buckets=True, int_dot=int_dot or None), device=vk_device)
    if int_dot:
        vk.tuning.matvec = {k: MatvecChoice(0.0, True, None) for k in ("qkv", "o", "geglu", "down", "lm")}
        vk.drop_recordings()
    yield vk
    vk.close()


@contextmanager
def exact(vk):
    """Chunks in recordings of their own lengths, for the duration."""
    vk.prefill_buckets = False
    try:
        yield vk
    finally:
        vk.prefill_buckets = True


def test_a_bucketed_chunk_gives_the_exact_chunks_logits(vk):
    """Against the exact-length recording and against the CPU reference (the last token's
    logits: the row the LM head reads is the step's last, not the recording's). On lavapipe a
    bucket runs the same kernels as the exact count, so the two agree to the last bits; a GPU's
    load-time tuning picks kernels per token count (a bucket's may differ), so there they agree
    as two chunkings do."""
    from phoenix_chat.engine.backends.cpu import CpuBackend

    assert vk.prefill_buckets
    tight = vk.dev.caps.is_software
    cpu = CpuBackend(vk.weights_source, CTX)
    ids = np.random.default_rng(4).integers(3, 4096, 190).tolist()

    def check(n: int, pos: int) -> None:
        got = vk.forward(ids[pos : pos + n], pos)
        with exact(vk):
            want = vk.forward(ids[pos : pos + n], pos)
        ref = cpu.forward(ids[pos : pos + n], pos)
        scale = np.abs(ref).max()
        assert np.abs(got - want).max() <= (1e-4 if tight else 0.02 * scale), (n, pos)
        assert got.argmax() == ref.argmax(), (n, pos)
        assert np.abs(got - ref).max() < 0.05 * scale, (n, pos)

    # a fresh prompt of each length, then turns continuing a cached prefix (past the 32-token
    # window of the local layers: their rings wrap)
    for n in (2, 3, 5, 13, 37, 70):
        check(n, 0)
    pos = 70
    for n in (9, 41, 3, 66):
        check(n, pos)
        pos += n
    # every position's logits: the first n rows of the bucket's
    got = vk.forward(ids[:21], 0, all_logits=True)
    assert got.shape == (21, vk.config.vocab_size)
    with exact(vk):
        want = vk.forward(ids[:21], 0, all_logits=True)
    assert np.abs(got - want).max() <= (1e-4 if tight else 0.02 * np.abs(want).max())


def test_a_bucketed_chunk_draws_the_same_ids(vk):
    """The chat path: the prefill's last chunk ends in the GPU sampler (greedy, seeded top-k)."""
    ids = np.random.default_rng(5).integers(3, 4096, 45).tolist()
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=40, seed=11)):
        for n in (6, 45):
            got = list(vk.generate_tokens(ids[:n], 0, params, 6))
            with exact(vk):
                want = list(vk.generate_tokens(ids[:n], 0, params, 6))
            assert got == want, (params, n)


def test_turns_of_different_lengths_share_a_bucket_recording(vk):
    ids = np.random.default_rng(6).integers(3, 4096, 190).tolist()
    greedy = SamplingParams(temperature=0.0)

    def turns() -> int:
        before, pos = vk.prefill_recordings, 0
        for n in (34, 43, 52, 61):  # one bucket (64), four lengths
            list(vk.generate_tokens(ids[pos : pos + n], pos, greedy, 1))
            pos += n
        assert vk.stats()["prefill_recordings"] == vk.prefill_recordings
        return vk.prefill_recordings - before

    assert turns() <= 1
    with exact(vk):
        assert turns() == 4


def test_buckets_are_the_gpu_default_and_can_be_turned_off(open_tiny, vk_device, monkeypatch):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    w = open_tiny("q4_0", 7)
    vk = VulkanBackend(w, 64, device=vk_device)
    try:  # pad rows cost a CPU device more than a recording does
        assert vk.prefill_buckets is (not vk_device.caps.is_software)
        assert vk.stats()["prefill_buckets"] is vk.prefill_buckets
    finally:
        vk.close()
    monkeypatch.setenv("PHOENIX_VULKAN_PREFILL_BUCKETS", "0")
    for opt, want in ((None, False), (True, True)):  # the env knob turns the default off only
        vk = VulkanBackend(w, 64, VulkanOptions(prefill_buckets=opt), device=vk_device)
        try:
            assert vk.prefill_buckets is want
        finally:
            vk.close()


def test_the_chat_bench_counts_the_forwards_its_turns_recorded(vk_device):
    """bench.run's scripted chat (turns of different lengths; the embedded 270M, for its
    tokenizer) reports the prefill recordings made during it: on lavapipe, where chunks keep
    their own lengths, one per distinct new-token count."""
    from phoenix_chat.engine.bench_streams import load_for_streams, run_streams_bench

    model = load_for_streams(None, "vulkan", [1], 8, 2, 3)
    try:
        buckets = model.backend.prefill_buckets
        r = run_streams_bench(model, [1], 8, 2, chat_turns=3)  # three turns: three new-token counts
    finally:
        model.close()
    [chat] = r.chats
    new = {p - reused for p, reused in zip(chat.prompt_tokens, chat.reused)}
    assert len(new) >= 3  # the turns differ in length
    if buckets:  # a GPU: turns of 51-79 new tokens share the buckets of 64 and 128
        assert r.chat_recordings is not None and r.chat_recordings <= 2
    else:
        assert r.chat_recordings == len(new)
    assert "prefill forwards recorded during the chats" in r.table()


def test_a_chats_first_turn_is_recorded_at_load(open_tiny, vk_device, monkeypatch):
    """prerecord_chat: the top-k and greedy samplers' prefill buckets (up to 128 tokens) and
    their decode steps are recorded at load, so a first turn with the default or greedy sampling
    records nothing; the default is off on CPU devices and with PHOENIX_VULKAN_PRERECORD=0."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    w = open_tiny("q4_0", 7)
    vk = VulkanBackend(w, CTX, VulkanOptions(prefill_buckets=True, prerecord_chat=True), device=vk_device)
    try:
        # lavapipe's chunk is 128: 2, 4, ..., 128; a GPU's 512, of which up to 128
        buckets = (2, 4, 8, 16, 32, 64, 128)
        for kind in ("topk", "argmax"):
            assert {(T, "sample", kind, False, False) for T in buckets} <= set(vk._recordings)
        assert vk.stats()["chat_prerecord_s"] > 0
        n0, lists = vk.prefill_recordings, dict(vk._decode_lists)
        ids = np.random.default_rng(8).integers(3, 4096, 100).tolist()
        for params in (SamplingParams(seed=3), SamplingParams(temperature=0.0)):
            assert len(list(vk.generate_tokens(ids[:40], 0, params, 5))) == 5
        assert vk.prefill_recordings == n0 and vk._decode_lists == lists  # nothing recorded in the turns
        list(vk.generate_tokens(ids[:40], 0, SamplingParams(seed=3, repetition_penalty=1.2), 2))
        assert vk.prefill_recordings == n0 + 1  # a penalty: recorded on first use
    finally:
        vk.close()
    for env, opts, want in (
        ("1", VulkanOptions(), not vk_device.caps.is_software),
        ("0", VulkanOptions(prefill_buckets=True), False),
        ("1", VulkanOptions(prefill_buckets=False), False),  # no buckets: nothing worth recording
    ):
        monkeypatch.setenv("PHOENIX_VULKAN_PRERECORD", env)
        vk = VulkanBackend(w, 64, opts, device=vk_device)
        try:
            assert (vk.stats()["chat_prerecord_s"] > 0) is want, (env, opts)
        finally:
            vk.close()
