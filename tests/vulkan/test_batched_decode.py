"""KV slots and the batched decode step on Vulkan (engine/backends/vulkan/batch.py), on the
6-layer synthetic Gemma 3 (tools/make_synthetic_gguf.py "tiny": a global layer and a 32-token
sliding window, so a 40-token sequence decodes past the window) — lavapipe in CI.

What each sequence of a batch gets must be what it gets alone: its logits (the CPU reference of
its own ids, within the tolerance of the tiny model's other tests) and its drawn ids (greedy and
seeded sampling, sequences joining and leaving between steps); one slot's writes never reach
another's cache.
"""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.base import SeqStep, SlotsUnsupported
from phoenix_chat.engine.errors import OutOfMemoryError
from phoenix_chat.engine.sampling import SamplingParams

CTX = 64
SLOTS = 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, vk_device):
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    path = write(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=1)
    w = open_weights(path)
    vk = VulkanBackend(w, CTX, device=vk_device, slots=SLOTS)
    yield CpuBackend(w, CTX), vk
    vk.close()
    w.close()


def same_arithmetic(vk) -> bool:
    """Whether a lone decode step and a batched row compute alike. On a GPU with int8 dot products
    (the H100) a lone step takes the int8-activation matvecs and a batched row the int8
    multi-column matvec (or, where the load-time timing chose it, the f16/f32 GEMM): the same
    q8_1 activations summed in another order (or f32 ones), so logits agree to ~1e-2 of their
    scale and a sampled draw near a boundary can differ. On lavapipe and the CPU both are f32 and
    the ids are equal (tests/vulkan/test_batched_int8.py forces the int8 rows there)."""
    return not vk.int_dot


def cpu_tolerance(vk) -> float:
    """A batched row's logits against the f32 CPU reference, relative to their scale: int8
    activations (q8_1) cost ~1e-2 of it (docs/PERFORMANCE.md, "int8 activations")."""
    return 2e-3 if same_arithmetic(vk) else 5e-2


def _ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 4096, n).tolist()


def test_decode_batch_logits_match_each_sequence_alone(tiny):
    """Three sequences (slots 3, 0, 4; 5, 20 and 40 tokens: the last past the 32-token window)
    decode four steps together, one leaving after the second; slot 1 holds a fourth sequence that
    never joins. Every row's logits are its own sequence's (CPU reference of its ids)."""
    cpu, vk = tiny
    seqs = {3: _ids(1, 5), 0: _ids(2, 20), 4: _ids(3, 40)}
    vk.forward_slot(1, _ids(4, 50), 0)  # a neighbour that must not leak in
    for slot, ids in seqs.items():
        vk.forward_slot(slot, ids[:-1], 0)
    for step in range(4):
        live = [s for s in seqs if not (s == 3 and step >= 2)]  # slot 3 leaves after two steps
        out = vk.decode_batch([SeqStep(s, seqs[s][-1], len(seqs[s]) - 1) for s in live])
        assert out.shape == (len(live), vk.config.vocab_size)
        for row, s in zip(out, live, strict=True):
            ref = cpu.forward(seqs[s], 0)
            np.testing.assert_allclose(row, ref, atol=cpu_tolerance(vk) * np.abs(ref).max())
            assert int(row.argmax()) == int(ref.argmax())
            seqs[s].append(int(row.argmax()))


@pytest.mark.parametrize("splits", ["1", "3"])
def test_the_batched_attention_split_changes_no_logit(tiny, monkeypatch, splits):
    """The batched step's attention walks each row's context in fewer splits than a lone decode
    (ops_attention.batch_splits); forced to 1 and to 3 (50-token contexts: 3 splits of 16+
    positions each hold keys), every row's logits are still its own sequence's."""
    cpu, vk = tiny
    monkeypatch.setenv("PHOENIX_VULKAN_BATCH_ATTN_SPLITS", splits)
    vk.drop_batch_recordings()
    try:
        seqs = {0: _ids(40, 50), 2: _ids(41, 9), 3: _ids(42, 33)}
        for slot, ids in seqs.items():
            vk.forward_slot(slot, ids[:-1], 0)
        out = vk.decode_batch([SeqStep(s, ids[-1], len(ids) - 1) for s, ids in seqs.items()])
        assert vk.stats()["batch_attention_splits"][4] == min(int(splits), vk.graph.n_splits)
        for row, ids in zip(out, seqs.values(), strict=True):
            ref = cpu.forward(ids, 0)
            np.testing.assert_allclose(row, ref, atol=cpu_tolerance(vk) * np.abs(ref).max())
    finally:
        monkeypatch.delenv("PHOENIX_VULKAN_BATCH_ATTN_SPLITS")
        vk.drop_batch_recordings()


