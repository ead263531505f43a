"""Each bucket's batched step timed at load, both ways where it can run both: the path a batch
of B rows takes is chosen by timing that step itself.

A forward of B tokens (autotune.choose_few_token_path) is timed on the host's clock with every
logit read back; the batched step of B rows is what the scheduler runs. On a freshly started
H100 that forward timing read the 4B's 32-token GEMM path at 29.0 ms (20.5-22.7 on later loads),
within GEMM_MARGIN of the int8 path, so its 32-row step ran every matrix on the int8 multi-column
matvecs: 12.8 ms a step against 7.3 (2,424 against 4,267 tok/s at 32 streams). So where the
device has int8 dot products each bucket's step is recorded two ways — "int8": every matrix on
the int8 multi-column matvec; "mixed": each matrix's own load-time choice (the GEMM tiles where
they beat the matvec) — timed on the GPU's clock after a warm replay, in two rounds (the second
in reverse order), and the faster way is kept for that token count (`tuning.few_token_int8`
gains or loses it, so a forward of B tokens takes the same path). The winners' times also
promote a batch to a bigger bucket (batch.fastest_bucket).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias

from phoenix_chat.engine.backends.base import SeqStep
from phoenix_chat.engine.backends.vulkan import timing
from phoenix_chat.engine.backends.vulkan.batch import record_batch
from phoenix_chat.engine.backends.vulkan.plan import batch_buckets
from phoenix_chat.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.autotune import Tuning
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

# "f32": the f32 multi-column matvec (tuning.few_token_matvec), kept where the forward timing
# chose it; it is never a second candidate (slower than int8 wherever int8 exists)
Way: TypeAlias = Literal["int8", "mixed", "f32"]
RUNS = 3  # timed runs of each step after its warm replay (the best counts)


def way_of(tuning: Tuning, T: int) -> Way:
    """How a forward of T tokens runs its matrices now (gemma3_graph.few_token_path's sets)."""
    if T in tuning.few_token_int8:
        return "int8"
    return "f32" if T in tuning.few_token_matvec else "mixed"


def set_way(tuning: Tuning, T: int, way: Way) -> None:
    tuning.few_token_int8 = tuning.few_token_int8 | {T} if way == "int8" else tuning.few_token_int8 - {T}
    tuning.few_token_matvec = tuning.few_token_matvec | {T} if way == "f32" else tuning.few_token_matvec - {T}


def time_batch_steps(backend: VulkanBackend, rounds: int = 2, both_ways: bool = True) -> dict[int, dict[str, float]]:
    """{bucket: {way: best GPU µs of its whole step}} for argmax rows at position ~128 of slots
    0..B-1; leaves each bucket's tuning at its fastest way and that way's recording in the
    backend's cache. both_ways False: each bucket's current way only (a path the options forced).
    The steps write K/V and ids that the slots' owners overwrite: call it before any slot holds
    a sequence."""
    rows = backend.buffers.rows
    assert rows is not None
    backend.batch_step_us = {}  # each batch in its own bucket while timing
    buckets = batch_buckets(backend.plan.batch_rows)
    pos = min(128, backend.context_length - 2)
    backend.wrote_kv(pos + 1)  # slot 0's rings moved (prompt_cache reads the extent)
    greedy = SamplingParams(temperature=0.0)
    steps = {B: [SeqStep(s, backend.config.bos_token_id, pos, greedy) for s in range(B)] for B in buckets}
    lists: dict[tuple[int, Way], CommandList] = {}
    paths: dict[tuple[int, Way], dict[str, str]] = {}  # what each recording's matrices took
    graph = backend.graph
    for B in buckets:
        first = way_of(backend.tuning, B)
        others: list[Way] = [w for w in ("int8", "mixed") if w != first] if backend.int_dot and both_ways else []
        for way in [first, *others]:
            set_way(backend.tuning, B, way)
            _, samplers, penalty = backend.write_sampled_rows(steps[B])  # every row argmax: ("argmax",)
            graph.few_token_paths.pop(B, None)
            lists[(B, way)] = record_batch(graph, rows, B, "sample", samplers, penalty)
            paths[(B, way)] = graph.few_token_paths.pop(B, {})
    best: dict[tuple[int, Way], float] = {}
    try:
        keys = list(lists)
        for r in range(rounds):
            for i, key in enumerate(keys if r % 2 == 0 else keys[::-1]):
                B, _ = key
                cl = lists[key]

                def rewind(B: int = B) -> None:
                    # every run samples and so advances its rows (shaders/sample.comp): set back
                    # to `pos`, or hundreds of replays of a small model's step would walk its
                    # rows past a short context
                    backend.write_sampled_rows(steps[B])

                # the GPU kept busy first: timed after an idle moment, an H100 read a 4B's 8-row
                # step at 4.4-6.7 ms over three loads against 5.1 in use
                timing.replay(cl, timing.WARM_S if r == i == 0 else timing.BUSY_S, before=rewind)
                for _ in range(RUNS):
                    rewind()
                    cl.submit(wait=True)
                    best[key] = min(best.get(key, float("inf")), float(cl.timestamps_ns(2)[1]) / 1e3)
    except BaseException:
        for cl in lists.values():
            cl.destroy()
        raise
    out: dict[int, dict[str, float]] = {}
    for B in buckets:
        ways = {w: us for (b, w), us in best.items() if b == B}
        win = min(ways, key=ways.__getitem__)
        set_way(backend.tuning, B, win)
        graph.few_token_paths[B] = paths[(B, win)]
        out[B] = {w: round(us, 1) for w, us in ways.items()}
        for w in ways:
            if w != win:
                lists[(B, w)].destroy()
        _, samplers, penalty = backend.write_sampled_rows(steps[B])
        backend.adopt_batch_recording(B, samplers, penalty, lists[(B, win)])
    return out