# the tiny model's random logits are so peaked (top-1 ~ 1.0 at temperature 1) that only high
# temperatures make the draws depend on the seed; the test checks that they do
SAMPLERS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=10.0, top_k=40, top_p=0.95, seed=7),
    SamplingParams(temperature=12.0, top_k=0, top_p=0.9, seed=8),
    SamplingParams(temperature=8.0, top_k=1000, repetition_penalty=1.3, seed=9),
]


def test_decode_batch_sampled_draws_what_each_sequence_draws_alone(tiny):
    """Four sequences with four sampler settings (argmax, top-k, full, full + penalty): prefilled
    into slots by the device sampler, then eight batched steps with the sequences joining late and
    leaving early. Each one's ids equal what generate_tokens draws for it alone in slot 0."""
    _cpu, vk = tiny
    prompts = [_ids(10 + i, n) for i, n in enumerate((6, 12, 35, 9))]
    slots = [2, 0, 1, 4]  # the penalty row reads its own history (slot 4), not slot 0's
    n_new = 8
    alone = [list(vk.generate_tokens(p, 0, params, n_new)) for p, params in zip(prompts, SAMPLERS, strict=True)]
    for p, params in zip(prompts[1:], SAMPLERS[1:], strict=True):  # the seed matters at these settings
        other = SamplingParams(**{**params.__dict__, "seed": 1000 + (params.seed or 0)})
        assert list(vk.generate_tokens(p, 0, other, n_new)) != alone[prompts.index(p)]

    got: list[list[int]] = [[] for _ in prompts]
    joins = [0, 0, 2, 3]  # the step at which each sequence is admitted (prefilled)
    leaves = [n_new, 5, n_new, n_new]  # how many ids each takes
    for step in range(n_new + 3):
        batch: list[tuple[int, SeqStep]] = []
        for i, p in enumerate(prompts):
            params, slot = SAMPLERS[i], slots[i]
            if step == joins[i]:
                got[i].append(vk.prefill_sampled(slot, p, 0, params, params.seed or 0))
            elif joins[i] < step and len(got[i]) < leaves[i]:
                pos = len(p) + len(got[i]) - 1
                batch.append((i, SeqStep(slot, got[i][-1], pos, params, params.seed or 0)))
        if batch:
            for (i, _), tid in zip(batch, vk.decode_batch_sampled([s for _, s in batch]), strict=True):
                got[i].append(tid)
    for i in range(len(prompts)):
        if same_arithmetic(vk) or SAMPLERS[i].greedy:
            assert got[i] == alone[i][: leaves[i]], f"sequence {i} ({SAMPLERS[i]})"
        else:  # int8 decode alone, f16/f32 rows batched: a draw near a boundary may flip
            assert len(got[i]) == leaves[i]
    assert len({tuple(g) for g in got}) == len(got)


def _prefill_three(vk, base: int) -> tuple[list[SeqStep], list[int]]:
    """Slots 1, 2 and 3 hold three prompts of three lengths (11, 19 and 36: the last past the
    32-token window) with three samplers (argmax, top-k + penalty, full); slot 0 a fourth
    sequence. The three decode steps to come, and slot 0's prompt."""
    params = [SAMPLERS[0], SAMPLERS[1], SAMPLERS[2]]
    params[1] = SamplingParams(**{**SAMPLERS[1].__dict__, "repetition_penalty": 1.2})
    steps = []
    for slot, n, p in zip((1, 2, 3), (11, 19, 36), params, strict=True):
        ids = _ids(base + slot, n)
        first = vk.prefill_sampled(slot, ids, 0, p, p.seed or 0)
        steps.append(SeqStep(slot, first, n, p, p.seed or 0))
    zero = _ids(base, 9)
    vk.forward_slot(0, zero[:-1], 0)
    return steps, zero


def _step_by_step(vk, steps: list[SeqStep], n: int) -> list[list[int]]:
    out = []
    for _ in range(n):
        drawn = vk.decode_batch_sampled(steps)
        out.append(drawn)
        steps = [SeqStep(st.slot, t, st.pos + 1, st.params, st.seed) for st, t in zip(steps, drawn, strict=True)]
    return out


def test_a_pipelined_run_draws_what_steps_one_at_a_time_draw(tiny):
    """decode_batch_tokens (the scheduler's steady batch: the step replayed, each step's ids fed
    to the next on the GPU, two in flight) draws, step for step, what decode_batch_sampled draws
    one call at a time — three samplers, three lengths, in the 4-row bucket, whose pad row must
    stay where it is: an advancing pad row writes slot 0's position 0, which slot 0's next logits
    would show. A run closed after 3 steps and carried on step by step draws the same too."""
    _cpu, vk = tiny
    n = 7
    steps, zero = _prefill_three(vk, 80)
    want = _step_by_step(vk, steps, n)
    before = vk.forward_slot(0, [zero[-1]], len(zero) - 1)
    steps, zero = _prefill_three(vk, 80)
    written: list[int] = []
    got = list(vk.decode_batch_tokens(steps, n, submitted=written.append))
    assert got == want
    assert written == list(range(1, n + 1))
    last = next(reversed(vk._batch_lists))  # the run's step
    pair = [cl for key, cl in vk._batch_lists.items() if key[:4] == last[:4]]
    assert len(pair) == 2 and pair[0]._sets is pair[1]._sets  # the second copy is a clone of the first
    np.testing.assert_array_equal(vk.forward_slot(0, [zero[-1]], len(zero) - 1), before)
    assert len({tuple(r) for r in zip(*got, strict=True)}) == 3  # three sequences, three answers

    steps, zero = _prefill_three(vk, 80)
    run = vk.decode_batch_tokens(steps, n, submitted=written.append)
    head = [next(run) for _ in range(3)]
    run.close()  # waits for the step in flight (the 4th), whose ids are dropped
    rest = _step_by_step(
        vk, [SeqStep(st.slot, t, st.pos + 3, st.params, st.seed) for st, t in zip(steps, head[-1], strict=True)], n - 3
    )
    assert head + rest == want


def test_a_pipelined_run_is_refused_where_its_steps_would_pass_the_context(tiny):
    _cpu, vk = tiny
    steps = [SeqStep(1, 5, CTX - 4), SeqStep(2, 6, 4)]
    with pytest.raises(ValueError, match="past the context"):
        vk.decode_batch_tokens(steps, 4)  # the 4th step would draw at position CTX
    with pytest.raises(ValueError, match="2\\+ sequences"):
        vk.decode_batch_tokens(steps[:1], 2)
    assert list(vk.decode_batch_tokens(steps, 0)) == []


def test_a_buckets_recording_does_not_depend_on_how_many_rows_are_active(tiny):
    """Three and four top-k rows fill the same 4-row bucket: one recording serves both (the pad
    row draws with no sampler; before, each active count was a sampler mix of its own, recorded
    on first use — a scheduler whose row count moves re-recorded within a bucket), and the pad
    row changes no sequence's draw."""
    _cpu, vk = tiny
    params = SamplingParams(temperature=0.9, top_k=20, seed=7)
    prompts = [_ids(40 + i, 7) for i in range(4)]
    vk.drop_recordings()
    firsts = [vk.prefill_sampled(s, p, 0, params, 7 + s) for s, p in enumerate(prompts)]
    three = vk.decode_batch_sampled([SeqStep(s, firsts[s], 7, params, 7 + s) for s in range(3)])
    assert [vk.prefill_sampled(s, p, 0, params, 7 + s) for s, p in enumerate(prompts)] == firsts
    four = vk.decode_batch_sampled([SeqStep(s, firsts[s], 7, params, 7 + s) for s in range(4)])
    if same_arithmetic(vk):
        assert four[:3] == three
    recorded = [key for key in vk._batch_lists if key[0] == 4]
    assert recorded == [(4, "sample", ("topk",), False, 0)]


def test_one_recording_serves_every_split_of_rows_between_samplers(tiny, monkeypatch):
    """Greedy and top-k rows in one 4-row bucket, split 1 + 2, 2 + 1, 3 + 1 and 1 + 3 over four
    steps (three then four sequences: a pad row too): the first step records the bucket for
    {argmax, top-k}, the other splits replay it (recorded per split, a server with greedy and
    sampled clients re-recorded inside the scheduler's step whenever the split moved), and every
    row draws what the same position draws alone with its own sampler and seed."""
    from phoenix_chat.engine.backends.vulkan import backend as backend_mod

    _cpu, vk = tiny
    greedy, topk = SAMPLERS[0], SAMPLERS[1]
    prompts = [_ids(60 + s, 9 + s) for s in range(4)]
    firsts = [vk.prefill_sampled(s, p, 0, topk, 40 + s) for s, p in enumerate(prompts)]
    splits = [(greedy, topk, topk), (greedy, greedy, topk), (greedy, topk, greedy, greedy), (topk, greedy, topk, topk)]
    vk.drop_batch_recordings()
    recorded = []
    real_record = backend_mod.record_batch

    def counting(*a, **kw):
        recorded.append(a[2:5])
        return real_record(*a, **kw)

    monkeypatch.setattr(backend_mod, "record_batch", counting)
    for k, split in enumerate(splits):
        steps = [SeqStep(s, firsts[s], len(prompts[s]) + k, params, 40 + s) for s, params in enumerate(split)]
        drawn = vk.decode_batch_sampled(steps)
        alone = [vk.prefill_sampled(st.slot, [st.token], st.pos, st.params, st.seed) for st in steps]
        if same_arithmetic(vk):
            assert drawn == alone, f"split {k}"
        else:  # int8 rows batched, int8 decode alone: greedy ids agree, a sampled one may flip
            assert [d for d, st in zip(drawn, steps, strict=True) if st.params.greedy] == [
                a for a, st in zip(alone, steps, strict=True) if st.params.greedy
            ]
        for s in range(len(steps)):  # the next step feeds each row's own draw
            firsts[s] = alone[s]
        for s in range(len(steps), 4):  # a sequence left out of this step stays one behind
            firsts[s] = vk.prefill_sampled(s, [firsts[s]], len(prompts[s]) + k, topk, 40 + s)
    assert recorded == [(4, "sample", ("argmax", "topk"))]
    assert set(vk._batch_lists) == {(4, "sample", ("argmax", "topk"), False, 0)}


def test_a_slot_is_untouched_by_its_neighbours(tiny):
    """A decode step of slot 2 gives bit-identical logits whether or not other slots were filled
    and advanced (batched and alone) in between."""
    _cpu, vk = tiny
    ids = _ids(20, 30)
    vk.forward_slot(2, ids[:-1], 0)
    before = vk.forward_slot(2, [ids[-1]], len(ids) - 1)
    for s in (0, 1, 3, 4):
        vk.forward_slot(s, _ids(30 + s, 60), 0)
    vk.decode_batch([SeqStep(s, 5, 60) for s in (0, 1, 3, 4)])
    after = vk.forward_slot(2, [ids[-1]], len(ids) - 1)
    np.testing.assert_array_equal(before, after)


def test_slot_misuse_is_refused(tiny):
    _cpu, vk = tiny
    with pytest.raises(SlotsUnsupported):
        vk.forward_slot(SLOTS, [1, 2], 0)
    with pytest.raises(ValueError, match="distinct slots"):
        vk.decode_batch([SeqStep(1, 5, 3), SeqStep(1, 6, 4)])
    with pytest.raises(ValueError, match="past the context"):
        vk.decode_batch([SeqStep(0, 5, CTX), SeqStep(1, 6, 4)])
    with pytest.raises(ValueError, match="past the context"):  # its draw would be at CTX
        vk.decode_batch_sampled([SeqStep(0, 5, CTX - 1), SeqStep(1, 6, 4)])


def test_memory_plan_counts_every_slot(tiny, vk_device, monkeypatch):
    """The plan's KV bytes grow with the slots; a heap that holds one slot refuses many, naming them."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.plan import plan_memory

    _cpu, vk = tiny
    one = plan_memory(vk.weights_source, CTX, vk_device, None, 1)
    many = plan_memory(vk.weights_source, CTX, vk_device, None, 32)
    assert many.kv_cache == 32 * one.kv_cache and many.batch_rows == 32 and one.batch_rows == 0
    # a device-local heap whose usable 92 % lies halfway between the two plans (on an H100 the
    # fixed scratch, 64 MiB of split-K and split-attention partials, dwarfs the tiny model's KV)
    one_total, many_total = (p.weights + p.kv_cache + p.scratch for p in (one, many))
    assert many_total > one_total
    fits_one = (one_total + many_total) / 2 / 0.92
    monkeypatch.setattr(vk_device.caps, "heaps", [(int(fits_one), True)])
    with pytest.raises(OutOfMemoryError, match=r"KV cache [\d.]+ for 32 x 64 tokens.*fewer slots"):
        VulkanBackend(vk.weights_source, CTX, device=vk_device, slots=32)


def test_batched_bench_reports_every_stream_count(tiny):
    """bench.batched_decode on the loaded backend: one record per stream count, tokens counted."""
    from bench.batched_decode import time_batched_decode

    _cpu, vk = tiny
    out = time_batched_decode(vk, [1, 2, 4], steps=2, prompt=8, warmup=1, profile=True)
    rows = out["batched"]
    profiles = out["profiles"]
    assert sorted(profiles) == [1, 2, 4]  # type: ignore[call-overload]
    for B, prof in profiles.items():  # type: ignore[attr-defined]
        assert prof["total"] > 0 and prof["dispatches"] > 0 and prof["attention"] > 0, B
        assert prof["sample"] > 0, B  # the sampler ran (its own op after the LM head)
    assert [r["streams"] for r in rows] == [1, 2, 4]  # type: ignore[index]
    assert all(r["aggregate_tok_s"] > 0 and r["p99_step_ms"] >= r["p50_step_ms"] for r in rows)  # type: ignore[index]
    assert out["single_stream_tok_s"] > 0  # type: ignore[operator]


def test_a_profiled_batched_step_times_the_step_it_draws(tiny):
    """profile_batch (bench.batched_decode --profile) runs the batched step itself, with a
    timestamp at every barrier: its rows draw what decode_batch_sampled draws, and each op of the
    step has a time."""
    _cpu, vk = tiny
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95)
    for s in range(3):
        vk.forward_slot(s, _ids(70 + s, 12), 0)
    steps = [SeqStep(s, 5 + s, 12, params, seed=s) for s in range(3)]
    drawn = vk.decode_batch_sampled(steps)
    where = [vk._slot_fields(s)["tok_base"] + 13 for s in range(3)]
    vk.buffers.tokens_view[where] = 0
    prof = vk.profile_batch(steps)
    assert [int(vk.buffers.tokens_view[i]) for i in where] == drawn
    for op in ("embed", "qkv", "attention", "o_proj", "gate_up_geglu", "down", "lm_head", "sample"):
        assert prof[op] > 0, op
    assert prof["total"] >= sum(v for k, v in prof.items() if k not in ("total", "dispatches", "barriers")) * 0.99
    with pytest.raises(ValueError, match="2\\+ sequences"):
        vk.profile_batch(steps[:1])


def test_a_batch_runs_in_a_bigger_bucket_only_where_its_step_timed_faster():
    """fastest_bucket (device-free): a batch's own bucket unless a bigger one's whole step timed
    at least 3 % faster at load; untimed buckets are never taken."""
    from phoenix_chat.engine.backends.vulkan.batch import fastest_bucket

    timed = {2: 10.0, 4: 12.0, 8: 21.7, 16: 19.8, 32: 30.3}  # µs; the 27B's 8 and 16 rows on the H100
    assert [fastest_bucket(n, 32, timed) for n in (2, 3, 5, 8, 9, 17)] == [2, 4, 16, 16, 16, 32]
    assert fastest_bucket(8, 32, {8: 20.0, 16: 19.8}) == 8  # within the margin: its own
    assert fastest_bucket(8, 32, {16: 1.0}) == 8  # its own bucket untimed: no comparison
    assert fastest_bucket(3, 5, {4: 9.0, 5: 5.0}) == 5  # 5 slots: the last bucket is the slot count
    assert fastest_bucket(5, 32, {}) == 8


def test_a_batch_promoted_to_a_bigger_bucket_draws_the_same_ids(tiny):
    """Where the load-time timing says a bigger bucket's step is faster, a batch runs there, its
    extra rows padding (they change no slot): two sequences in the 4-row recording draw what they
    draw in their own 2-row one, and the logits rows are still theirs. lavapipe times nothing at
    load (stats say why), so the timings are set here."""
    _cpu, vk = tiny
    st = vk.stats()
    if vk.dev.caps.is_software:
        assert st["batch_step_us"] == {} and "CPU devices" in st["batch_step_note"]
        assert set(st["batch_bucket"].items()) == {(2, 2), (3, 4), (4, 4), (5, 5)}
    else:  # a GPU timed every bucket's step (5 slots: buckets 2, 4 and 5)
        assert set(st["batch_step_us"]) == {2, 4, 5} and not st["batch_step_note"]
    params = SamplingParams(temperature=10.0, top_k=40, top_p=0.95)
    seqs = {1: _ids(60, 14), 3: _ids(61, 30)}
    runs = []
    saved = vk.batch_step_us
    try:
        for timed in ({}, {2: 100.0, 4: 50.0, 5: 80.0}):
            vk.batch_step_us = timed
            for s, ids in seqs.items():
                vk.forward_slot(s, ids[:-1], 0)
            steps = [SeqStep(s, ids[-1], len(ids) - 1, params, seed=s) for s, ids in seqs.items()]
            logits = vk.decode_batch(steps)
            runs.append((vk.decode_batch_sampled(steps), logits))
            assert vk.stats()["batch_bucket"][2] == (4 if timed else 2)
            assert next(reversed(vk._batch_lists))[0] == (4 if timed else 2)  # the recording last run
    finally:
        vk.batch_step_us = saved
    scale = np.abs(runs[0][1]).max()
    if same_arithmetic(vk):
        assert runs[0][0] == runs[1][0]
        np.testing.assert_allclose(runs[0][1], runs[1][1], rtol=0, atol=1e-4 * scale)
    else:  # each bucket's own paths (int8 matvecs or GEMMs): the same values summed another way
        np.testing.assert_allclose(runs[0][1], runs[1][1], rtol=0, atol=cpu_tolerance(vk) * scale)


def test_batched_steps_are_recorded_at_load_for_like_requests(tmp_path, vk_device, monkeypatch):
    """prerecord_batches: every bucket a batch can run in is recorded at load for all-greedy and
    all-top-k rows, both copies of a pipelined run; a run of default-sampled requests then
    records nothing (on first use it recorded inside the request). The default is on for GPUs,
    off on CPU devices (load time in tests) and with PHOENIX_VULKAN_PRERECORD=0."""
    from phoenix_chat.engine.backends.vulkan import backend as backend_mod
    from phoenix_chat.engine.backends.vulkan.backend import PRERECORD_SAMPLER_SETS, VulkanBackend, VulkanOptions
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    w = open_weights(write(tmp_path / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=4))
    vk = VulkanBackend(w, 32, VulkanOptions(prerecord_batches=True), device=vk_device, slots=5)
    try:
        buckets = sorted({vk.stats()["batch_bucket"][n] for n in range(2, 6)})
        sets = PRERECORD_SAMPLER_SETS
        want = {(B, "sample", samplers, False, c) for B in buckets for samplers in sets for c in (0, 1)}
        assert ("argmax", "topk") in PRERECORD_SAMPLER_SETS  # greedy and sampled clients in one batch
        assert set(vk._batch_lists) == want
        assert vk.stats()["batch_prerecord_s"] > 0
        params = SamplingParams(seed=3)  # the default sampler: top-k
        firsts = [vk.prefill_sampled(s, _ids(90 + s, 6), 0, params, s) for s in range(3)]

        def no_recording(*a, **kw):
            raise AssertionError("a batched step was recorded inside the run")

        with monkeypatch.context() as m:
            m.setattr(backend_mod, "record_batch", no_recording)
            got = list(vk.decode_batch_tokens([SeqStep(s, firsts[s], 6, params, s) for s in range(3)], 4))
        assert len(got) == 4 and set(vk._batch_lists) == want
    finally:
        vk.close()
    for env, opts in (("1", VulkanOptions()), ("0", VulkanOptions(prerecord_batches=None))):
        monkeypatch.setenv("PHOENIX_VULKAN_PRERECORD", env)
        vk = VulkanBackend(w, 32, opts, device=vk_device, slots=5)
        try:
            # lavapipe: a CPU device, no prerecording by default; the env turns a GPU's off too
            expect = env == "1" and not vk.dev.caps.is_software
            assert any("topk" in key[2] for key in vk._batch_lists) is expect  # top-k steps: only prerecorded ones
            assert (vk.stats()["batch_prerecord_s"] > 0) is expect
        finally:
            vk.close()
    w.close()


def test_batch_promotion_can_be_turned_off(tmp_path, vk_device, monkeypatch):
    """PHOENIX_VULKAN_BATCH_PROMOTE=0: no bucket's step is timed at load, the stats say why, and
    every batch size runs in its own bucket (3 sequences in the 4-row step)."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    monkeypatch.setenv("PHOENIX_VULKAN_BATCH_PROMOTE", "0")
    w = open_weights(write(tmp_path / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=3))
    vk = VulkanBackend(w, 32, device=vk_device, slots=4)
    try:
        st = vk.stats()
        assert st["batch_step_us"] == {} and st["batch_step_note"].startswith("PHOENIX_VULKAN_BATCH_PROMOTE=0")
        assert st["batch_bucket"] == {2: 2, 3: 4, 4: 4}
        for s in range(3):
            vk.forward_slot(s, _ids(80 + s, 6), 0)
        vk.decode_batch([SeqStep(s, 7, 6) for s in range(3)])
        assert next(reversed(vk._batch_lists))[0] == 4
    finally:
        vk.close()
        w.close()


def test_a_vocabulary_no_multiple_of_64_gets_aligned_logit_rows(tmp_path, vk_device, monkeypatch):
    """4090 ids: a row's logits at r * 4090 floats would be no legal binding offset for the row's
    sampler; the batched step spaces the rows out, and every row still gets its own logits."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.weights import open_weights
    from tools import make_synthetic_gguf

    tiny = make_synthetic_gguf.SHAPES["tiny"]
    monkeypatch.setitem(make_synthetic_gguf.SHAPES, "tiny_4090", (*tiny[:6], 4090, *tiny[7:]))
    w = open_weights(make_synthetic_gguf.write(tmp_path / "odd.gguf", "tiny_4090", "q4_0", "q8_0", seed=2))
    vk = VulkanBackend(w, 32, device=vk_device, slots=3)
    try:
        seqs = {1: [5, 77, 4000, 12], 2: [9, 8, 7], 0: [3001, 2, 50, 60, 70]}
        alone = {}
        for s, ids in seqs.items():
            vk.forward_slot(s, ids[:-1], 0)
            alone[s] = vk.forward_slot(s, ids[-1:], len(ids) - 1)  # the single-sequence decode recording
        out = vk.decode_batch([SeqStep(s, ids[-1], len(ids) - 1) for s, ids in seqs.items()])
        tol = 2e-3 if same_arithmetic(vk) else 2e-2  # int8 activations alone: ~1e-2 of the logit scale
        for row, s in zip(out, seqs, strict=True):
            np.testing.assert_allclose(row, alone[s], atol=tol * np.abs(alone[s]).max())
        got = vk.decode_batch_sampled([SeqStep(s, ids[-1], len(ids) - 1) for s, ids in seqs.items()])
        assert got == [int(alone[s].argmax()) for s in seqs]
    finally:
        vk.close()
        w.close()


def test_embedded_270m_batched_greedy_equals_each_alone(vk_device):
    """The real 270M: two prompts decoded together (slots 0 and 1) draw the greedy ids each draws
    alone through generate_tokens, and the batched logits are each one's decode logits."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    w = open_weights(embedded_model_path())
    vk = VulkanBackend(w, 40, device=vk_device, slots=2)
    try:
        tok = w.tokenizer()
        prompts = [tok.encode("The capital of France is")[:8], tok.encode("One, two, three, four,")[:10]]
        greedy = SamplingParams(temperature=0.0)
        alone = [list(vk.generate_tokens(p, 0, greedy, 4)) for p in prompts]
        got = [[vk.prefill_sampled(s, p, 0, greedy, 0)] for s, p in enumerate(prompts)]
        for i in range(3):
            steps = [SeqStep(s, got[s][-1], len(prompts[s]) + i) for s in range(2)]
            for s, t in enumerate(vk.decode_batch_sampled(steps)):
                got[s].append(t)
        assert got == alone
        # one more step as logits: each row is what its slot's single-sequence decode gives
        steps = [SeqStep(s, got[s][-1], len(prompts[s]) + 3) for s in range(2)]
        batched = vk.decode_batch(steps)
        for s, row in enumerate(batched):
            ref = vk.forward_slot(s, [got[s][-1]], len(prompts[s]) + 3)
            np.testing.assert_allclose(row, ref, atol=(2e-3 if same_arithmetic(vk) else 2e-2) * np.abs(ref).max())
    finally:
        vk.close()
        w.close()
